"""Discovery from sysfs and NVML (faked at the pynvml boundary)."""

import os
import tempfile

import pynvml
import testtools

from nova_gpu.agent import discovery
from nova_gpu.agent import errors
from nova_gpu.agent import nvml
from nova_gpu.agent import sysfs
from nova_gpu.core import catalog
from nova_gpu.core import report
from tests.unit.agent import fakenvml
from tests.unit.agent import fakesys

CATALOG = catalog.load_catalog()


class SysfsCase(testtools.TestCase):
    def setUp(self):
        super().setUp()
        self.root = os.path.join(self.useFixture(
            _TempDir()).path, 'sys')
        self.fs = fakesys.FakeSysfs(self.root)
        self.sysfs = sysfs.Sysfs(self.root)


class _TempDir:
    """Minimal fixture (testtools.useFixture protocol)."""

    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.path = self._tmp.name

    def cleanUp(self):
        self._tmp.cleanup()

    def getDetails(self):
        return {}


class TestHgxH100(SysfsCase):
    def setUp(self):
        super().setUp()
        fakenvml.hgx_h100_sysfs(self.fs)
        self.nvml = nvml.Nvml(lib=fakenvml.hgx_h100())
        self.inv = discovery.Discovery(self.sysfs, self.nvml, CATALOG,
                                       host='hgx1').discover()

    def test_models_numa_and_order(self):
        gpus = self.inv.gpus
        self.assertEqual(8, len(gpus))
        self.assertEqual(['H100-80GB'] * 8, [g.model.name for g in gpus])
        self.assertEqual([0, 0, 0, 0, 1, 1, 1, 1],
                         [g.numa_node for g in gpus])
        self.assertEqual('0000:1b:00.0', gpus[0].address)
        self.assertEqual({'sysfs': True, 'nvml': True, 'libvirt': False},
                         self.inv.sources)

    def test_nvswitch_makes_one_nvlink_domain(self):
        for g in self.inv.gpus:
            self.assertEqual(set(range(8)) - {g.index}, g.nvlink_peers)
            self.assertEqual(0, g.nvlink_domain)
        self.assertIn('CUSTOM_GPU_NVLINK_0', self.inv.gpus[5].traits())

    def test_pcie_switch_pairs(self):
        switches = [g.pcie_switch for g in self.inv.gpus]
        self.assertEqual(switches[0], switches[1])
        self.assertNotEqual(switches[1], switches[2])
        self.assertEqual(4, len(set(switches)))

    def test_pcie_switch_from_nvml_without_sysfs(self):
        inv = discovery.Discovery(sysfs.Sysfs('/nonexistent'), self.nvml,
                                  CATALOG).discover()
        self.assertEqual(['nvml-switch-0', 'nvml-switch-0', 'nvml-switch-2',
                          'nvml-switch-2', 'nvml-switch-4', 'nvml-switch-4',
                          'nvml-switch-6', 'nvml-switch-6'],
                         [g.pcie_switch for g in inv.gpus])
        # NUMA from NVML when sysfs is missing
        self.assertEqual([0] * 4 + [1] * 4, [g.numa_node for g in inv.gpus])

    def test_vgpu_types_from_nvml(self):
        self.assertEqual(['H100XM-10C', 'H100XM-20C', 'H100XM-40C',
                          'H100XM-80C'], self.inv.gpus[0].vgpu_profiles)

    def test_report_round_trips_through_core_schema(self):
        data = self.inv.report(generation=7)
        self.assertEqual(report.VERSION, data['version'])
        self.assertEqual(7, data['generation'])
        self.assertEqual('hgx1_pci_0000_1b_00_0', data['gpus'][0]['provider'])
        self.assertEqual(['CUSTOM_GPU_MODEL_H100_80GB', 'CUSTOM_GPU_NUMA_1',
                          'CUSTOM_GPU_NVLINK_0'], data['gpus'][7]['traits'])
        host = report.host_from_dict(data, CATALOG)
        self.assertEqual(8, len(host.gpus))
        self.assertEqual(frozenset(range(1, 8)), host.gpus[0].nvlink_peers)
        self.assertEqual(1, host.gpus[4].numa_node)


class TestA100Mig(SysfsCase):
    def setUp(self):
        super().setUp()
        self.fs.add_pci('0000:07:00.0', '0x20b0', numa_node=0)
        self.lib = fakenvml.a100_mig()
        self.nvml = nvml.Nvml(lib=self.lib)

    def discover(self):
        return discovery.Discovery(self.sysfs, self.nvml, CATALOG,
                                   host='a1').discover()

    def test_mig_instances_reported(self):
        inv = self.discover()
        g = inv.gpus[0]
        self.assertEqual('A100-40GB', g.model.name)
        self.assertEqual([('3g.20gb', 0, None), ('2g.10gb', 4, None)],
                         g.mig_slots)
        self.assertTrue(inv.host.gpus[0].mig_enabled)
        self.assertEqual(0b111111, inv.host.gpus[0].mig_mask)
        self.assertIn('CUSTOM_GPU_MIG', g.traits())
        data = inv.report()
        self.assertEqual([{'kind': 'mig', 'detail': ['3g.20gb', 0, None]},
                          {'kind': 'mig', 'detail': ['2g.10gb', 4, None]}],
                         data['gpus'][0]['devices'])
        rebuilt = report.host_from_dict(data, CATALOG)
        self.assertEqual(0b111111, rebuilt.gpus[0].mig_mask)

    def test_create_mig_then_discover(self):
        profile = CATALOG.model('A100-40GB').mig_profile('1g.5gb')
        gi = self.nvml.create_mig(0, profile, 6)
        self.assertEqual(3, gi)
        self.assertIn(('1g.5gb', 6, None), self.discover().gpus[0].mig_slots)

    def test_create_mig_no_room(self):
        profile = CATALOG.model('A100-40GB').mig_profile('3g.20gb')
        e = self.assertRaises(errors.NoCapacity, self.nvml.create_mig, 0,
                              profile, 4)
        self.assertIn('no room for MIG 3g.20gb at slice 4', str(e))

    def test_compute_instance_failure_leaves_no_gpu_instance(self):
        self.lib.fail_compute_instance = True
        profile = CATALOG.model('A100-40GB').mig_profile('1g.5gb')
        e = self.assertRaises(errors.AgentError, self.nvml.create_mig, 0,
                              profile, 6)
        self.assertIn('destroyed again', str(e))
        self.assertEqual(2, len(self.lib.gpus[0].gis))
        self.assertIn(('destroy_gi', 3), self.lib.calls)

    def test_destroy_mig(self):
        self.nvml.destroy_mig(0, 2)
        self.assertEqual([('3g.20gb', 0, None)],
                         self.discover().gpus[0].mig_slots)


class TestWithoutDriver(SysfsCase):
    def test_library_not_found_falls_back_to_sysfs(self):
        self.fs.add_pci('0000:3b:00.0', '0x1eb8', numa_node=1)
        self.fs.add_mdev_type('0000:3b:00.0', 'nvidia-222', 'GRID T4-1Q', 16)
        lib = fakenvml.FakePynvml(library_missing=True)
        n = nvml.Nvml(lib=lib)
        self.assertFalse(n.available)
        self.assertIn('NVIDIA driver not installed', n.reason)
        self.assertEqual([], n.gpus())
        inv = discovery.Discovery(self.sysfs, n, CATALOG).discover()
        self.assertEqual('T4', inv.gpus[0].model.name)
        self.assertEqual(1, inv.gpus[0].numa_node)
        self.assertFalse(inv.sources['nvml'])
        self.assertEqual(['T4-1Q'], inv.gpus[0].vgpu_profiles)

    def test_real_pynvml_without_driver(self):
        # The machine running the tests has no NVIDIA driver: the real
        # pynvml module raises NVMLError_LibraryNotFound.
        n = nvml.Nvml(lib=pynvml)
        if n.available:  # pragma: no cover - a real GPU host
            self.skipTest('this host has an NVIDIA driver')
        self.assertFalse(n.available)
        self.assertEqual([], n.gpus())

    def test_unknown_device_gets_generic_model(self):
        self.fs.add_pci('0000:3b:00.0', '0xffff')
        inv = discovery.Discovery(self.sysfs, None, CATALOG).discover()
        self.assertEqual('PCI-10DE-FFFF', inv.gpus[0].model.name)

    def test_no_sysfs_at_all(self):
        inv = discovery.Discovery(sysfs.Sysfs('/nonexistent'), None,
                                  CATALOG).discover()
        self.assertEqual([], inv.gpus)
        self.assertFalse(inv.sources['sysfs'])


class TestSriovVendorFiles(SysfsCase):
    def setUp(self):
        super().setUp()
        self.fs.add_pci('0000:86:00.0', '0x2330', numa_node=1)
        self.vfs = self.fs.add_vfs('0000:86:00.0', 3,
                                   {1061: 'NVIDIA H100XM-10C',
                                    1062: 'NVIDIA H100XM-20C'})

    def test_vfs_and_creatable_types(self):
        fn = self.sysfs.pci_function('0000:86:00.0')
        self.assertEqual(tuple(self.vfs), fn.vfs)
        vf = self.sysfs.pci_function(self.vfs[0])
        self.assertEqual('0000:86:00.0', vf.physfn)
        self.assertEqual({1061: 'NVIDIA H100XM-10C',
                          1062: 'NVIDIA H100XM-20C'}, vf.creatable_vgpu_types)
        self.assertEqual(0, vf.current_vgpu_type)
        inv = discovery.Discovery(self.sysfs, None, CATALOG).discover()
        self.assertEqual(1, len(inv.gpus))  # VFs belong to their PF
        self.assertEqual(['H100XM-10C', 'H100XM-20C'],
                         inv.gpus[0].vgpu_profiles)

    def test_parse_creatable_skips_header(self):
        self.assertEqual({557: 'NVIDIA H100-80C'}, sysfs.parse_creatable(
            'ID    : vGPU Name\n557   : NVIDIA H100-80C\n'))

    def test_bad_pci_address(self):
        self.assertRaises(errors.InvalidName, self.sysfs.pci_function,
                          '../../etc')
