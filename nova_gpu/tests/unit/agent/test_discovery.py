"""Discovery from sysfs and NVML (faked at the pynvml boundary)."""

import dataclasses
import os
import tempfile
import types

import pynvml
import testtools

from nova_gpu.agent.cli import devices as devices_cli
from nova_gpu.agent.cli import inventory
from nova_gpu.agent import discovery
from nova_gpu.agent import errors
from nova_gpu.agent import nvml
from nova_gpu.agent import sysfs
from nova_gpu.core import catalog
from nova_gpu.core import report
from nova_gpu.tests.unit.agent import fakenvml
from nova_gpu.tests.unit.agent import fakesys

CATALOG = catalog.load_catalog()


INSTANCE = '5a4e1c0b-7f0e-4a6e-9d8c-2b1f3e4d5c6a'


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
        # Plain PFs on the nvidia driver, no VFs or mdev types: Nova
        # makes no provider for them.
        self.assertEqual([], data['gpus'][0]['providers'])
        self.assertIsNone(data['gpus'][0]['provider'])
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

    def test_mixed_size_mode_reported(self):
        gpu = self.lib.gpus[0]
        gpu.heterogeneous = 1
        # MIG on: no time-sliced vGPUs, so no mixed-size mode.
        self.assertFalse(self.discover().host.gpus[0].mixed_size)
        gpu.mig, gpu.gis = False, {}
        inv = self.discover()
        self.assertTrue(inv.host.gpus[0].mixed_size)
        self.assertIs(True, inv.report()['gpus'][0]['mixed_size'])
        gpu.heterogeneous = 0
        self.assertNotIn('mixed_size', self.discover().report()['gpus'][0])

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

    def test_mig_backed_mdev_counted_by_its_gpu_instance(self):
        vfs = self.fs.add_mdev_vfs('0000:07:00.0', 2, {
            'nvidia-700': ('NVIDIA A100-3-20C', 1)})
        self.fs.materialise_mdev(vfs[0], 'nvidia-700',
                                 '4b20d080-1b54-4048-85b3-a6a62d165c01')
        data = self.discover().report()
        # The GPU instances hold the slices; the mdev adds no device the
        # scheduler would refuse ("no room for vGPU A100-3-20C").
        self.assertEqual(['mig', 'mig'],
                         [d['kind'] for d in data['gpus'][0]['devices']])
        rebuilt = report.host_from_dict(data, CATALOG)
        self.assertEqual(0b111111, rebuilt.gpus[0].mig_mask)

    def _mig_backed_host(self, refs, mdev=None):
        """A100 in MIG mode (3g.20gb at 0, 2g.10gb at 4) whose VFs offer
        the MIG-backed A100-3-20C, with ``mdev`` made on the first VF;
        ``refs``: what libvirt's domains hold.
        """
        vfs = self.fs.add_mdev_vfs('0000:07:00.0', 2, {
            'nvidia-700': ('NVIDIA A100-3-20C', 1)})
        if mdev:
            self.fs.materialise_mdev(vfs[0], 'nvidia-700', mdev)

        class Libvirt:
            def pci_devices(self):
                return [{'name': 'pci_0000_07_00_0'}]

            def domain_refs(self, by='name'):
                return refs
        inv = discovery.Discovery(self.sysfs, self.nvml, CATALOG, host='a1',
                                  libvirt=Libvirt()).discover()
        return inv, inv.report()

    def _room(self, data):
        gpu = report.host_from_dict(data, CATALOG).gpus[0]
        return gpu.vgpu_mig_starts(
            CATALOG.model('A100-40GB').vgpu_profile('A100-3-20C'))

    @staticmethod
    def _held(data):
        return [d['detail'][:2] for d in data['gpus'][0]['devices']]

    def test_gpu_instances_no_guest_holds_are_room(self):
        inv, data = self._mig_backed_host({})
        # The 2g.10gb backs no type the VFs offer: room for nothing.
        self.assertEqual([['2g.10gb', 4]], self._held(data))
        self.assertEqual([['3g.20gb', 0, None]],
                         [d['detail'] for d in
                          data['gpus'][0]['idle_gpu_instances']])
        # The instance made ahead for A100-3-20C takes the next guest.
        self.assertEqual((0,), self._room(data))
        # The agent's own model still has them (planning).
        self.assertEqual(0b111111, inv.host.gpus[0].mig_mask)

    def test_gpu_instance_held_by_a_guests_mdev(self):
        # A stopped guest holds its mdev (libvirt) though NVML runs no
        # vGPU for it.
        uuid = '4b20d080-1b54-4048-85b3-a6a62d165c01'
        _inv, data = self._mig_backed_host({uuid: ['instance-1']}, uuid)
        self.assertEqual([['3g.20gb', 0], ['2g.10gb', 4]], self._held(data))
        self.assertEqual((), self._room(data))

    def test_gpu_instance_held_by_a_running_vgpu(self):
        self.lib.start_vgpu_on(self.lib.gpus[0], 1)  # the 3g.20gb
        _inv, data = self._mig_backed_host({})
        self.assertEqual([['3g.20gb', 0], ['2g.10gb', 4]], self._held(data))

    def test_the_guest_holding_a_gpu_instance_is_named(self):
        # NVML: the vGPU on GI 1 (the 3g.20gb at slice 0) runs as the
        # guest's mdev; libvirt: that mdev is the domain's.
        uuid = '4b20d080-1b54-4048-85b3-a6a62d165c01'
        self.lib.start_vgpu_on(self.lib.gpus[0], 1, mdev=uuid)
        _inv, data = self._mig_backed_host({uuid: [INSTANCE]}, uuid)
        by_start = {d['detail'][1]: d.get('instance')
                    for d in data['gpus'][0]['devices']}
        self.assertEqual({0: INSTANCE, 4: None}, by_start)

    def test_every_gpu_instance_held_without_libvirt(self):
        self.fs.add_mdev_vfs('0000:07:00.0', 2, {
            'nvidia-700': ('NVIDIA A100-3-20C', 1)})
        data = self.discover().report()
        self.assertEqual([['3g.20gb', 0], ['2g.10gb', 4]], self._held(data))

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


class TestUnreadableGpus(SysfsCase):
    """A GPU NVML lists but cannot read (fallen off the bus, a driver
    fault) is left out of the report; the host's other GPUs are reported.
    """

    def setUp(self):
        super().setUp()
        fakenvml.hgx_h100_sysfs(self.fs)
        self.lib = fakenvml.hgx_h100()
        self.nvml = nvml.Nvml(lib=self.lib)

    def discover(self, libvirt=None):
        return discovery.Discovery(self.sysfs, self.nvml, CATALOG,
                                   host='hgx1', libvirt=libvirt).discover()

    def test_mixed_size_mode_the_catalog_lacks_is_not_reported(self):
        # NVML says so, but the catalog has no H100 mixed-size maxima.
        self.lib.gpus[0].heterogeneous = 1
        with self.assertLogs(discovery.LOG.logger, 'WARNING') as logs:
            inv = self.discover()
        self.assertFalse(inv.host.gpus[0].mixed_size)
        self.assertIn('no mixed-size maxima for H100', logs.output[0])

    def test_lost_gpu_is_left_out_not_the_host(self):
        self.lib.fail('nvmlDeviceGetName', pynvml.NVML_ERROR_GPU_IS_LOST,
                      address='0000:52:00.0')
        inv = self.discover(libvirt=_Libvirt(['0000:52:00.0']))
        addresses = [g.address for g in inv.gpus]
        # sysfs and libvirt still show it: neither brings it back.
        self.assertNotIn('0000:52:00.0', addresses)
        self.assertEqual(7, len(addresses))
        self.assertEqual(list(range(7)), [g.index for g in inv.gpus])
        self.assertEqual([{'address': '0000:52:00.0', 'nvml_index': 2,
                           'reason': 'GPU is lost'}], inv.unreadable)
        data = inv.report()
        self.assertEqual(7, len(data['gpus']))
        # The scheduler learns which providers stand for no usable GPU.
        self.assertEqual([{'address': '0000:52:00.0',
                           'reason': 'GPU is lost',
                           'providers': ['hgx1_pci_0000_52_00_0',
                                         'hgx1_0000:52:00.0']}],
                         data['left_out'])
        parsed = report.parse(data, CATALOG)
        self.assertEqual(['0000:52:00.0'],
                         [g.address for g in parsed.left_out])
        # Read again: nothing left out.
        self.lib.nvmlDeviceGetName = type(self.lib).nvmlDeviceGetName.__get__(
            self.lib)
        data = self.discover().report()
        self.assertEqual(8, len(data['gpus']))
        self.assertNotIn('left_out', data)

    def test_nova_gpu_list_shows_them(self):
        self.lib.fail('nvmlDeviceGetName', pynvml.NVML_ERROR_GPU_IS_LOST,
                      address='0000:52:00.0')
        self.lib.fail('nvmlDeviceGetHandleByIndex',
                      pynvml.NVML_ERROR_UNKNOWN, address='0000:df:00.0')
        agent = types.SimpleNamespace(discover=self.discover)
        rows = inventory.ListGpus(None, None).rows(agent, None)
        self.assertEqual(6, len([r for r in rows if r[0] != '-']))
        self.assertEqual(
            [('0000:52:00.0', 'unreadable: GPU is lost'),
             ('NVML GPU 7', 'unreadable: Unknown Error')],
            [r[1:3] for r in rows if r[0] == '-'])

    def test_nova_gpu_mig_commands_reach_the_gpu_by_nvml_index(self):
        # GPU 2 is lost: the listed GPU 2 is NVML's GPU 3.
        self.lib.fail('nvmlDeviceGetName', pynvml.NVML_ERROR_GPU_IS_LOST,
                      address='0000:52:00.0')
        calls = []
        agent = types.SimpleNamespace(
            discover=self.discover, manager=types.SimpleNamespace(
                create_mig=lambda *a: calls.append(('create',) + a) or 9,
                remove_mig=lambda *a: calls.append(('remove',) + a)))
        args = types.SimpleNamespace(gpu=2, profile='1g.10gb', start=0,
                                     gi_id=9)
        devices_cli.CreateMig(None, None).result(agent, args)
        devices_cli.RemoveMig(None, None).result(agent, args)
        self.assertEqual([3, 3], [c[1] for c in calls])
        self.assertEqual('0000:61:00.0', self.discover().gpus[2].address)

    def test_lost_anywhere_in_the_reading_leaves_the_gpu_out(self):
        for call in ('nvmlDeviceGetNumaNodeId', 'nvmlDeviceGetNvLinkState',
                     'nvmlDeviceGetSupportedVgpus', 'nvmlDeviceGetMigMode'):
            lib = fakenvml.hgx_h100()
            lib.fail(call, pynvml.NVML_ERROR_GPU_IS_LOST,
                     address='0000:9d:00.0')
            self.nvml = nvml.Nvml(lib=lib)
            inv = self.discover()
            self.assertEqual(['0000:9d:00.0'],
                             [u['address'] for u in inv.unreadable], call)
            self.assertEqual(7, len(inv.gpus), call)

    def test_mig_mode_unknown_is_not_taken_for_no_mig(self):
        # Not supported: a GPU without MIG. Any other answer: the GPU
        # cannot be told apart from one carved into MIG instances.
        self.lib.fail('nvmlDeviceGetMigMode', pynvml.NVML_ERROR_UNKNOWN,
                      address='0000:1b:00.0')
        inv = self.discover()
        self.assertEqual([('0000:1b:00.0', 'Unknown Error')],
                         [(u['address'], u['reason'])
                          for u in inv.unreadable])
        self.assertEqual(7, len(inv.gpus))
        lib = fakenvml.hgx_h100()
        lib.fail('nvmlDeviceGetMigMode', pynvml.NVML_ERROR_NOT_SUPPORTED)
        self.nvml = nvml.Nvml(lib=lib)
        inv = self.discover()
        self.assertEqual([], inv.unreadable)
        self.assertEqual(8, len(inv.gpus))

    def test_refinements_nvml_cannot_give_are_left_out(self):
        # NUMA node and vGPU types: reported without them, not dropped.
        for call in ('nvmlDeviceGetNumaNodeId', 'nvmlDeviceGetSupportedVgpus',
                     'nvmlVgpuTypeGetName'):
            lib = fakenvml.hgx_h100()
            lib.fail(call, pynvml.NVML_ERROR_UNKNOWN)
            self.nvml = nvml.Nvml(lib=lib)
            inv = self.discover()
            self.assertEqual([], inv.unreadable, call)
            self.assertEqual(8, len(inv.gpus), call)
        self.assertEqual({}, self.nvml.gpus()[0].supported_vgpu_types)

    def test_gpu_without_an_address_leaves_out_what_nvidia_holds(self):
        # NVML cannot even give its handle: the GPU the nvidia driver
        # holds that NVML did not list is the one; a GPU bound to
        # vfio-pci (whole-GPU passthrough, never in NVML) stays.
        self.fs.add_pci('0000:e5:00.0', '0x2330', numa_node=1,
                        driver='vfio-pci')
        self.lib.fail('nvmlDeviceGetHandleByIndex',
                      pynvml.NVML_ERROR_GPU_IS_LOST, address='0000:c3:00.0')
        inv = self.discover()
        addresses = [g.address for g in inv.gpus]
        self.assertNotIn('0000:c3:00.0', addresses)
        self.assertIn('0000:e5:00.0', addresses)
        self.assertEqual(8, len(addresses))
        self.assertEqual([{'address': None, 'nvml_index': 5,
                           'reason': 'GPU is lost'}], inv.unreadable)
        self.assertEqual(
            [('0000:c3:00.0',
              'NVML cannot give its PCI address: GPU is lost')],
            [(g['address'], g['reason']) for g in inv.report()['left_out']])

    def test_looking_a_gpu_up_past_those_nvml_cannot_read(self):
        self.lib.fail('nvmlDeviceGetPciInfo', pynvml.NVML_ERROR_GPU_IS_LOST,
                      address='0000:43:00.0')
        self.assertEqual(2, self.nvml.index_of('0000:52:00.0'))
        # It may be the one NVML cannot give the address of: not "none".
        self.assertRaises(errors.Unavailable, self.nvml.index_of,
                          '0000:43:00.0')
        err = self.assertRaises(errors.Unavailable, self.nvml.address, 1)
        self.assertIn('GPU 1: NVML cannot give its PCI address: GPU is '
                      'lost', str(err))

    def test_nvml_that_cannot_count_fails_the_discovery_by_name(self):
        self.lib.fail('nvmlDeviceGetCount',
                      pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
        err = self.assertRaises(errors.Unavailable, self.discover)
        self.assertIn('NVML cannot count the GPUs: Driver Not Loaded',
                      str(err))

    def test_mig_instances_nvml_cannot_list_are_an_agent_error(self):
        lib = fakenvml.a100_mig()
        lib.fail('nvmlGpuInstanceGetInfo', pynvml.NVML_ERROR_UNKNOWN)
        n = nvml.Nvml(lib=lib)
        err = self.assertRaises(errors.Unavailable, n.mig_instances_of, 0)
        self.assertIn('GPU 0: cannot list its MIG instances', str(err))
        gpus, unreadable = n.read_gpus()
        self.assertEqual([], gpus)
        self.assertEqual('Unknown Error', unreadable[0].reason)


class NvmlFaultsFigureTest(testtools.TestCase):
    """The reliability figure (``reliability_nvml``), small: every target
    met, with GPUs left out and the counting fault both met.
    """

    def test_nvml_faults_small(self):
        from nova_gpu.bench import reliability_nvml
        rows = reliability_nvml.run(rounds=80)
        failed = [(r.name, r.value, r.target) for r in rows if not r.ok]
        self.assertEqual([], failed)
        by_name = {r.name: r.value for r in rows}
        self.assertGreater(by_name['GPUs left out (lost or unreadable)'], 10)
        reported, failed = map(int, by_name[
            'rounds reported / failed as NVML cannot count the GPUs'
        ].split(' / '))
        self.assertEqual(80, reported + failed)


class _Libvirt:
    """libvirt's node devices, as discovery reads them."""

    def __init__(self, addresses):
        self.addresses = addresses

    def pci_devices(self):
        return [{'path': '/sys/devices/pci0000:00/' + a}
                for a in self.addresses]

    def domain_refs(self, by='name'):
        return []


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

    def test_typed_vf_leaves_only_its_type(self):
        # Equal-size mode: once a VF holds H100XM-10C (idle or not), the
        # GPU's other VFs can take no other time-sliced type, and Nova may
        # hand out the typed VF itself.
        self.fs.set_vgpu_type(self.vfs[1], 1061)
        inv = discovery.Discovery(self.sysfs, None, CATALOG).discover()
        self.assertEqual(['H100XM-10C'], inv.gpus[0].vgpu_profiles)
        self.assertEqual(['H100XM-10C'],
                         inv.report()['gpus'][0]['vgpu_types'])

    def test_untyped_vfs_take_what_the_driver_lists_not_nvml(self):
        # NVML's supported list is what the card supports, not what a VF
        # can be given now.
        inv = discovery.Discovery(self.sysfs, None, CATALOG).discover()
        record = inv.gpus[0]
        record.nvml = nvml.NvmlGpu(
            index=0, address=record.address, name='NVIDIA H100 80GB HBM3',
            memory_mib=81559,
            supported_vgpu_types={1063: 'NVIDIA H100XM-40C'})
        self.assertEqual(['H100XM-10C', 'H100XM-20C'], record.vgpu_profiles)

    def test_mixing_card_adds_creatable_to_typed(self):
        self.fs.set_vgpu_type(self.vfs[1], 1061)
        inv = discovery.Discovery(self.sysfs, None, CATALOG).discover()
        record = inv.gpus[0]
        record.model = dataclasses.replace(record.model,
                                           time_sliced_mixing=True)
        self.assertEqual(['H100XM-10C', 'H100XM-20C'], record.vgpu_profiles)

    def test_resource_class_keys_that_are_pci_addresses(self):
        # [gpu_agent] pci_resource_classes entries: the last ':' separates.
        entries = ['0000:86:00.0:CUSTOM_POOL_A', '0000:87:00.0:CUSTOM_B',
                   'H100XM-10C:B', '2330:C']
        self.assertEqual(
            {'0000:86:00.0': 'CUSTOM_POOL_A', '0000:87:00.0': 'CUSTOM_B',
             'H100XM-10C': 'B', '2330': 'C'},
            discovery.resource_class_map(entries))
        inv = discovery.Discovery(self.sysfs, None, CATALOG,
                                  resource_classes=entries).discover()
        (pool,) = inv.gpus[0].providers('h', inv.resource_classes)
        self.assertEqual('CUSTOM_POOL_A', pool['resource_class'])
        for bad, problem in ((['CUSTOM_X'], 'is not KEY:CLASS'),
                             (['2330:'], 'is not KEY:CLASS'),
                             (['2330:A', '2330:B'], 'listed twice')):
            e = self.assertRaises(ValueError,
                                  discovery.resource_class_map, bad)
            self.assertIn(problem, str(e))

    def test_parse_creatable_skips_header(self):
        self.assertEqual({557: 'NVIDIA H100-80C'}, sysfs.parse_creatable(
            'ID    : vGPU Name\n557   : NVIDIA H100-80C\n'))

    def test_bad_pci_address(self):
        self.assertRaises(errors.InvalidName, self.sysfs.pci_function,
                          '../../etc')


class TestAddressPatterns(SysfsCase):
    """'$' matches before a final newline; the patterns must not."""

    def test_trailing_newline_is_not_an_address(self):
        self.fs.add_pci('0000:3b:00.0', '0x1eb8')
        for text in ('0000:3b:00.0\n', '0000:3b:00.0\n\n',
                     '\n0000:3b:00.0', '0000:3b:00.0 '):
            self.assertIsNone(sysfs.PCI_ADDR_RE.match(text), repr(text))
            self.assertFalse(sysfs.is_pci_address(text), repr(text))
            e = self.assertRaises(errors.InvalidName,
                                  self.sysfs.pci_function, text)
            self.assertIn('not a PCI address', str(e))
        self.assertEqual('0000:3b:00.0', self.sysfs.pci_function(
            '0000:3b:00.0').address)

    def test_trailing_newline_is_not_a_uuid(self):
        uuid = '4b20d080-1b54-4048-85b3-a6a62d165c01'
        self.assertTrue(sysfs.is_uuid(uuid))
        self.assertIsNotNone(sysfs.UUID_RE.match(uuid))
        self.assertIsNone(sysfs.UUID_RE.match(uuid + '\n'))
        self.assertFalse(sysfs.is_uuid(uuid + '\n'))

    def test_nodedev_path_with_newline_is_ignored(self):
        self.assertEqual('0000:3b:00.0', discovery._nodedev_address(
            {'path': '/sys/devices/pci0000:3a/0000:3b:00.0'}))
        self.assertIsNone(discovery._nodedev_address(
            {'path': '/sys/devices/pci0000:3a/0000:3b:00.0\n'}))

    def test_check_root(self):
        self.fs.add_pci('0000:3b:00.0', '0x1eb8')
        self.sysfs.check()
        e = self.assertRaises(errors.NotFound,
                              sysfs.Sysfs('/nonexistent').check)
        self.assertIn('sysfs root /nonexistent does not exist', str(e))
        e = self.assertRaises(errors.NotFound,
                              sysfs.Sysfs(os.path.dirname(self.root)).check)
        self.assertIn('has no PCI bus', str(e))


def _providers(inv, index=0):
    return inv.report()['gpus'][index]['providers']


class TestProviders(SysfsCase):
    """Every provider Nova 34 makes for a GPU, per GPU shape."""

    def discover(self, nvml_lib=None, **kw):
        n = nvml.Nvml(lib=nvml_lib) if nvml_lib else None
        return discovery.Discovery(self.sysfs, n, CATALOG, host='cmp1',
                                   **kw).discover()

    def test_pf_mdev(self):
        self.fs.add_pci('0000:3b:00.0', '0x1eb8')
        self.fs.add_mdev_type('0000:3b:00.0', 'nvidia-222', 'GRID T4-1Q', 16)
        inv = self.discover()
        self.assertEqual([{
            'name': 'cmp1_pci_0000_3b_00_0', 'kind': report.PF_MDEV,
            'address': '0000:3b:00.0', 'resource_class': 'VGPU',
            'vgpu_type': 'T4-1Q', 'vfs': [], 'mig': None}], _providers(inv))
        data = inv.report()
        self.assertEqual('cmp1_pci_0000_3b_00_0', data['gpus'][0]['provider'])
        report.host_from_dict(data, CATALOG)

    def test_pf_mdev_type_of_existing_mdev_wins(self):
        self.fs.add_pci('0000:3b:00.0', '0x1eb8')
        self.fs.add_mdev_type('0000:3b:00.0', 'nvidia-222', 'GRID T4-1Q', 16)
        self.fs.add_mdev_type('0000:3b:00.0', 'nvidia-223', 'GRID T4-2Q', 8)
        # two types offered, none used: Nova's choice is its config
        self.assertIsNone(_providers(self.discover())[0]['vgpu_type'])
        self.fs.materialise_mdev('0000:3b:00.0', 'nvidia-223',
                                 '4b20d080-1b54-4048-85b3-a6a62d165c01')
        self.assertEqual('T4-2Q', _providers(self.discover())[0]['vgpu_type'])

    def test_vf_mdev_one_provider_per_vf(self):
        self.fs.add_pci('0000:41:00.0', '0x20b0')
        vfs = self.fs.add_mdev_vfs('0000:41:00.0', 3, {
            'nvidia-471': ('NVIDIA A100-10C', 1)})
        inv = self.discover()
        providers = _providers(inv)
        self.assertEqual(
            ['cmp1_pci_0000_41_00_4', 'cmp1_pci_0000_41_00_5',
             'cmp1_pci_0000_41_00_6'], [p['name'] for p in providers])
        self.assertEqual(vfs, [p['address'] for p in providers])
        self.assertEqual({report.VF_MDEV}, {p['kind'] for p in providers})
        self.assertEqual({'VGPU'}, {p['resource_class'] for p in providers})
        self.assertEqual({'A100-10C'}, {p['vgpu_type'] for p in providers})
        self.assertEqual([None] * 3, [p['mig'] for p in providers])
        self.assertEqual('cmp1_pci_0000_41_00_4',
                         inv.report()['gpus'][0]['provider'])
        self.assertEqual(1, len(inv.gpus))  # VFs belong to their PF

    def test_vf_mdev_type_follows_mdevs_on_the_gpu(self):
        # Every VF offers every type; the one an mdev of the GPU has is
        # the type Nova was configured with (equal-size: one per GPU).
        self.fs.add_pci('0000:41:00.0', '0x20b0')
        vfs = self.fs.add_mdev_vfs('0000:41:00.0', 2, {
            'nvidia-471': ('NVIDIA A100-10C', 1),
            'nvidia-472': ('NVIDIA A100-20C', 1)})
        self.assertEqual([None, None], [p['vgpu_type'] for p in
                                        _providers(self.discover())])
        self.fs.materialise_mdev(vfs[1], 'nvidia-472',
                                 '4b20d080-1b54-4048-85b3-a6a62d165c01')
        self.assertEqual(['A100-20C', 'A100-20C'], [
            p['vgpu_type'] for p in _providers(self.discover())])

    def test_vendor_vfio_pool(self):
        self.fs.add_pci('0000:86:00.0', '0x2330', numa_node=1)
        vfs = self.fs.add_vfs('0000:86:00.0', 3, {
            1061: 'NVIDIA H100-10C', 1062: 'NVIDIA H100-20C'})
        for vf in vfs[:2]:
            self.fs.set_vgpu_type(vf, 1062)
        inv = self.discover()
        self.assertEqual([{
            'name': 'cmp1_0000:86:00.0'.upper().replace('CMP1', 'cmp1'),
            'kind': report.PCI_POOL, 'address': '0000:86:00.0',
            'resource_class': 'CUSTOM_PCI_10DE_2330',
            'vgpu_type': 'H100-20C', 'vfs': vfs, 'mig': None}],
            _providers(inv))
        self.assertEqual('cmp1_0000:86:00.0', _providers(inv)[0]['name'])

    def test_vf_mdev_types_are_the_gpus_vgpu_types(self):
        # A real agent on an SR-IOV + mdev host: the types are on the VFs.
        self.fs.add_pci('0000:41:00.0', '0x20b0')
        self.fs.add_mdev_vfs('0000:41:00.0', 2, {
            'nvidia-471': ('NVIDIA A100-10C', 1)})
        data = self.discover().report()
        self.assertEqual(['A100-10C'], data['gpus'][0]['vgpu_types'])

    def test_vendor_vfio_typed_vf_in_use_only_when_a_domain_has_it(self):
        self.fs.add_pci('0000:86:00.0', '0x2330')
        vfs = self.fs.add_vfs('0000:86:00.0', 3, {1062: 'NVIDIA H100-20C'})
        for vf in vfs:
            self.fs.set_vgpu_type(vf, 1062)

        class Libvirt:
            def pci_devices(self):
                return [{'name': 'pci_0000_86_00_0'}]

            def domain_refs(self, by='name'):
                # Nova names its domains' UUIDs after the instances.
                return {vfs[1]: [INSTANCE if by == 'uuid'
                                 else 'instance-00000001']}

        def used(inv):
            return [d for d in inv.report()['gpus'][0]['devices']]
        # Types are preset on every VF of the pool: none is a guest yet.
        self.assertEqual([], used(self.discover()))
        inv = self.discover(libvirt=Libvirt())
        self.assertEqual([vfs[1]], [d['vf'] for d in used(inv)])
        self.assertEqual(['H100-20C'], [d['detail'] for d in used(inv)])
        # Which instance holds it: the guest's own VF, not its pool's.
        self.assertEqual([INSTANCE], [d['instance'] for d in used(inv)])

    def test_a_passed_through_gpu_is_a_whole_device_of_its_guest(self):
        self.fs.add_pci('0000:c1:00.0', '0x2335', driver='vfio-pci')

        class Libvirt:
            def pci_devices(self):
                return [{'name': 'pci_0000_c1_00_0'}]

            def domain_refs(self, by='name'):
                return {'0000:c1:00.0': [INSTANCE]}
        self.assertEqual([], self.discover().report()['gpus'][0]['devices'])
        data = self.discover(libvirt=Libvirt()).report()
        self.assertEqual([{'kind': 'whole', 'instance': INSTANCE}],
                         data['gpus'][0]['devices'])
        self.assertFalse(
            report.host_from_dict(data, CATALOG).gpus[0].is_free)

    def test_idle_mdev_is_room_not_usage(self):
        # Nova gives an mdev no guest holds to the next guest of its type:
        # only an mdev a domain refers to is reported as in use.
        self.fs.add_pci('0000:3b:00.0', '0x1eb8')
        self.fs.add_mdev_type('0000:3b:00.0', 'nvidia-223', 'GRID T4-8C', 0)
        held, idle = ('4b20d080-1b54-4048-85b3-a6a62d165c01',
                      'd1b5e0a2-7f3c-4e61-9a0b-2c8d4f6e1a37')
        for uuid in (held, idle):
            self.fs.materialise_mdev('0000:3b:00.0', 'nvidia-223', uuid)

        class Libvirt:
            def pci_devices(self):
                return [{'name': 'pci_0000_3b_00_0'}]

            def domain_refs(self, by='name'):
                return {held: ['instance-00000001']}

        def devices(inv):
            return inv.report()['gpus'][0]['devices']
        inv = self.discover(libvirt=Libvirt())
        self.assertEqual([held], [d['uuid'] for d in devices(inv)])
        self.assertEqual(1, report.host_from_dict(
            inv.report(), CATALOG).gpus[0].vgpu_room(
                CATALOG.model('T4').vgpu_profile('T4-8C')))
        # The mdevs are still known to the agent (planning, orphans).
        self.assertEqual({held, idle}, {u for u, _ in inv.gpus[0].mdevs})
        # libvirt cannot say which mdevs guests hold: all count.
        self.assertEqual({held, idle},
                         {d['uuid'] for d in devices(self.discover())})

    def test_vendor_vfio_pool_resource_class_option(self):
        self.fs.add_pci('0000:86:00.0', '0x2330')
        for vf in self.fs.add_vfs('0000:86:00.0', 2,
                                  {1062: 'NVIDIA H100-20C'}):
            self.fs.set_vgpu_type(vf, 1062)
        for key in ('0000:86:00.0', 'H100-20C', '2330'):
            inv = self.discover(resource_classes={key: 'h100-20c'})
            self.assertEqual('CUSTOM_H100_20C',
                             _providers(inv)[0]['resource_class'], key)
        inv = self.discover(resource_classes={'H100-10C': 'CUSTOM_OTHER'})
        self.assertEqual('CUSTOM_PCI_10DE_2330',
                         _providers(inv)[0]['resource_class'])

    def test_vendor_vfio_pool_mixed_types_has_no_type(self):
        self.fs.add_pci('0000:86:00.0', '0x2330')
        vfs = self.fs.add_vfs('0000:86:00.0', 2, {
            1061: 'NVIDIA H100-10C', 1062: 'NVIDIA H100-20C'})
        self.fs.set_vgpu_type(vfs[0], 1061)
        self.fs.set_vgpu_type(vfs[1], 1062)
        self.assertIsNone(_providers(self.discover())[0]['vgpu_type'])

    def test_vendor_vfio_type_name_from_nvml(self):
        # The VF of a type no longer lists it as creatable; NVML names it.
        self.fs.add_pci('0000:1b:00.0', '0x2330')
        vf = self.fs.add_vfs('0000:1b:00.0', 1, {})[0]
        self.fs.set_vgpu_type(vf, 1062)
        inv = self.discover(nvml_lib=fakenvml.hgx_h100())
        self.assertEqual('H100XM-20C', _providers(inv)[0]['vgpu_type'])

    def test_mig_backed_vf_has_no_slot_nvml_cannot_tell(self):
        self.fs.add_pci('0000:07:00.0', '0x20b0')
        vf = self.fs.add_vfs('0000:07:00.0', 1,
                             {1070: 'NVIDIA A100-2-10C'})[0]
        self.fs.set_vgpu_type(vf, 1070)
        inv = self.discover(nvml_lib=fakenvml.a100_mig())
        provider = _providers(inv)[0]
        self.assertEqual('A100-2-10C', provider['vgpu_type'])
        self.assertIsNone(provider['mig'])
        self.assertIn('NVML', discovery.MIG_SLOT_UNKNOWN)

    def test_whole_gpu_passthrough(self):
        self.fs.add_pci('0000:5e:00.0', '0x26b9', driver='vfio-pci')
        inv = self.discover()
        self.assertEqual([{
            'name': 'cmp1_0000:5E:00.0', 'kind': report.PCI_DEVICE,
            'address': '0000:5e:00.0',
            'resource_class': 'CUSTOM_PCI_10DE_26B9', 'vgpu_type': None,
            'vfs': [], 'mig': None}], _providers(inv))

    def test_gpu_nova_cannot_use_has_no_provider(self):
        self.fs.add_pci('0000:5e:00.0', '0x26b9', driver='nvidia')
        inv = self.discover()
        self.assertEqual([], _providers(inv))
        self.assertIsNone(inv.report()['gpus'][0]['provider'])

    def test_mixed_host(self):
        self.fs.add_pci('0000:3b:00.0', '0x1eb8')
        self.fs.add_mdev_type('0000:3b:00.0', 'nvidia-222', 'GRID T4-1Q', 16)
        self.fs.add_pci('0000:41:00.0', '0x20b0')
        self.fs.add_mdev_vfs('0000:41:00.0', 2,
                             {'nvidia-471': ('NVIDIA A100-10C', 1)})
        self.fs.add_pci('0000:86:00.0', '0x2330')
        self.fs.add_vfs('0000:86:00.0', 2, {1062: 'NVIDIA H100-20C'})
        self.fs.add_pci('0000:c1:00.0', '0x26b9', driver='vfio-pci')
        data = self.discover().report()
        self.assertEqual(
            [[report.PF_MDEV], [report.VF_MDEV] * 2, [report.PCI_POOL],
             [report.PCI_DEVICE]],
            [[p['kind'] for p in g['providers']] for g in data['gpus']])
        names = [p['name'] for g in data['gpus'] for p in g['providers']]
        self.assertEqual(len(names), len(set(names)))
        for g in data['gpus']:
            self.assertEqual(g['providers'][0]['name'], g['provider'])
            for p in g['providers']:
                self.assertIn(p['kind'], report.PROVIDER_KINDS)
