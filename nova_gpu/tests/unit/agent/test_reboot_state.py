"""What a reboot loses, made again by the restore at boot: SR-IOV VFs,
VF vGPU types and MIG mode (fake sysfs, faked NVML), and MIG mode
switching by the carver and the planning loop.
"""

import fixtures
import pynvml
import testtools

from nova_gpu.agent import carver as carver_mod
from nova_gpu.agent import devices
from nova_gpu.agent import discovery
from nova_gpu.agent import errors
from nova_gpu.agent import journal as journal_mod
from nova_gpu.agent import nvml
from nova_gpu.agent import planning
from nova_gpu.agent import privsep
from nova_gpu.agent import reconcile
from nova_gpu.agent import restore
from nova_gpu.agent import sriov
from nova_gpu.agent import sysfs
from nova_gpu.agent import vf_types
from nova_gpu.core import catalog
from nova_gpu.core import layout as L
from nova_gpu.core import notification
from nova_gpu.tests.unit.agent import fakenvml
from nova_gpu.tests.unit.agent import fakesys

CATALOG = catalog.load_catalog()
A100 = CATALOG.model('A100-40GB')
PF = '0000:86:00.0'
TYPES = {1061: 'NVIDIA H100-10C', 1062: 'NVIDIA H100-20C'}


class FakeLibvirt:
    def __init__(self, refs=None):
        self.refs = dict(refs or {})

    def domain_refs(self):
        return dict(self.refs)

    def mdevs(self):
        return {}


def numvfs(fs, pf):
    with open(fs.path(fs.dev_rel(pf), 'sriov_numvfs')) as f:
        return int(f.read())


def reboot_sysfs(fs, pf, vfs):
    """What a reboot leaves: no VFs enabled, no VF typed."""
    with open(fs.path(fs.dev_rel(pf), 'sriov_numvfs'), 'w') as f:
        f.write('0\n')
    for vf in vfs:
        fs.set_vgpu_type(vf, 0)


class _VfHostCase(testtools.TestCase):
    """A fake sysfs with one H100 PF and ``VFS`` vendor-VFIO VFs."""

    VFS = 3

    def setUp(self):
        super().setUp()
        privsep.use_in_process()
        self.root = self.useFixture(fixtures.TempDir()).path
        self.state = self.useFixture(fixtures.TempDir()).path
        self.fs = fakesys.FakeSysfs(self.root)
        self.fs.add_pci(PF, '0x2330')
        self.vfs = self.fs.add_vfs(PF, self.VFS, TYPES)


class SriovTest(_VfHostCase):

    VFS = 4

    def setUp(self):
        super().setUp()
        self.sysfs = sysfs.Sysfs(self.root)
        self.manager = devices.DeviceManager(self.sysfs)

    def store(self, boot='boot-1'):
        return sriov.SriovStore(self.state, boot_id=boot)

    def test_privsep_writes_sriov_numvfs_only_from_zero(self):
        reboot_sysfs(self.fs, PF, self.vfs)
        self.assertTrue(privsep.enable_sriov_vfs(self.root, PF, 4))
        self.assertEqual(4, numvfs(self.fs, PF))
        self.assertFalse(privsep.enable_sriov_vfs(self.root, PF, 4))
        e = self.assertRaises(PermissionError, privsep.enable_sriov_vfs,
                              self.root, PF, 2)
        self.assertIn('has 4 VFs enabled, not 2', str(e))
        for bad in (0, -1, True, '4', 2 ** 16):
            self.assertRaises(ValueError, privsep.enable_sriov_vfs,
                              self.root, PF, bad)
        reboot_sysfs(self.fs, PF, self.vfs)
        e = self.assertRaises(ValueError, privsep.enable_sriov_vfs,
                              self.root, PF, 5)
        self.assertIn('supports 4 VFs, not 5', str(e))
        self.assertRaises(ValueError, privsep.enable_sriov_vfs, self.root,
                          '0000:86:00.0/../x', 4)
        # a VF is no PF: no sriov_totalvfs
        self.assertRaises(FileNotFoundError, privsep.enable_sriov_vfs,
                          self.root, self.vfs[0], 1)

    def test_observed_only_after_the_restore_of_this_boot(self):
        store = self.store()
        self.assertFalse(store.observe(self.sysfs))
        self.assertEqual({}, store.pfs())
        store.restored()
        self.assertTrue(store.observe(self.sysfs))
        self.assertEqual({PF: 4}, store.pfs())
        # A reboot: the zeros are not recorded before the restore ran.
        reboot_sysfs(self.fs, PF, self.vfs)
        after = self.store(boot='boot-2')
        self.assertFalse(after.observe(self.sysfs))
        self.assertEqual({PF: 4}, after.pfs())
        # The restore enables them again, before nova-compute.
        enabled, dropped, failed = sriov.restore_vfs(self.manager, after)
        self.assertEqual(([PF], [], []), (enabled, dropped, failed))
        self.assertEqual(4, numvfs(self.fs, PF))
        # Disabled by hand afterwards (sriov-manage -d): forgotten.
        reboot_sysfs(self.fs, PF, self.vfs)
        self.assertTrue(after.observe(self.sysfs))
        self.assertEqual({}, after.pfs())

    def test_restore_names_the_vfs_it_enables_and_the_restart(self):
        store = self.store()
        store.set(PF, 4)
        reboot_sysfs(self.fs, PF, self.vfs)
        log = self.useFixture(fixtures.FakeLogger())
        self.assertEqual(([PF], [], []),
                         sriov.restore_vfs(self.manager, store))
        self.assertIn('SR-IOV VFs enabled: %s (%s)' % (
            PF, ', '.join(self.vfs)), log.output)
        self.assertIn('if it is running, restart it', log.output)

    def test_missing_vfs_are_named_never_enabled(self):
        # The agent at its start: nova-compute may run, and takes the
        # host's PCI devices only when it starts (Nova 34
        # ResourceTracker._setup_pci_tracker): VFs enabled now would not
        # be Nova's. Nothing is written; the PF is named, the record kept.
        store = self.store()
        store.set(PF, 4)
        reboot_sysfs(self.fs, PF, self.vfs)
        enable = self.useFixture(fixtures.MockPatch(
            'nova_gpu.agent.privsep.enable_sriov_vfs')).mock
        log = self.useFixture(fixtures.FakeLogger())
        missing, dropped = sriov.missing_vfs(self.manager, self.store())
        enable.assert_not_called()
        self.assertEqual(0, numvfs(self.fs, PF))
        self.assertEqual([], dropped)
        (why,) = missing
        self.assertTrue(why.startswith(PF + ': 4 VFs recorded, 0 enabled'),
                        why)
        self.assertIn('run nova-gpu-restore, then restart nova-compute', why)
        self.assertIn('ResourceTracker._setup_pci_tracker', why)
        self.assertIn('SR-IOV VFs missing on PF ' + why, log.output)
        # The record is kept for nova-gpu-restore, the zeros not recorded.
        self.assertFalse(self.store().observe(self.sysfs))
        self.assertEqual({PF: 4}, self.store().pfs())
        # Once the VFs are there (nova-gpu-restore ran) nothing is
        # missing and the record follows the host again.
        with open(self.fs.path(self.fs.dev_rel(PF), 'sriov_numvfs'),
                  'w') as f:
            f.write('4\n')
        self.assertEqual(([], []), sriov.missing_vfs(self.manager,
                                                     self.store()))
        reboot_sysfs(self.fs, PF, self.vfs)
        self.assertTrue(self.store().observe(self.sysfs))
        self.assertEqual({}, self.store().pfs())

    def test_a_pf_that_failed_keeps_its_record_a_gone_one_is_dropped(self):
        store = self.store()
        store.set(PF, 4)
        store.set('0000:99:00.0', 2)
        reboot_sysfs(self.fs, PF, self.vfs)
        self.useFixture(fixtures.MockPatch(
            'nova_gpu.agent.privsep.enable_sriov_vfs',
            side_effect=OSError(16, 'Device or resource busy')))
        enabled, dropped, failed = sriov.restore_vfs(self.manager, store)
        self.assertEqual([], enabled)
        self.assertEqual(['0000:99:00.0'], dropped)
        self.assertIn(PF, failed[0])
        self.assertFalse(store.observe(self.sysfs))
        self.assertEqual({PF: 4}, store.pfs())


class VfTypesTest(_VfHostCase):

    def setUp(self):
        super().setUp()
        self.libvirt = FakeLibvirt()
        self.types = vf_types.VfTypes(self.state)
        self.manager = devices.DeviceManager(
            sysfs.Sysfs(self.root), libvirt=self.libvirt,
            journal=journal_mod.Journal.in_dir(self.state),
            vf_types=self.types)

    def current(self):
        return [self.manager.sysfs.pci_function(v).current_vgpu_type
                for v in self.vfs]

    def test_hook_api_and_bad_input(self):
        vf_types.record(self.state, self.vfs[0], 1061)
        vf_types.record(self.state, self.vfs[1], 1062)
        vf_types.forget(self.state, self.vfs[1])
        self.assertEqual({self.vfs[0]: 1061}, self.types.load())
        self.assertRaises(ValueError, vf_types.record, self.state,
                          '0000:86:00.4\n', 1061)
        self.assertRaises(ValueError, vf_types.record, self.state,
                          self.vfs[0], 0)

    def test_referenced_vfs_typed_again_the_rest_dropped(self):
        vf_types.record(self.state, self.vfs[0], 1061)
        vf_types.record(self.state, self.vfs[1], 1061)
        vf_types.record(self.state, self.vfs[2], 1062)
        reboot_sysfs(self.fs, PF, self.vfs)
        self.fs.set_vgpu_type(self.vfs[2], 1061)  # someone else's now
        self.libvirt.refs = {self.vfs[0]: ['instance-1'],
                             self.vfs[2]: ['instance-3']}
        done, dropped, failed = vf_types.restore_types(
            self.manager, self.types, self.libvirt.domain_refs())
        self.assertEqual([self.vfs[0]], done)
        self.assertEqual([self.vfs[1]], dropped)
        self.assertIn('has vGPU type 1061, not the 1062', failed[0])
        self.assertEqual([1061, 0, 1061], self.current())
        self.assertEqual({self.vfs[0]: 1061, self.vfs[2]: 1062},
                         self.types.load())
        self.assertEqual({}, self.manager.journal.intents())

    def test_the_agent_records_what_it_sets_and_clears(self):
        vf = self.manager.create_vf_vgpu(PF, 1061)
        self.assertEqual({vf: 1061}, self.types.load())
        self.manager.remove_vf_vgpu(vf)
        self.assertEqual({}, self.types.load())


def a100(mig=False, **kw):
    gpu = fakenvml.FakeGpu('00000000:07:00.0', 'NVIDIA A100-SXM4-40GB',
                           40960, mig=mig)
    for k, v in kw.items():
        setattr(gpu, k, v)
    return fakenvml.FakePynvml([gpu])


class MigModeTest(testtools.TestCase):

    def setUp(self):
        super().setUp()
        self.state = self.useFixture(fixtures.TempDir()).path
        root = self.useFixture(fixtures.TempDir()).path
        fakesys.FakeSysfs(root)
        self.lib = a100()
        self.libvirt = FakeLibvirt()
        self.manager = devices.DeviceManager(
            sysfs.Sysfs(root), libvirt=self.libvirt,
            nvml=nvml.Nvml(lib=self.lib),
            journal=journal_mod.Journal.in_dir(self.state))
        self.carver = carver_mod.Carver(
            self.manager, carver_mod.LayoutStore(self.state),
            mig_modes=carver_mod.MigModeStore(self.state),
            switch_mig_mode=True)

    def test_nvml_current_and_pending(self):
        n = self.manager.nvml
        self.assertEqual((False, False), n.mig_mode(0))
        self.assertEqual((True, True), n.set_mig_mode(0, True))
        self.lib.gpus[0].needs_reset = True
        self.assertEqual((True, False), n.set_mig_mode(0, False))
        self.assertIs(False, n.gpus()[0].mig_pending)
        self.lib.gpus[0].mig_capable = False
        self.assertIsNone(n.mig_mode(0))

    def test_switch_refused_when_not_idle(self):
        self.manager.set_mig_mode(0, True)
        self.lib.add_gi(self.lib.gpus[0],
                        pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE, 6)
        e = self.assertRaises(errors.InUse, self.manager.set_mig_mode, 0,
                              False)
        self.assertIn('holds MIG GPU instance(s)', str(e))
        self.lib.gpus[0].gis.clear()
        self.libvirt.refs = {'0000:07:00.0': ['instance-9']}
        e = self.assertRaises(errors.InUse, self.manager.set_mig_mode, 0,
                              False)
        self.assertIn('instance-9', str(e))
        self.manager.libvirt = None
        self.assertRaises(errors.Unavailable, self.manager.set_mig_mode, 0,
                          False)
        self.assertEqual((True, True), self.manager.nvml.mig_mode(0))
        self.assertEqual({}, self.manager.journal.intents())

    def test_pending_reset_is_reported_not_silent(self):
        self.lib.gpus[0].needs_reset = True
        e = self.assertRaises(errors.ResetRequired, self.carver.apply, 0,
                              A100, L.Layout(L.MIG, instances=(
                                  ('7g.40gb', 0, None),)))
        self.assertIn('pending', str(e))
        self.assertIn('nvidia-smi -i 0 -r', str(e))
        self.assertEqual({}, self.carver.store.load())
        self.assertEqual({'0000:07:00.0': True},
                         self.carver.mig_modes.load())
        self.lib.reset_gpu(self.lib.gpus[0])
        self.carver.apply(0, A100, L.Layout(L.MIG, instances=(
            ('7g.40gb', 0, None),)))
        self.assertEqual([('7g.40gb', 0)],
                         sorted(self.carver.mig_state(0, A100)))

    def test_carver_switches_in_and_out_of_mig_mode(self):
        mig = L.Layout(L.MIG, instances=(('3g.20gb', 0, None),
                                         ('3g.20gb', 4, None)))
        self.carver.apply(0, A100, mig)
        self.assertTrue(self.manager.nvml.mig_enabled(0))
        self.assertEqual(2, len(self.carver.mig_state(0, A100)))
        # a guest on one instance: switching out is refused, nothing lost
        gi = self.carver.mig_state(0, A100)[('3g.20gb', 4)]
        vgpu = self.lib.start_vgpu_on(self.lib.gpus[0], gi)
        self.assertRaises(errors.InUse, self.carver.apply, 0, A100,
                          L.Layout(L.PASSTHROUGH))
        self.assertTrue(self.manager.nvml.mig_enabled(0))
        self.assertEqual(2, len(self.carver.mig_state(0, A100)))
        del self.lib.gpus[0].vgpus[vgpu]
        self.carver.apply(0, A100, L.Layout(L.PASSTHROUGH))
        self.assertFalse(self.manager.nvml.mig_enabled(0))
        self.assertEqual({'0000:07:00.0': False},
                         self.carver.mig_modes.load())
        self.assertEqual({}, self.manager.journal.intents())

    def test_without_the_option_the_mode_is_kept(self):
        self.carver.switch_mig_mode = False
        e = self.assertRaises(errors.AgentError, self.carver.apply, 0, A100,
                              L.Layout(L.MIG, instances=(
                                  ('7g.40gb', 0, None),)))
        self.assertIn('carve_switch_mig_mode', str(e))
        self.assertNotIn('set_mig_mode', [c[0] for c in self.lib.calls])

    def test_a_lost_gpu_has_no_mig_mode_to_tell(self):
        # Not "no MIG mode": a cut-short switch on it stays in the
        # journal until NVML can read the GPU again.
        journal = self.manager.journal
        key = journal.begin('mig_mode', gpu='0000:07:00.0', enabled=True,
                            previous=False)
        journal.release(key)
        self.lib.fail('nvmlDeviceGetMigMode', pynvml.NVML_ERROR_GPU_IS_LOST)
        n = self.manager.nvml
        err = self.assertRaises(errors.Unavailable, n.mig_mode, 0)
        self.assertIn('GPU 0: NVML cannot read its MIG mode: GPU is lost',
                      str(err))
        self.assertRaises(errors.Unavailable, n.mig_enabled, 0)
        result = reconcile.Reconciler(self.manager).run()
        self.assertEqual([], result.rolled_back)
        self.assertEqual(1, len(journal.intents()))

    def test_a_cut_short_switch_is_set_back(self):
        journal = self.manager.journal
        key = journal.begin('mig_mode', gpu='0000:07:00.0', enabled=True,
                            previous=False)
        self.manager.nvml.set_mig_mode(0, True)  # then killed
        journal.release(key)
        result = reconcile.Reconciler(self.manager).run()
        self.assertEqual(['0000:07:00.0/mig-mode'], result.rolled_back)
        self.assertEqual((False, False), self.manager.nvml.mig_mode(0))
        self.assertEqual({}, journal.intents())


class RestoreAllTest(_VfHostCase):
    """A reboot of a host with VFs, VF types, MIG mode and a layout."""

    VFS = 2

    def setUp(self):
        super().setUp()
        # the A100 of the fake NVML, with VFs of MIG-backed types
        self.fs.add_pci('0000:07:00.0', '0x20b0')
        self.a100_vfs = self.fs.add_vfs('0000:07:00.0', 2,
                                        {700: 'NVIDIA A100X-3-20C'})

    def agent_parts(self, lib, refs):
        manager = devices.DeviceManager(
            sysfs.Sysfs(self.root), libvirt=FakeLibvirt(refs),
            nvml=nvml.Nvml(lib=lib),
            journal=journal_mod.Journal.in_dir(self.state))
        carver = carver_mod.Carver(
            manager, carver_mod.LayoutStore(self.state),
            mig_modes=carver_mod.MigModeStore(self.state))
        return carver, sriov.SriovStore(self.state, boot_id='b2'), \
            vf_types.VfTypes(self.state)

    def test_everything_made_again_in_order(self):
        # Before the reboot: the agent set MIG mode and carved the A100,
        # the PF had 2 VFs, a guest's VF had type 1062.
        carver_mod.MigModeStore(self.state).set('0000:07:00.0', True)
        carver_mod.LayoutStore(self.state).set(
            '0000:07:00.0', L.Layout(L.MIG, instances=(
                ('4g.20gb', 0, None), ('3g.20gb', 4, None))))
        sriov.SriovStore(self.state, boot_id='b1').set(PF, 2)
        vf_types.record(self.state, self.vfs[1], 1062)
        vf_types.record(self.state, self.vfs[0], 1061)
        # After it: MIG mode lost (Hopper and later do not keep it), no
        # GPU instance, no VF, no type; only vfs[1]'s domain is defined.
        lib = a100(mig=False)
        reboot_sysfs(self.fs, PF, self.vfs)
        # the A100's guest is defined (not running): it needs the mode
        carver, store, types = self.agent_parts(
            lib, {self.vfs[1]: ['instance-2'],
                  self.a100_vfs[0]: ['instance-5']})
        # as nova-gpu-restore does, before nova-compute starts
        result = restore.restore(carver, CATALOG, sriov=store,
                                 vf_types=types, enable_vfs=True)
        self.assertEqual([], result.failed)
        self.assertEqual(['0000:07:00.0'], result.mig_modes)
        self.assertEqual([PF], result.vfs_enabled)
        self.assertEqual(['0000:07:00.0'], result.restored)
        self.assertEqual([self.vfs[1]], result.vf_types)
        self.assertEqual([self.vfs[0]], result.vf_types_dropped)
        self.assertEqual(2, numvfs(self.fs, PF))
        self.assertEqual(
            [0, 1062], [carver.manager.sysfs.pci_function(v)
                        .current_vgpu_type for v in self.vfs])
        self.assertEqual([('3g.20gb', 4), ('4g.20gb', 0)],
                         sorted(carver.mig_state(0, A100)))
        # MIG mode first, then the instances.
        ops = [c[0] for c in lib.calls]
        self.assertLess(ops.index('set_mig_mode'), ops.index('create_gi'))
        # Run again: nothing more to do.
        again = restore.restore(carver, CATALOG, sriov=store,
                                vf_types=types, enable_vfs=True)
        self.assertEqual(([], [], []), (again.mig_modes, again.vfs_enabled,
                                        again.vf_types))

    def test_a_gpu_lost_at_boot_keeps_its_mode_and_layout(self):
        # The A100 fell off the bus: nothing is made, nothing is dropped,
        # and the next restore (after a reset) makes them.
        carver_mod.MigModeStore(self.state).set('0000:07:00.0', True)
        layout = L.Layout(L.MIG, instances=(('7g.40gb', 0, None),))
        carver_mod.LayoutStore(self.state).set('0000:07:00.0', layout)
        lib = a100(mig=False)
        lib.lose('0000:07:00.0')
        carver, store, types = self.agent_parts(lib, {})
        result = restore.restore(carver, CATALOG)
        self.assertEqual(([], [], []), (result.restored, result.dropped,
                                        result.mig_modes))
        self.assertEqual(2, len(result.failed), result.failed)
        self.assertIn('GPU is lost', result.failed[0])
        self.assertEqual({'0000:07:00.0': True},
                         carver_mod.MigModeStore(self.state).load())
        self.assertEqual({'0000:07:00.0': layout},
                         carver_mod.LayoutStore(self.state).load())
        carver, store, types = self.agent_parts(a100(mig=False), {})
        result = restore.restore(carver, CATALOG)
        self.assertEqual(['0000:07:00.0'], result.restored, result.failed)
        self.assertEqual(['0000:07:00.0'], result.mig_modes)

    def test_a_gpu_nvml_cannot_name_keeps_its_layout(self):
        # Only its name cannot be read: still not "no longer fits".
        layout = L.Layout(L.MIG, instances=(('7g.40gb', 0, None),))
        carver_mod.LayoutStore(self.state).set('0000:07:00.0', layout)
        lib = a100(mig=True)
        lib.fail('nvmlDeviceGetName', pynvml.NVML_ERROR_UNKNOWN)
        carver, store, types = self.agent_parts(lib, {})
        result = restore.restore(carver, CATALOG)
        self.assertEqual(([], []), (result.restored, result.dropped))
        self.assertIn('GPU 0 cannot be read through NVML: Unknown Error',
                      result.failed[0])
        self.assertEqual({'0000:07:00.0': layout},
                         carver_mod.LayoutStore(self.state).load())

    def test_a_stored_mig_layout_brings_its_mode_back(self):
        carver_mod.LayoutStore(self.state).set(
            '0000:07:00.0', L.Layout(L.MIG, instances=(
                ('7g.40gb', 0, None),)))
        carver, store, types = self.agent_parts(a100(mig=False), {})
        result = restore.restore(carver, CATALOG)
        self.assertEqual(['0000:07:00.0'], result.restored, result.failed)
        self.assertTrue(carver.manager.nvml.mig_enabled(0))


def idle_a100s():
    gpus = [fakenvml.FakeGpu('00000000:%s:00.0' % bus,
                             'NVIDIA A100-SXM4-40GB', 40960, mig=False)
            for bus in ('07', '0f')]
    return fakenvml.FakePynvml(gpus)


class PlanningSwitchTest(testtools.TestCase):

    def setUp(self):
        super().setUp()
        self.state = self.useFixture(fixtures.TempDir()).path
        self.lib = idle_a100s()
        self.nvml = nvml.Nvml(lib=self.lib)
        self.libvirt = FakeLibvirt()
        self.manager = devices.DeviceManager(None, libvirt=self.libvirt,
                                             nvml=self.nvml)
        self.carver = carver_mod.Carver(
            self.manager, carver_mod.LayoutStore(self.state),
            mig_modes=carver_mod.MigModeStore(self.state))
        self.source = planning.DemandSource()
        self.source.update(notification.DemandPayload(
            items=[[{'kind': 'mig', 'profile': '1g.5gb'}, 1.0]],
            publisher='s', version=1, requests=10))
        self.loop = planning.PlanningLoop(self.carver, self.source, 'cmp1',
                                          min_hold=0, libvirt=self.libvirt)

    def inventory(self):
        return discovery.Discovery(sysfs.Sysfs('/nonexistent'), self.nvml,
                                   CATALOG, host='cmp1').discover()

    def test_mig_layouts_offered_to_idle_gpus_only_when_allowed(self):
        result = self.loop.run(self.inventory())
        self.assertEqual([], [c for c in self.lib.calls
                              if c[0] == 'set_mig_mode'])
        self.assertFalse(any(
            lay.kind == L.MIG for lay in self.carver.store.load().values()),
            result)
        self.carver.switch_mig_mode = True
        result = self.loop.run(self.inventory())
        self.assertEqual([0, 1], sorted(result['changed']), result)
        for index in (0, 1):
            self.assertTrue(self.nvml.mig_enabled(index))
            self.assertEqual(7, len(self.carver.mig_state(index, A100)))

    def test_a_pending_switch_is_reported(self):
        self.carver.switch_mig_mode = True
        self.lib.gpus[1].needs_reset = True
        result = self.loop.run(self.inventory())
        self.assertIn('pending', result['failed'][1])
        result = self.loop.run(self.inventory())
        self.assertIn('MIG mode enable is pending a GPU reset',
                      result['decisions'][1])
        self.assertEqual(7, len(self.carver.mig_state(0, A100)))


class AgentCycleTest(testtools.TestCase):
    """The agent records the VFs each cycle and restores at start."""

    def setUp(self):
        super().setUp()
        from oslo_config import cfg
        from oslo_config import fixture as config_fixture

        import nova_gpu.conf  # noqa: F401 - registers the options
        privsep.use_in_process()
        root = self.useFixture(fixtures.TempDir()).path
        self.state = self.useFixture(fixtures.TempDir()).path
        self.fs = fakesys.FakeSysfs(root)
        self.fs.add_pci(PF, '0x2330')
        self.vfs = self.fs.add_vfs(PF, 3, TYPES)
        conf = self.useFixture(config_fixture.Config(cfg.CONF)).conf
        for name, value in (('sysfs_root', root), ('state_dir', self.state),
                            ('use_nvml', False),
                            ('libvirt_uri', 'test:///default'),
                            ('provider_config_file', ''),
                            ('placement_cloud', None)):
            conf.set_override(name, value, 'gpu_agent')
        self.conf = conf
        self.useFixture(fixtures.MockPatch(
            'nova_gpu.agent.sriov.current_boot_id', return_value='boot-a'))

    def agent(self, nvml_lib=None):
        from nova_gpu.agent import agent as agent_mod
        if nvml_lib is not None:
            self.conf.set_override('use_nvml', True, 'gpu_agent')
        agent = agent_mod.Agent(self.conf, nvml_lib=nvml_lib)
        self.addCleanup(agent.close)
        return agent

    def test_cycle_records_restore_enables_after_a_reboot(self):
        agent = self.agent()
        agent.restore_layouts()   # at start: nothing recorded yet
        agent.cycle()
        self.assertEqual({PF: 3}, agent.sriov.pfs())
        reboot_sysfs(self.fs, PF, self.vfs)
        self.useFixture(fixtures.MockPatch(
            'nova_gpu.agent.sriov.current_boot_id', return_value='boot-b'))
        agent = self.agent()
        agent.cycle()             # before the restore: record kept
        self.assertEqual({PF: 3}, agent.sriov.pfs())
        # The agent at its start (nova-compute may run) enables no VF: it
        # names the PF and leaves the VFs to nova-gpu-restore.
        result = agent.restore_layouts()
        self.assertEqual([], result.vfs_enabled)
        (why,) = result.vfs_not_enabled
        self.assertIn(PF + ': 3 VFs recorded, 0 enabled', why)
        self.assertIn(why, result.failed)
        self.assertEqual(0, numvfs(self.fs, PF))
        agent.cycle()
        self.assertEqual({PF: 3}, agent.sriov.pfs())
        # nova-gpu-restore (before nova-compute) enables them.
        result = restore.boot_restore(agent)
        self.assertEqual([PF], result.vfs_enabled)
        self.assertEqual([], result.vfs_not_enabled)
        self.assertEqual(3, numvfs(self.fs, PF))

    def test_a_killed_mig_mode_restore_is_not_undone_after_restart(self):
        """nova-gpu-restore killed in the middle of switching MIG mode
        back on: at the next run the switch is rolled back *before* the
        restore makes it again, not after.
        """
        carver_mod.MigModeStore(self.state).set('0000:07:00.0', True)
        lib = a100(mig=False)
        journal = journal_mod.Journal.in_dir(self.state)
        key = journal.begin('mig_mode', gpu='0000:07:00.0', enabled=True,
                            previous=False)
        lib.gpus[0].mig = True   # the switch happened, then the kill
        journal.release(key)
        agent = self.agent(nvml_lib=lib)
        result = agent.restore_layouts()
        self.assertEqual([], result.failed)
        agent.reconcile()        # as nova-gpu-restore does next
        self.assertEqual((True, True), agent.nvml.mig_mode(0))
        self.assertEqual({}, agent.journal.intents())
