"""The reliability suite's GPU quota checks can fail (reliability_specs)."""

import random
from unittest import mock

import testtools

from nova_gpu.bench import reliability_specs
from nova_gpu.core import flavor
from nova_gpu.core import quota
from nova_gpu.tests.unit.core import base


class QuotaFuzzTest(testtools.TestCase):

    def _names(self):
        tally = reliability_specs.Tally()
        reliability_specs.fuzz_quota_names(tally, random.Random(7), 500)
        return tally

    def test_names_clean(self):
        tally = self._names()
        self.assertEqual(500, tally.quota_checked)
        self.assertEqual(0, tally.quota_bad, tally.failures)

    def test_unquoted_command_found(self):
        # limit_command as it was: words joined without quoting.
        def unquoted(name, limit, region=None):
            words = ['openstack', 'registered', 'limit', 'create',
                     '--default-limit', str(limit)]
            return ' '.join(words + (['--region', region] if region else [])
                            + [name])
        with mock.patch.object(quota, 'limit_command', unquoted):
            tally = self._names()
        self.assertGreater(tally.quota_bad, 0)

    def test_flavor_classes(self):
        spec = flavor.parse({'gpu:profile': 'H100-20C'}, base.CATALOG)
        tally = reliability_specs.Tally()
        reliability_specs.check_quota(tally, spec, base.CATALOG, 'k', 'v')
        self.assertEqual((1, 0), (tally.quota_checked, tally.quota_bad))
        with mock.patch.object(quota, 'extra_specs', return_value={
                'resources:CUSTOM_GPU_QUOTA_H-100_VGPU': '1'}):
            reliability_specs.check_quota(tally, spec, base.CATALOG, 'k',
                                          'v')
        with mock.patch.object(quota, 'extra_specs', side_effect=KeyError):
            reliability_specs.check_quota(tally, spec, base.CATALOG, 'k',
                                          'v')
        self.assertEqual(2, tally.quota_bad)
