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
        self.assertEqual({'pci_passthrough:alias': 'nvidia-gpu:2'},
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


class PathTest(base.TestCase):
    """Each path's Placement / PCI keys, and what no path can serve."""

    def test_mdev_is_the_default_vgpu_path(self):
        spec = parse(gpu__profile='L40S-8C')
        self.assertEqual(flavor.PATH_MDEV, spec.path)
        self.assertEqual({'resources:VGPU': '1'},
                         flavor.placement_extra_specs(spec))

    def test_vendor_vfio_asks_the_alias_isolated(self):
        spec = parse(gpu__profile='H100-20C', gpu__backend='vfio',
                     gpu__count='2')
        self.assertEqual(flavor.PATH_VFIO, spec.path)
        self.assertEqual('CUSTOM_NVIDIA_VGPU', spec.resource_class)
        keys = flavor.placement_extra_specs(spec)
        self.assertEqual({'pci_passthrough:alias': 'nvidia-vgpu:2',
                          'group_policy': 'isolate'}, keys)
        keys['gpu:profile'] = 'H100-20C'
        keys['gpu:backend'] = 'vfio'
        keys['gpu:count'] = '2'
        spec = parse(**{k.replace(':', '__'): v for k, v in keys.items()})
        self.assertIsNone(spec.problem)
        self.assertEqual((2, 2), (spec.units, spec.groups))

    def test_one_vfio_vgpu_needs_no_group_policy(self):
        spec = parse(gpu__profile='H100-20C', gpu__backend='vfio')
        self.assertEqual({'pci_passthrough:alias': 'nvidia-vgpu:1'},
                         flavor.placement_extra_specs(spec))

    def test_backend_default_from_conf(self):
        self.conf.set_override('vgpu_backend', 'vfio', 'gpu_scheduler')
        spec = parse(gpu__profile='H100-20C')
        self.assertEqual(flavor.PATH_VFIO, spec.path)
        # Keys already on the flavor say which path it was made for.
        spec = parse(gpu__profile='H100-20C', resources__VGPU='1')
        self.assertEqual(flavor.PATH_MDEV, spec.path)
        self.assertIsNone(spec.problem)

    def test_alias_names_from_conf(self):
        self.conf.set_override('whole_gpu_alias', 'gpu-pt', 'gpu_scheduler')
        spec = parse(gpu__kind='whole')
        self.assertEqual({'pci_passthrough:alias': 'gpu-pt:1'},
                         flavor.placement_extra_specs(spec))

    def test_stock_flavors_of_pci_paths(self):
        spec = parse(pci_passthrough__alias='nvidia-gpu:2')
        self.assertFalse(spec.explicit)
        self.assertEqual(host_mod.WHOLE, spec.alternatives[0].kind)
        self.assertEqual(2, spec.alternatives[0].count)
        spec = parse(pci_passthrough__alias='nvidia-vgpu:1')
        self.assertEqual(flavor.PATH_VFIO, spec.path)
        self.assertEqual(host_mod.VGPU, spec.alternatives[0].kind)
        # Two VFs without isolation may share one GPU's pool: Nova's.
        self.assertIsNone(parse(pci_passthrough__alias='nvidia-vgpu:2'))
        # Other aliases are not GPUs.
        self.assertIsNone(parse(pci_passthrough__alias='nic:1'))

    def test_refused_combinations_say_why(self):
        for specs, words in (
                ({'gpu__kind': 'whole', 'gpu__backend': 'vfio'},
                 ['gpu:backend=vfio', 'vGPUs only',
                  'pci_passthrough:alias=nvidia-gpu']),
                ({'gpu__profile': 'H100-20C', 'resources__VGPU': '1',
                  'pci_passthrough__alias': 'nvidia-vgpu:1'},
                 ['both as mdevs', 'one path']),
                ({'gpu__profile': 'H100-20C', 'gpu__backend': 'vfio',
                  'resources__VGPU': '1'},
                 ['asks vendor-VFIO VFs', 'resources:VGPU']),
                ({'gpu__profile': 'H100-20C', 'gpu__backend': 'mdev',
                  'pci_passthrough__alias': 'nvidia-vgpu:1'},
                 ['asks mdev vGPUs', 'nvidia-vgpu']),
                ({'gpu__backend': 'pci'}, ['unknown vGPU backend', 'vfio'])):
            err = self.assertRaises(flavor.ExtraSpecError, parse, **specs)
            for word in words:
                self.assertIn(word, str(err))

    def test_alias_counts(self):
        self.assertEqual({'nvidia-gpu': 2, 'nic': 1},
                         flavor.alias_counts({
                             'pci_passthrough:alias': 'nvidia-gpu:2, nic'}))
        self.assertEqual({}, flavor.alias_counts({}))
