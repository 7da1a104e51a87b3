"""The ``gpu:`` flavor grammar of the core: no configuration, no Nova.

What configuration says comes in as a ``flavor.PathNames``; the
scheduler's glue (``[gpu_scheduler]``, ``[gpu] catalog_files``) is tested
in nova_gpu/tests/unit/scheduler/test_flavor.py.
"""

from nova_gpu.core import flavor
from nova_gpu.core import host as host_mod
from nova_gpu.tests.unit.core import base

NAMES = flavor.PathNames()


def parse(names=NAMES, **specs):
    return flavor.parse({k.replace('__', ':'): v for k, v in specs.items()},
                        base.CATALOG, vcpus=4, memory_mb=8192, names=names)


def validate_value(key, value):
    return flavor.validate_value(key, value, base.CATALOG)


class ValueTest(base.TestCase):

    def test_bad_values_name_key_and_allowed_values(self):
        for key, value, words in (
                ('gpu:profile', 'NOPE', ['gpu:profile=NOPE',
                                         'unknown vGPU profile',
                                         'A100-10C']),
                ('gpu:mig', '9g.1tb', ['unknown MIG profile', '3g.40gb']),
                ('gpu:count', '0', ['from 1 to 8']),
                ('gpu:count', 'two', ['from 1 to 8']),
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
                                    base.CATALOG, NAMES)
            for word in words:
                self.assertIn(word, str(err))

    def test_good_values_parse(self):
        self.assertEqual(20480, validate_value('gpu:memory', '20GB'))
        self.assertEqual(512, validate_value('gpu:memory', '512MiB'))
        self.assertEqual(250, validate_value('gpu:compute', '25%'))
        self.assertEqual(250, validate_value('gpu:compute', '0.25'))
        self.assertEqual(frozenset(['A100-40GB', 'H100-80GB']),
                         validate_value('gpu:model', 'A100, H100-80GB'))

    def test_count_limit_is_passed_in(self):
        self.assertEqual(8, validate_value('gpu:count', '8'))
        self.assertRaises(flavor.ExtraSpecError, validate_value,
                          'gpu:count', '9')
        four = flavor.PathNames(max_gpu_count=4)
        self.assertEqual(4, flavor.validate_value('gpu:count', '4',
                                                  base.CATALOG, four))
        self.assertRaises(flavor.ExtraSpecError, flavor.validate_value,
                          'gpu:count', '5', base.CATALOG, four)
        err = self.assertRaises(
            flavor.ExtraSpecError, flavor.validate_value, 'gpu:count', '9',
            base.CATALOG, flavor.PathNames(max_gpu_count=16))
        self.assertIn('from 1 to 8', str(err))
        self.assertEqual(1, flavor.max_count(0))


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
                             'group_policy': 'isolate'}, base.CATALOG,
                            names=NAMES)
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
                          'trait1:CUSTOM_NOVA_GPU_SET2_0': 'required',
                          'trait2:CUSTOM_NOVA_GPU_SET2_1': 'required',
                          'group_policy': 'isolate'},
                         flavor.placement_extra_specs(spec, NAMES))
        spec = parse(gpu__kind='whole', gpu__count='2')
        self.assertEqual({'pci_passthrough:alias':
                          'nvidia-gpu-set2-0:1,nvidia-gpu-set2-1:1'},
                         flavor.placement_extra_specs(spec, NAMES))
        # Stock Nova (no agent keeps the traits): the plain groups.
        self.assertEqual({'pci_passthrough:alias': 'nvidia-gpu:2'},
                         flavor.placement_extra_specs(spec, NAMES,
                                                      sets=False))

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
                         flavor.placement_extra_specs(spec, NAMES))

    def test_vendor_vfio_asks_the_alias_isolated(self):
        spec = parse(gpu__profile='H100-20C', gpu__backend='vfio',
                     gpu__count='2')
        self.assertEqual(flavor.PATH_VFIO, spec.path)
        self.assertEqual('CUSTOM_NVIDIA_VGPU', spec.resource_class)
        keys = flavor.placement_extra_specs(spec, NAMES)
        self.assertEqual({'pci_passthrough:alias':
                          'nvidia-vgpu-set2-0:1,nvidia-vgpu-set2-1:1',
                          'group_policy': 'isolate'}, keys)
        keys['gpu:profile'] = 'H100-20C'
        keys['gpu:backend'] = 'vfio'
        keys['gpu:count'] = '2'
        spec = parse(**{k.replace(':', '__'): v for k, v in keys.items()})
        self.assertIsNone(spec.problem)
        self.assertEqual((2, 2), (spec.units, spec.groups))

    def test_set_shapes(self):
        # The keys placement_extra_specs gives parse as 'sets'; the plain
        # groups schedule, with advice; mixed set keys are refused.
        for extra in ({'gpu__profile': 'A100-10C'},
                      {'gpu__kind': 'whole'},
                      {'gpu__profile': 'H100-20C', 'gpu__backend': 'vfio'}):
            for count in (2, 4, 8):
                spec = parse(gpu__count=str(count), **extra)
                for sets in (True, False):
                    keys = dict(flavor.placement_extra_specs(
                        spec, NAMES, sets=sets))
                    keys.update({k.replace('__', ':'): v
                                 for k, v in extra.items()})
                    keys['gpu:count'] = str(count)
                    parsed = parse(**{k.replace(':', '__'): v
                                      for k, v in keys.items()})
                    self.assertIsNone(parsed.problem, keys)
                    self.assertEqual(
                        'sets' if sets else 'plain', flavor.set_shape(
                            keys, NAMES, parsed.path, count), keys)
                    if sets:
                        self.assertIsNone(parsed.advice)
                    else:
                        self.assertIn('without set traits', parsed.advice)

    def test_set_traits_of_another_count_are_refused(self):
        spec = parse(gpu__profile='A100-10C', gpu__count='2',
                     resources1__VGPU='1', resources2__VGPU='1',
                     group_policy='isolate',
                     trait1__CUSTOM_NOVA_GPU_SET4_0='required',
                     trait2__CUSTOM_NOVA_GPU_SET4_1='required')
        self.assertIn('not those of 2 devices', spec.problem)
        self.assertIn('trait2:CUSTOM_NOVA_GPU_SET2_1=required', spec.problem)

    def test_set_aliases_count_their_devices(self):
        spec = parse(gpu__kind='whole', gpu__count='3',
                     pci_passthrough__alias='nvidia-gpu-set3-0:1,'
                     'nvidia-gpu-set3-1:1,nvidia-gpu-set3-2:1')
        self.assertIsNone(spec.problem)
        self.assertEqual(3, spec.units)
        spec = parse(gpu__kind='whole', gpu__count='3',
                     pci_passthrough__alias='nvidia-gpu-set3-0:1,'
                     'nvidia-gpu-set3-1:1')
        self.assertIn('asks 3 GPU device(s)', spec.problem)

    def test_one_vfio_vgpu_needs_no_group_policy(self):
        spec = parse(gpu__profile='H100-20C', gpu__backend='vfio')
        self.assertEqual({'pci_passthrough:alias': 'nvidia-vgpu:1'},
                         flavor.placement_extra_specs(spec, NAMES))

    def test_backend_default_passed_in(self):
        vfio = flavor.PathNames(backend='vfio')
        spec = parse(vfio, gpu__profile='H100-20C')
        self.assertEqual(flavor.PATH_VFIO, spec.path)
        # Keys already on the flavor say which path it was made for.
        spec = parse(vfio, gpu__profile='H100-20C', resources__VGPU='1')
        self.assertEqual(flavor.PATH_MDEV, spec.path)
        self.assertIsNone(spec.problem)

    def test_alias_names_passed_in(self):
        names = flavor.PathNames(whole_alias='gpu-pt')
        spec = parse(names, gpu__kind='whole')
        self.assertEqual({'pci_passthrough:alias': 'gpu-pt:1'},
                         flavor.placement_extra_specs(spec, names))
        spec = parse(names, pci_passthrough__alias='gpu-pt:2')
        self.assertEqual(host_mod.WHOLE, spec.alternatives[0].kind)

    def test_names_from_options(self):
        class Options:
            vgpu_resource_class = 'CUSTOM_V'
            whole_gpu_resource_class = 'CUSTOM_W'
            vfio_vgpu_resource_class = 'CUSTOM_F'
            whole_gpu_alias = 'w'
            vfio_vgpu_alias = 'f'
            vgpu_backend = 'vfio'
            max_gpu_count = 6
            rdma_locality = 'root-complex'
            rdma_nic_alias = 'cx7-vf'
        self.assertEqual(
            flavor.PathNames('CUSTOM_V', 'CUSTOM_W', 'CUSTOM_F', 'w', 'f',
                             'vfio', 6, 'root-complex', 'cx7-vf'),
            flavor.PathNames.from_options(Options))
        self.assertEqual('X', flavor.PathNames.from_options(
            Options, vgpu_rc='X').vgpu_rc)

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


class VgpuTypeTest(base.TestCase):
    """The type a vendor-VFIO VF is given for a flavor (the qemu hook)."""

    def setUp(self):
        super().setUp()
        self.a100 = base.CATALOG.model('A100-40GB')

    def types(self, specs, model=None):
        return flavor.vgpu_types_for(specs, base.CATALOG,
                                     model or self.a100)

    def test_profile_is_the_type(self):
        self.assertEqual(('A100-10C',), self.types(
            {'gpu:profile': 'A100-10C', 'resources:VGPU': '1'}))
        self.assertEqual('A100-10C', flavor.vgpu_type_for(
            {'gpu:profile': 'A100-10C'}, base.CATALOG, self.a100,
            ['A100-10C', 'A100-20C']))
        err = self.assertRaises(flavor.ExtraSpecError, self.types,
                                {'gpu:profile': 'A100-10C'},
                                base.CATALOG.model('H100-80GB'))
        self.assertIn('is a A100-40GB profile, not one of this H100-80GB',
                      str(err))

    def test_memory_in_the_schedulers_order(self):
        # The scheduler's alternatives on this model, in their order.
        for specs in ({'gpu:memory': '10GB'},
                      {'gpu:memory': '10GB', 'gpu:compute': '0.4'},
                      {'gpu:memory': '5000MB', 'gpu:model': 'A100,H100'}):
            spec = flavor.parse(specs, base.CATALOG)
            expected = tuple(a.profile for a in spec.alternatives
                             if a.models == frozenset(['A100-40GB']))
            self.assertTrue(expected)
            self.assertEqual(expected, self.types(specs))
        types = self.types({'gpu:memory': '10GB'})
        sizes = [self.a100.vgpu_profiles[t].framebuffer_mib for t in types]
        self.assertEqual(sorted(sizes), sizes)
        self.assertEqual(10240, sizes[0])
        # The larger compute share first among equal sizes: 2/7 > 1/4.
        self.assertEqual(('A100-2-10C', 'A100X-2-10C', 'A100-10C'),
                         types[:3])

    def test_first_available_now(self):
        specs = {'gpu:memory': '10GB', 'pci_passthrough:alias':
                 'nvidia-vgpu:1'}
        self.assertEqual('A100-2-10C', flavor.vgpu_type_for(
            specs, base.CATALOG, self.a100))
        self.assertEqual('A100-10C', flavor.vgpu_type_for(
            specs, base.CATALOG, self.a100,
            ['A100-4C', 'A100-10C', 'A100-20C']))
        self.assertEqual('A100-20C', flavor.vgpu_type_for(
            specs, base.CATALOG, self.a100, {'A100-4C', 'A100-20C'}))
        err = self.assertRaises(flavor.ExtraSpecError, flavor.vgpu_type_for,
                                specs, base.CATALOG, self.a100,
                                ['A100-4C', 'A100-8C'])
        self.assertIn('gpu:memory=10GB', str(err))
        self.assertIn('available: A100-4C, A100-8C', str(err))
        err = self.assertRaises(flavor.ExtraSpecError, flavor.vgpu_type_for,
                                {'gpu:profile': 'A100-10C'}, base.CATALOG,
                                self.a100, [])
        self.assertIn('wanted: A100-10C; available: none', str(err))

    def test_flavors_naming_no_type(self):
        for specs in ({}, {'resources:VGPU': '1'}, {'gpu:mig': '3g.20gb'},
                      {'gpu:memory': '10GB', 'gpu:kind': 'mig'},
                      {'gpu:memory': '10GB', 'gpu:kind': 'whole'},
                      {'gpu:kind': 'whole'}, {'gpu:preemptible': 'true'}):
            self.assertEqual((), self.types(specs), specs)
            self.assertIsNone(flavor.vgpu_type_for(
                specs, base.CATALOG, self.a100, []), specs)

    def test_bad_flavors_refused(self):
        for specs, words in (
                ({'gpu:memory': '10GB', 'gpu:model': 'H100-80GB'},
                 'does not allow this A100-40GB GPU'),
                ({'gpu:memory': '100GB'}, 'gpu:memory=100GB: no vGPU type '
                 'of this A100-40GB GPU meets it'),
                ({'gpu:memory': '41GB', 'gpu:compute': '10%'},
                 'gpu:memory=41GB: no vGPU type'),
                ({'gpu:profile': 'NOPE'}, 'unknown vGPU profile'),
                ({'GPU:memory': '10GB'}, 'did you mean gpu:memory'),
                ({'gpu:memory': '10GB', 'gpu:profile': 'A100-10C'},
                 'cannot be combined')):
            err = self.assertRaises(flavor.ExtraSpecError, self.types, specs)
            self.assertIn(words, str(err))
        # The count is not the agent's to police: any the grammar allows.
        self.assertEqual(('A100-10C',), self.types(
            {'gpu:profile': 'A100-10C', 'gpu:count': '8'}))
