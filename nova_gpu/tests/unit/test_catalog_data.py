"""Checks on the data in the shipped GPU catalog (data/gpu_catalog.yaml).

These tests pin facts taken from NVIDIA's documentation (MIG placements,
vGPU type sizes and counts) and internal consistency rules the loader does
not enforce on its own (unique PCI ids and vGPU type names across models,
MIG placements that can really host ``max_instances`` instances).
"""

import itertools

import testtools

from nova_gpu.core import catalog

REQUIRED_MODELS = (
    'A100-40GB', 'A100-80GB', 'H100-80GB', 'H200-141GB', 'L40S', 'L4',
    'A10', 'T4', 'V100-32GB', 'V100-16GB', 'P100-16GB', 'A30',
    'H100-94GB',
)
SRIOV_ARCHITECTURES = ('ampere', 'ada', 'hopper')
MDEV_ARCHITECTURES = ('turing', 'volta', 'pascal')


class ShippedCatalogTestCase(testtools.TestCase):

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.catalog = catalog.load_catalog()

    def model(self, name):
        return self.catalog.model(name)

    def starts(self, model, profile):
        return self.model(model).mig_profile(profile).starts


class TestModelsPresent(ShippedCatalogTestCase):

    def test_required_models_present(self):
        missing = set(REQUIRED_MODELS) - set(self.catalog.models)
        self.assertEqual(set(), missing)

    def test_trace_aliases_resolve(self):
        # Node types of the Alibaba GPU trace.
        self.assertEqual('P100-16GB', self.model('P100').name)
        self.assertEqual('V100-16GB', self.model('V100M16').name)
        self.assertEqual('V100-32GB', self.model('V100M32').name)

    def test_framebuffers(self):
        expected = {
            'A100-40GB': 40960, 'A100-80GB': 81920, 'A30': 24576,
            'A10': 24576, 'L40S': 49152, 'L4': 24576, 'H100-80GB': 81920,
            'H200-141GB': 144384, 'H100-94GB': 96256, 'T4': 16384,
            'V100-32GB': 32768,
            'V100-16GB': 16384, 'P100-16GB': 16384,
        }
        actual = {name: self.model(name).framebuffer_mib
                  for name in expected}
        self.assertEqual(expected, actual)


class TestSources(ShippedCatalogTestCase):

    def test_every_model_cites_a_source(self):
        for model in self.catalog.models.values():
            self.assertNotEqual((), model.sources, model.name)
            for ref in model.sources:
                self.assertIn(ref, self.catalog.sources, model.name)

    def test_every_source_is_cited(self):
        cited = {ref for m in self.catalog.models.values()
                 for ref in m.sources}
        self.assertEqual(set(self.catalog.sources), cited)


class TestIdentification(ShippedCatalogTestCase):

    def test_pci_ids_unique_and_well_formed(self):
        seen = {}
        for model in self.catalog.models.values():
            for dev in model.pci_device_ids:
                self.assertRegex(dev, r'^[0-9a-f]{4}$')
                self.assertNotIn(dev, seen, '%s also in %s'
                                 % (model.name, seen.get(dev)))
                seen[dev] = model.name

    def test_nvml_names_unique(self):
        names = [n.lower() for m in self.catalog.models.values()
                 for n in m.nvml_names]
        self.assertEqual(len(names), len(set(names)))

    def test_pci_lookup(self):
        cases = {
            '0x20b0': 'A100-40GB', '20f1': 'A100-40GB',
            '20b2': 'A100-80GB', '20b5': 'A100-80GB',
            '0x2330': 'H100-80GB', '2331': 'H100-80GB',
            '2335': 'H200-141GB', '233B': 'H200-141GB',
            '2321': 'H100-94GB',
            '26b9': 'L40S', '27b8': 'L4', '2236': 'A10', '20b7': 'A30',
            '1eb8': 'T4', '1db5': 'V100-32GB', '1db6': 'V100-32GB',
            '1db1': 'V100-16GB', '1db4': 'V100-16GB', '15f8': 'P100-16GB',
        }
        for dev, name in cases.items():
            found = self.catalog.model_for_pci(dev)
            self.assertIsNotNone(found, dev)
            self.assertEqual(name, found.name, dev)

    def test_nvml_lookup(self):
        cases = {
            'NVIDIA A100-SXM4-40GB': 'A100-40GB',
            'NVIDIA A100-PCIE-40GB': 'A100-40GB',
            'NVIDIA A100-SXM4-80GB': 'A100-80GB',
            'NVIDIA A100 80GB PCIe': 'A100-80GB',
            'NVIDIA H100 80GB HBM3': 'H100-80GB',
            'NVIDIA H100 PCIe': 'H100-80GB',
            'NVIDIA H200': 'H200-141GB',
            'NVIDIA H200 NVL': 'H200-141GB',
            'NVIDIA H100 NVL': 'H100-94GB',
            'NVIDIA L40S': 'L40S', 'NVIDIA L4': 'L4', 'NVIDIA A10': 'A10',
            'Tesla T4': 'T4',
            'Tesla V100-SXM2-32GB': 'V100-32GB',
            'Tesla V100-PCIE-32GB': 'V100-32GB',
            'Tesla V100-SXM2-16GB': 'V100-16GB',
        }
        for nvml_name, name in cases.items():
            found = self.catalog.model_for_nvml_name(nvml_name)
            self.assertIsNotNone(found, nvml_name)
            self.assertEqual(name, found.name, nvml_name)


class TestVgpuModes(ShippedCatalogTestCase):

    def test_mode_follows_architecture(self):
        for model in self.catalog.models.values():
            if model.architecture in SRIOV_ARCHITECTURES:
                self.assertEqual('sriov', model.vgpu_mode, model.name)
            elif model.architecture in MDEV_ARCHITECTURES:
                self.assertEqual('mdev', model.vgpu_mode, model.name)

    def test_equal_size_mode_everywhere(self):
        # max_instances are the equal-size-mode maxima, so mixing sizes
        # must not be assumed for any shipped model.
        for model in self.catalog.models.values():
            self.assertFalse(model.time_sliced_mixing, model.name)


class TestMigPlacements(ShippedCatalogTestCase):

    def test_a100_40gb_placements(self):
        # MIG user guide, `nvidia-smi mig -lgipp` on A100-SXM4-40GB.
        expected = {
            '1g.5gb': ((0, 1, 2, 3, 4, 5, 6), 1, 7),
            '1g.5gb+me': ((0, 1, 2, 3, 4, 5, 6), 1, 1),
            '1g.10gb': ((0, 2, 4, 6), 2, 4),
            '2g.10gb': ((0, 2, 4), 2, 3),
            '3g.20gb': ((0, 4), 4, 2),
            '4g.20gb': ((0,), 4, 1),
            '7g.40gb': ((0,), 8, 1),
        }
        mig = self.model('A100-40GB').mig
        self.assertEqual((8, 7), (mig.memory_slices, mig.compute_slices))
        actual = {name: (p.starts, p.memory_slices, p.max_instances)
                  for name, p in mig.profiles.items()}
        self.assertEqual(expected, actual)

    def test_a100_40gb_key_starts(self):
        self.assertEqual((0, 4), self.starts('A100-40GB', '3g.20gb'))
        self.assertEqual((0,), self.starts('A100-40GB', '4g.20gb'))

    def test_h100_80gb_profile_set(self):
        self.assertEqual(
            {'1g.10gb', '1g.10gb+me', '1g.20gb', '2g.20gb', '3g.40gb',
             '4g.40gb', '7g.80gb'},
            set(self.model('H100-80GB').mig.profiles))
        self.assertEqual((0, 4), self.starts('H100-80GB', '3g.40gb'))
        self.assertEqual((0, 2, 4, 6), self.starts('H100-80GB', '1g.20gb'))

    def test_h200_profile_set(self):
        self.assertEqual(
            {'1g.18gb', '1g.18gb+me', '1g.35gb', '2g.35gb', '3g.71gb',
             '4g.71gb', '7g.141gb'},
            set(self.model('H200-141GB').mig.profiles))

    def test_h100_nvl_profiles(self):
        # NVAIE 6 Table 91 (H100 PCIe 94GB): counts; the 8-slice Hopper
        # placements (mig-lgipp-observed lists an H100 NVL).
        expected = {
            '1g.12gb': ((0, 1, 2, 3, 4, 5, 6), 1, 7),
            '1g.12gb+me': ((0, 1, 2, 3, 4, 5, 6), 1, 1),
            '1g.24gb': ((0, 2, 4, 6), 2, 4),
            '2g.24gb': ((0, 2, 4), 2, 3),
            '3g.47gb': ((0, 4), 4, 2),
            '4g.47gb': ((0,), 4, 1),
            '7g.94gb': ((0,), 8, 1),
        }
        mig = self.model('H100-94GB').mig
        self.assertEqual((8, 7), (mig.memory_slices, mig.compute_slices))
        actual = {name: (p.starts, p.memory_slices, p.max_instances)
                  for name, p in mig.profiles.items()}
        self.assertEqual(expected, actual)

    def test_a30_placements(self):
        mig = self.model('A30').mig
        self.assertEqual((4, 4), (mig.memory_slices, mig.compute_slices))
        self.assertEqual((0, 1, 2, 3), self.starts('A30', '1g.6gb'))
        self.assertEqual((0, 2), self.starts('A30', '2g.12gb'))
        self.assertEqual((0,), self.starts('A30', '4g.24gb'))

    def test_non_mig_models(self):
        for name in ('L40S', 'L4', 'A10', 'T4', 'V100-32GB', 'V100-16GB',
                     'P100-16GB'):
            self.assertFalse(self.model(name).mig_capable, name)

    def test_max_instances_fit_the_placements(self):
        """max_instances disjoint instances exist, and no more."""
        for model in self.catalog.models.values():
            if not model.mig:
                continue
            for profile in model.mig.profiles.values():
                where = '%s %s' % (model.name, profile.name)
                self.assertEqual(sorted(set(profile.starts)),
                                 list(profile.starts), where)
                self.assertLessEqual(profile.framebuffer_mib,
                                     model.framebuffer_mib, where)
                best = self._max_disjoint(profile)
                if profile.name.endswith('+me'):
                    # Media extensions exist once per GPU.
                    self.assertEqual(1, profile.max_instances, where)
                else:
                    self.assertEqual(best, profile.max_instances, where)

    @staticmethod
    def _max_disjoint(profile):
        masks = [profile.mask(s) for s in profile.starts]
        for count in range(len(masks), 0, -1):
            for combo in itertools.combinations(masks, count):
                used = 0
                for mask in combo:
                    if used & mask:
                        break
                    used |= mask
                else:
                    return count
        return 0


class TestVgpuProfiles(ShippedCatalogTestCase):

    def test_mig_backed_profiles_map_to_mig_profiles(self):
        for model in self.catalog.models.values():
            for profile in model.vgpu_profiles.values():
                if not profile.mig_backed:
                    continue
                self.assertIsNotNone(model.mig, profile.name)
                self.assertIn(profile.mig_profile, model.mig.profiles,
                              profile.name)
                backing = model.mig.profiles[profile.mig_profile]
                self.assertEqual(backing.framebuffer_mib,
                                 profile.framebuffer_mib, profile.name)

    def test_mig_backed_examples(self):
        cases = {
            'A100-3-20C': ('A100-40GB', '3g.20gb'),
            'A100X-1-5C': ('A100-40GB', '1g.5gb'),
            'A100-1-5CME': ('A100-40GB', '1g.5gb+me'),
            'A100D-3-40C': ('A100-80GB', '3g.40gb'),
            'A100DX-7-80C': ('A100-80GB', '7g.80gb'),
            'H100-1-10C': ('H100-80GB', '1g.10gb'),
            'H100XM-3-40C': ('H100-80GB', '3g.40gb'),
            'H100XM-1-20C': ('H100-80GB', '1g.20gb'),
            'H200-1-18C': ('H200-141GB', '1g.18gb'),
            'H200X-7-141C': ('H200-141GB', '7g.141gb'),
            'H100L-1-24C': ('H100-94GB', '1g.24gb'),
            'H100L-7-94C': ('H100-94GB', '7g.94gb'),
            'A30-2-12C': ('A30', '2g.12gb'),
        }
        for vgpu, (model_name, mig_name) in cases.items():
            model, profile = self.catalog.vgpu_profile(vgpu)
            self.assertEqual(model_name, model.name, vgpu)
            self.assertEqual(mig_name, profile.mig_profile, vgpu)

    def test_time_sliced_examples(self):
        cases = {
            'A100-10C': (10240, 4), 'A100X-4C': (4096, 10),
            'A100D-16C': (16384, 5), 'A100DX-4C': (4096, 20),
            'H100-5C': (5120, 16), 'H100XM-80C': (81920, 1),
            'H200-4C': (4096, 32), 'H200X-141C': (144384, 1),
            'H100L-4C': (4096, 23), 'H100L-23C': (23552, 4),
            'H100L-47C': (48128, 2), 'H100L-94C': (96246, 1),
            'L40S-4C': (4096, 12), 'L40S-16C': (16384, 3),
            'L4-8C': (8192, 3), 'A10-6C': (6144, 4), 'A30-8C': (8192, 3),
            'T4-16C': (16384, 1), 'V100DX-4C': (4096, 8),
            'V100D-32C': (32768, 1), 'V100X-8C': (8192, 2),
            'P100-4C': (4096, 4),
        }
        for vgpu, expected in cases.items():
            _model, profile = self.catalog.vgpu_profile(vgpu)
            self.assertFalse(profile.mig_backed, vgpu)
            self.assertEqual(
                expected, (profile.framebuffer_mib, profile.max_instances),
                vgpu)

    def test_sizes_are_nvidia_s_not_the_name_s(self):
        # NVAIE 6 Tables 91/92: the H100 NVL's frame buffers are explicit
        # MB, not the GB of the name * 1024 (which would be 24576 and
        # 96256 for the 24gb and 94gb profiles).
        mig = self.model('H100-94GB').mig.profiles
        sizes = {name: p.framebuffer_mib for name, p in mig.items()}
        self.assertEqual({'1g.12gb': 12288, '1g.12gb+me': 12288,
                          '1g.24gb': 24672, '2g.24gb': 24672,
                          '3g.47gb': 48128, '4g.47gb': 48128,
                          '7g.94gb': 96246}, sizes)
        for name in ('H100L-1-24C', 'H100L-2-24C'):
            _model, profile = self.catalog.vgpu_profile(name)
            self.assertEqual(24672, profile.framebuffer_mib, name)

    def test_no_time_sliced_overcommit(self):
        for model in self.catalog.models.values():
            for profile in model.vgpu_profiles.values():
                if profile.mig_backed:
                    continue
                self.assertLessEqual(
                    profile.framebuffer_mib * profile.max_instances,
                    model.framebuffer_mib, profile.name)

    def test_vgpu_type_names_unique_across_models(self):
        names = [p for m in self.catalog.models.values()
                 for p in m.vgpu_profiles]
        self.assertEqual(len(names), len(set(names)))
        self.assertEqual(sorted(names), self.catalog.vgpu_profile_names())

    def test_type_names_carry_board_prefix(self):
        prefixes = {
            'A100-40GB': ('A100-', 'A100X-'),
            'A100-80GB': ('A100D-', 'A100DX-'),
            'H100-80GB': ('H100-', 'H100XM-'),
            'H200-141GB': ('H200-', 'H200X-'),
            'H100-94GB': ('H100L-',),
            'L40S': ('L40S-',), 'L4': ('L4-',), 'A10': ('A10-',),
            'A30': ('A30-',), 'T4': ('T4-',),
            'V100-32GB': ('V100D-', 'V100DX-', 'V100S-'),
            'V100-16GB': ('V100-', 'V100X-'), 'P100-16GB': ('P100-',),
        }
        for name, allowed in prefixes.items():
            for vgpu in self.model(name).vgpu_profiles:
                self.assertTrue(vgpu.startswith(allowed), vgpu)
