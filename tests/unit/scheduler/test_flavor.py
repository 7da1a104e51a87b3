from nova_gpu.core import host as host_mod
from nova_gpu.scheduler import flavor
from tests.unit.scheduler import base


def parse(**specs):
    return flavor.parse({k.replace('__', ':'): v for k, v in specs.items()},
                        base.CATALOG, vcpus=4, memory_mb=8192)


class ValueTest(base.TestCase):

    def test_bad_values_name_key_and_allowed_values(self):
        for key, value, words in (
                ('gpu:profile', 'NOPE', ['gpu:profile=NOPE',
                                         'unknown vGPU profile',
                                         'A100-10C']),
                ('gpu:mig', '9g.1tb', ['unknown MIG profile', '3g.40gb']),
                ('gpu:count', '0', ['from 1 to 4']),
                ('gpu:count', 'two', ['from 1 to 4']),
                ('gpu:model', 'H100-80GB,B300', ["'B300'", 'H200-141GB']),
                ('gpu:topology', 'ring', ['any, numa, nvlink']),
                ('gpu:memory', '20', ['with a unit']),
                ('gpu:memory', '-1GB', ['positive size']),
                ('gpu:compute', '1.5', ['(0, 1]']),
                ('gpu:kind', 'share', ['vgpu, mig, whole']),
                ('gpu:colour', 'red', ['unknown GPU extra spec',
                                       'gpu:profile'])):
            err = self.assertRaises(flavor.ExtraSpecError,
                                    flavor.validate_value, key, value,
                                    base.CATALOG)
            for word in words:
                self.assertIn(word, str(err))

    def test_good_values_parse(self):
        self.assertEqual(20480, flavor.validate_value('gpu:memory', '20GB'))
        self.assertEqual(512, flavor.validate_value('gpu:memory', '512MiB'))
        self.assertEqual(250, flavor.validate_value('gpu:compute', '25%'))
        self.assertEqual(250, flavor.validate_value('gpu:compute', '0.25'))
        self.assertEqual(frozenset(['A100-40GB', 'H100-80GB']),
                         flavor.validate_value('gpu:model',
                                               'A100, H100-80GB'))


class ParseTest(base.TestCase):

    def test_no_gpu(self):
        self.assertIsNone(parse(hw__cpu_policy='dedicated'))

    def test_stock_vgpu_flavor(self):
        spec = parse(resources__VGPU='1')
        self.assertFalse(spec.explicit)
        (req,) = spec.alternatives
        self.assertEqual((host_mod.VGPU, None, 1), (req.kind, req.profile,
                                                    req.count))

    def test_stock_groups_count_devices(self):
        spec = flavor.parse({'resources1:VGPU': '1', 'resources2:VGPU': '1',
                             'group_policy': 'isolate'}, base.CATALOG)
        self.assertEqual(2, spec.alternatives[0].count)

    def test_stock_several_vgpus_in_one_group_left_to_nova(self):
        self.assertIsNone(parse(resources__VGPU='2'))

    def test_profile_pins_model(self):
        spec = parse(gpu__profile='A100-10C', resources__VGPU='1')
        (req,) = spec.alternatives
        self.assertEqual(frozenset(['A100-40GB']), req.models)
        self.assertIsNone(spec.problem)

    def test_profile_outside_models_is_refused(self):
        err = self.assertRaises(flavor.ExtraSpecError, parse,
                                gpu__profile='A100-10C',
                                gpu__model='H100-80GB')
        self.assertIn('not one of gpu:model H100-80GB', str(err))

    def test_exclusive_keys(self):
        err = self.assertRaises(flavor.ExtraSpecError, parse,
                                gpu__profile='A100-10C', gpu__mig='3g.20gb')
        self.assertIn('cannot be combined with gpu:profile', str(err))
        err = self.assertRaises(flavor.ExtraSpecError, parse,
                                gpu__compute='0.5')
        self.assertIn('only applies together with gpu:memory', str(err))

    def test_mig_models(self):
        spec = parse(gpu__mig='3g.40gb', resources__VGPU='1')
        self.assertEqual(frozenset(['A100-80GB', 'H100-80GB']),
                         spec.alternatives[0].models)
        err = self.assertRaises(flavor.ExtraSpecError, parse,
                                gpu__mig='3g.40gb', gpu__model='A100-40GB')
        self.assertIn('no model of gpu:model offers it', str(err))
        self.assertIn('H100-80GB', str(err))

    def test_placement_mismatch_is_a_problem(self):
        spec = parse(gpu__profile='A100-10C', gpu__count='2',
                     resources__VGPU='1')
        self.assertIn('resources1:VGPU=1, resources2:VGPU=1', spec.problem)

    def test_placement_extra_specs(self):
        spec = parse(gpu__profile='A100-10C', gpu__count='2')
        self.assertEqual({'resources1:VGPU': '1', 'resources2:VGPU': '1',
                          'group_policy': 'isolate'},
                         flavor.placement_extra_specs(spec))
        spec = parse(gpu__kind='whole', gpu__count='2')
        self.assertEqual({'resources1:PGPU': '1', 'resources2:PGPU': '1',
                          'group_policy': 'isolate'},
                         flavor.placement_extra_specs(spec))

    def test_by_need_smallest_first(self):
        spec = parse(gpu__memory='20GB', gpu__model='A100-40GB,H100-80GB',
                     resources__VGPU='1')
        self.assertTrue(spec.need_based)
        sizes = list(spec.sizes)
        self.assertEqual(sorted(sizes), sizes)
        self.assertEqual(20480, sizes[0])
        self.assertTrue(all(s >= 20480 for s in sizes))

    def test_by_need_compute_share(self):
        spec = parse(gpu__memory='10GB', gpu__compute='0.4',
                     gpu__model='A100-40GB', resources__VGPU='1')
        profiles = {a.profile for a in spec.alternatives}
        # A100-10C is 1/4 of the GPU; A100-3-20C is 3/7 of it.
        self.assertNotIn('A100-10C', profiles)
        self.assertIn('A100-3-20C', profiles)

    def test_by_need_nothing_fits(self):
        err = self.assertRaises(flavor.ExtraSpecError, parse,
                                gpu__memory='100GB', gpu__model='A100-40GB')
        self.assertIn('no vgpu device of gpu:model A100-40GB', str(err))

    def test_dedicated_cpus_ask_numa_affinity(self):
        spec = parse(gpu__profile='A100-10C', hw__cpu_policy='dedicated',
                     resources__VGPU='1')
        req = spec.alternatives[0]
        self.assertEqual(('prefer', 4000, 8192),
                         (req.numa_affinity, req.cpu_milli, req.memory_mib))
        spec = parse(gpu__profile='A100-10C', hw__cpu_policy='dedicated',
                     gpu__topology='numa', resources__VGPU='1')
        self.assertEqual('require', spec.alternatives[0].numa_affinity)
