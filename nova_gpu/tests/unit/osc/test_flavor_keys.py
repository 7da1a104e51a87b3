"""``openstack gpu flavor keys`` prints placement_extra_specs' keys."""

import types

from osc_lib import exceptions
import testtools

from nova_gpu.core import catalog as catalog_mod
from nova_gpu.core import flavor
from nova_gpu.osc import flavor_keys


class FlavorKeysTest(testtools.TestCase):

    def run_cmd(self, *argv):
        cmd = flavor_keys.FlavorKeys(types.SimpleNamespace(), None)
        parsed = cmd.get_parser('openstack gpu flavor keys').parse_args(
            list(argv))
        columns, rows = cmd.take_action(parsed)
        return dict(rows)

    def test_keys_are_the_cores(self):
        keys = self.run_cmd('--property', 'gpu:profile=H100-20C',
                            '--property', 'gpu:count=8')
        spec = flavor.parse({'gpu:profile': 'H100-20C', 'gpu:count': '8'},
                            catalog_mod.load_catalog(),
                            names=flavor.PathNames())
        self.assertEqual(flavor.placement_extra_specs(
            spec, flavor.PathNames()), keys)
        self.assertEqual('required', keys['trait8:CUSTOM_NOVA_GPU_SET8_7'])

    def test_plain_and_pci_paths(self):
        keys = self.run_cmd('--property', 'gpu:kind=whole',
                            '--property', 'gpu:count=2', '--plain')
        self.assertEqual({'pci_passthrough:alias': 'nvidia-gpu:2'}, keys)
        keys = self.run_cmd('--property', 'gpu:kind=whole',
                            '--property', 'gpu:count=2',
                            '--whole-gpu-alias', 'a100')
        self.assertEqual({'pci_passthrough:alias': 'a100-set2-0:1,'
                          'a100-set2-1:1'}, keys)

    def test_bad_input_names_the_key(self):
        err = self.assertRaises(exceptions.CommandError, self.run_cmd,
                                '--property', 'gpu:count=nine')
        self.assertIn('gpu:count', str(err))
        err = self.assertRaises(exceptions.CommandError, self.run_cmd,
                                '--property', 'hw:cpu_policy=dedicated')
        self.assertIn('expected gpu:<key>=<value>', str(err))
