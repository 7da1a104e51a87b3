"""GPU quota classes: what flavors ask and hosts offer (core.quota)."""

import shlex
import types

from nova_gpu.core import exceptions
from nova_gpu.core import flavor
from nova_gpu.core import quota
from nova_gpu.core import report
from nova_gpu.tests.unit.core import base

H100 = quota.model_class('H100-80GB', quota.VGPU)
H200 = quota.model_class('H200-141GB', quota.WHOLE)
MEM = quota.MEMORY_CLASS


def asked(**specs):
    spec = flavor.parse({k.replace('__', ':'): v for k, v in specs.items()},
                        base.CATALOG)
    return quota.flavor_resources(spec, base.CATALOG)


class ClassTest(base.TestCase):

    def test_names(self):
        self.assertEqual('CUSTOM_GPU_QUOTA_H100_80GB_VGPU', H100)
        self.assertEqual('CUSTOM_GPU_QUOTA_H200_141GB_WHOLE', H200)
        self.assertEqual('CUSTOM_GPU_QUOTA_MEMORY_MB', MEM)

    def test_bad_model_or_kind_is_refused_by_name(self):
        for model, kind, words in (('H100', 'MIG', 'unknown GPU quota kind'),
                                   ('--', quota.VGPU, 'no resource class'),
                                   ('X' * 300, quota.VGPU, 'longer than')):
            e = self.assertRaises(exceptions.InvalidRequest,
                                  quota.model_class, model, kind)
            self.assertIn(words, str(e))


class FlavorTest(base.TestCase):

    def test_one_model_per_path(self):
        self.assertEqual({H100: 2, MEM: 2 * 20480},
                         asked(gpu__profile='H100-20C', gpu__count='2'))
        self.assertEqual({H100: 1, MEM: 20480},
                         asked(gpu__profile='H100-20C',
                               gpu__backend='vfio'))
        self.assertEqual({H200: 1, MEM: 144384},
                         asked(gpu__kind='whole', gpu__model='H200-141GB'))

    def test_memory_by_need_and_mig(self):
        # The smallest device that meets the need, of any model.
        self.assertEqual({MEM: 20480}, asked(gpu__memory='20GB'))
        self.assertEqual({MEM: 40960}, asked(gpu__mig='3g.40gb'))

    def test_nothing_unknowable(self):
        # A stock flavor, whole GPUs of any model, a bare vGPU: no class
        # can say them.
        self.assertEqual({}, asked(resources__VGPU='1'))
        self.assertEqual({}, asked(gpu__kind='whole'))
        self.assertEqual({}, quota.flavor_resources(None, base.CATALOG))
        self.assertEqual({'resources:' + MEM: '20480'},
                         quota.extra_specs(flavor.parse(
                             {'gpu:memory': '20GB'}, base.CATALOG),
                             base.CATALOG))

    def test_no_key_changes_the_device_request(self):
        # The quota keys are unnumbered: the path's keys stay the core's.
        spec = flavor.parse({'gpu:profile': 'H100-20C', 'gpu:count': '2'},
                            base.CATALOG)
        keys = flavor.placement_extra_specs(spec, flavor.PathNames())
        keys.update(quota.extra_specs(spec, base.CATALOG))
        again = flavor.parse(dict(keys, **{'gpu:profile': 'H100-20C',
                                           'gpu:count': '2'}),
                             base.CATALOG)
        self.assertIsNone(again.problem)
        self.assertEqual(2, again.units)


class HostTest(base.TestCase):

    def test_totals_never_limit_capacity(self):
        h100 = base.CATALOG.model('H100-80GB')
        h200 = base.CATALOG.model('H200-141GB')
        inv = quota.host_inventory([
            (h100, [report.PCI_POOL]), (h100, [report.VF_MDEV] * 3),
            (h200, [report.PCI_DEVICE]), (h200, [])])
        most = max(p.max_instances for p in h100.vgpu_profiles.values())
        self.assertEqual({'total': 2 * most, 'max_unit': 2 * most},
                         inv[H100])
        self.assertEqual(1, inv[H200]['total'])
        # A GPU Nova makes no provider for offers nothing.
        self.assertEqual(2 * 81920 + 144384, inv[MEM]['total'])
        self.assertEqual({}, quota.host_inventory([]))

    def test_odd_model_is_left_out_alone(self):
        odd = types.SimpleNamespace(name='--', framebuffer_mib=1024,
                                    vgpu_profiles={})
        h200 = base.CATALOG.model('H200-141GB')
        inv = quota.host_inventory([(odd, [report.PCI_DEVICE]),
                                    (h200, [report.PCI_DEVICE])])
        self.assertEqual({H200, MEM}, set(inv))
        self.assertEqual(144384, inv[MEM]['total'])


class LimitTest(base.TestCase):

    def test_names_and_commands(self):
        names = dict(quota.limit_names(base.CATALOG, ['H100-80GB']))
        self.assertEqual(['class:' + MEM, 'class:' + H100,
                          'class:' + quota.model_class('H100-80GB',
                                                       quota.WHOLE)],
                         list(names))
        self.assertEqual(
            'openstack registered limit create --service nova '
            '--default-limit 4 --region RegionOne class:' + H100,
            quota.limit_command('class:' + H100, 4, 'RegionOne'))

    def test_command_quoted_for_a_shell(self):
        # A region is the operator's text: the printed command must run
        # as the words it was made of.
        region = "Region One; rm -rf / 'x'"
        command = quota.limit_command('class:' + H100, 4, region)
        self.assertEqual(
            ['openstack', 'registered', 'limit', 'create', '--service',
             'nova', '--default-limit', '4', '--region', region,
             'class:' + H100], shlex.split(command))

    def test_bad_input(self):
        self.assertRaises(exceptions.UnknownModel, quota.limit_names,
                          base.CATALOG, ['NOPE'])
        for bad in (-2, '4', 1.5, None):
            e = self.assertRaises(exceptions.InvalidRequest,
                                  quota.limit_command, 'class:' + MEM, bad)
            self.assertIn('class:' + MEM, str(e))
