"""``openstack gpu quota limits`` and ``gpu flavor keys --quota``."""

import types

from osc_lib import exceptions
import testtools

from nova_gpu.core import quota
from nova_gpu.osc import flavor_keys
from nova_gpu.osc import quota as quota_cmd


def run(cls, prog, *argv):
    cmd = cls(types.SimpleNamespace(), None)
    parsed = cmd.get_parser(prog).parse_args(list(argv))
    return cmd.take_action(parsed)


class QuotaLimitsTest(testtools.TestCase):

    def test_commands_of_a_model(self):
        columns, rows = run(quota_cmd.QuotaLimits, 'openstack gpu quota '
                            'limits', '--model', 'L4', '--kind', 'vgpu',
                            '--default-limit', '8')
        self.assertEqual(('Limit', 'Caps', 'Command'), columns)
        limits = {row[0]: row[2] for row in rows}
        rc = 'class:' + quota.model_class('L4', quota.VGPU)
        self.assertEqual(['class:' + quota.MEMORY_CLASS, rc], list(limits))
        self.assertTrue(limits[rc].endswith('--default-limit 8 ' + rc))

    def test_bad_input_is_a_clear_error(self):
        e = self.assertRaises(exceptions.CommandError, run,
                              quota_cmd.QuotaLimits, 'limits', '--model',
                              'NOPE')
        self.assertIn('NOPE', str(e))
        e = self.assertRaises(exceptions.CommandError, run,
                              quota_cmd.QuotaLimits, 'limits',
                              '--default-limit', '-5')
        self.assertIn('-5', str(e))


class FlavorKeysQuotaTest(testtools.TestCase):

    def test_quota_keys_only_when_asked(self):
        _cols, rows = run(flavor_keys.FlavorKeys, 'keys', '--property',
                          'gpu:profile=L4-8C')
        self.assertEqual({'resources:VGPU': '1'}, dict(rows))
        _cols, rows = run(flavor_keys.FlavorKeys, 'keys', '--property',
                          'gpu:profile=L4-8C', '--quota')
        self.assertEqual({
            'resources:VGPU': '1',
            'resources:' + quota.model_class('L4', quota.VGPU): '1',
            'resources:' + quota.MEMORY_CLASS: '8192'}, dict(rows))
