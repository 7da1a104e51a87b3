"""A carve or a restore killed at every step leaves nothing half-made.

Real libvirtd + mdevctl on the fake-sysfs harness (``fakehost``), NVML
faked with its state in a file (as the driver keeps GPU instances across
a process's death). A worker process re-carves an A100 from layout OLD to
NEW and SIGKILLs itself before its k-th NVML change, for every k; a new
agent then reconciles and restores, as at a restart. Counted: GPU
instances without a compute instance (half-made), instances in neither
layout (leaked), a change to the instance a guest uses (touched), and
intents left in the journal. The restore at boot is killed the same way
on a GPU a reboot emptied, and on a host a reboot left with neither the
MIG mode the agent had set nor the PF's SR-IOV VFs.
"""

import os
import signal

import fixtures
import testtools

from nova_gpu.agent import carver as carver_mod
from nova_gpu.agent import privsep
from nova_gpu.agent import restore
from nova_gpu.agent import sriov
from nova_gpu.bench import reliability_agent as rel
from nova_gpu.core import catalog
from nova_gpu.core import layout as L
from nova_gpu.tests.functional.agent import fakehost

CATALOG = catalog.load_catalog()
A100 = CATALOG.model('A100-40GB')
OLD = L.Layout(L.MIG, instances=(('3g.20gb', 0, 'A100X-3-20C'),
                                 ('1g.5gb', 4, None), ('1g.5gb', 5, None)))
NEW = L.Layout(L.MIG, instances=(('3g.20gb', 0, 'A100X-3-20C'),
                                 ('2g.10gb', 4, None), ('1g.5gb', 6, None)))
# NVML calls that change the GPU: the step boundaries of a carve.
MUTATIONS = ('nvmlDeviceCreateGpuInstanceWithPlacement',
             'nvmlGpuInstanceCreateComputeInstance',
             'nvmlComputeInstanceDestroy', 'nvmlGpuInstanceDestroy')
STEPS = 8  # two removes and two creates, two NVML changes each


def _killing(lib, at):
    """Make ``lib`` SIGKILL its process before its ``at``-th change."""
    count = [0]
    for name in MUTATIONS:
        real = getattr(lib, name)

        def wrapped(*args, _real=real):
            if count[0] == at:
                os.kill(os.getpid(), signal.SIGKILL)
            count[0] += 1
            return _real(*args)
        setattr(lib, name, wrapped)
    return count


class TestCarveKilledAtEveryStep(testtools.TestCase):

    def setUp(self):
        super().setUp()
        self.host = self.useFixture(fakehost.FakeHost(rel.build_host))
        self.args = (self.host.uri, self.host.fs.root,
                     os.path.join(self.host.dir, 'state'),
                     os.path.join(self.host.dir, 'nvml.json'))
        rig = self.rig()
        store = carver_mod.LayoutStore(self.args[2])
        carver_mod.Carver(rig.manager, store).apply(0, A100, OLD)
        self.address = rig.nvml.address(0)
        self.in_use = carver_mod.Carver(rig.manager, store).mig_state(
            0, A100)[('3g.20gb', 0)]
        rig.lib.start_vgpu_on(rig.lib.gpus[0], self.in_use)

    def rig(self):
        rig = rel.Rig(*self.args)
        self.addCleanup(rig.close)
        return rig

    def carve_and_die(self, at, work=None):
        pid = os.fork()
        if pid == 0:  # the worker: never returns
            code = 3
            try:
                rel.own_logging_locks()  # see the function: a fork's locks
                rig = rel.Rig(*self.args)
                _killing(rig.lib, at)
                carver = carver_mod.Carver(rig.manager, carver_mod.LayoutStore(
                    self.args[2]))
                if work is None:
                    carver.apply(0, A100, NEW)
                else:
                    work(carver)
                code = 0
            except BaseException:
                code = 2
            finally:
                os._exit(code)
        _pid, status = os.waitpid(pid, 0)
        return status

    def restart(self):
        """A new agent: reconcile, then restore the stored layouts."""
        rig = self.rig()
        reconciled = rig.reconciler().run()
        carver = carver_mod.Carver(rig.manager,
                                   carver_mod.LayoutStore(self.args[2]))
        restored = restore.restore(carver, CATALOG)
        return rig, carver, reconciled, restored

    def test_no_leak_no_half_made_nothing_touched(self):
        problems = []
        for at in range(STEPS + 1):
            status = self.carve_and_die(at)
            if at < STEPS:
                self.assertTrue(os.WIFSIGNALED(status), at)
            else:
                self.assertEqual(0, os.WEXITSTATUS(status))
            rig, carver, reconciled, restored = self.restart()
            problems += ['kill %d: reconcile %s' % (at, e)
                         for e in reconciled.errors]
            problems += ['kill %d: restore %s' % (at, e)
                         for e in restored.failed]
            rig.lib._sync()
            gis = rig.lib.gpus[0].gis
            for gi_id, gi in gis.items():
                if gi['cis'] < 1:
                    problems.append('kill %d: half-made GPU instance %d@%d'
                                    % (at, gi_id, gi['start']))
            have = set(carver.mig_state(0, A100))
            layouts = [{(g, s) for g, s, _v in lay.instances}
                       for lay in (OLD, NEW)]
            if have not in layouts:
                problems.append('kill %d: GPU holds %s, neither layout'
                                % (at, sorted(have)))
            if self.in_use not in gis or gis[self.in_use]['start'] != 0:
                problems.append('kill %d: the instance in use changed' % at)
            stored = carver.store.load()[self.address]
            if {(g, s) for g, s, _v in stored.instances} != have:
                problems.append('kill %d: store says %s, GPU holds %s'
                                % (at, stored.describe(), sorted(have)))
            left = list(rig.journal.intents())
            if left:
                problems.append('kill %d: intents left %s' % (at, left))
            # Back to OLD for the next kill.
            carver.apply(0, A100, OLD)
        self.assertEqual([], problems)

    def reboot(self):
        """What a reboot leaves of the GPU: no instance, no guest."""
        rig = self.rig()
        rig.lib._sync()
        rig.lib.gpus[0].gis.clear()
        rig.lib.gpus[0].vgpus.clear()
        rig.lib._flush()

    @staticmethod
    def left_after_restore(at, rig, carver, old):
        """What a restore after the kill at step ``at`` left wrong: a
        half-made GPU instance, a layout other than ``old``, an intent.
        """
        problems = []
        rig.lib._sync()
        for gi_id, gi in rig.lib.gpus[0].gis.items():
            if gi['cis'] < 1:
                problems.append('kill %d: half-made GPU instance %d'
                                % (at, gi_id))
        have = set(carver.mig_state(0, A100))
        if have != old:
            problems.append('kill %d: GPU holds %s after restore'
                            % (at, sorted(have)))
        if list(rig.journal.intents()):
            problems.append('kill %d: intents left' % at)
        return problems

    def test_restore_killed_at_every_step(self):
        problems = []
        old = {(g, s) for g, s, _v in OLD.instances}
        for at in range(2 * len(OLD.instances) + 1):
            self.reboot()
            status = self.carve_and_die(
                at, lambda carver: restore.restore(carver, CATALOG))
            if at < 2 * len(OLD.instances):
                self.assertTrue(os.WIFSIGNALED(status), at)
            rig, carver, reconciled, restored = self.restart()
            problems += ['kill %d: %s' % (at, e)
                         for e in reconciled.errors + restored.failed]
            problems += self.left_after_restore(at, rig, carver, old)
        self.assertEqual([], problems)

    def full_reboot(self):
        """A reboot of a GPU whose MIG mode is not kept (Hopper and
        later): MIG mode off, no instance, no guest, no VF enabled.
        """
        self.reboot()
        rig = self.rig()
        rig.lib._sync()
        rig.lib.gpus[0].mig = False
        rig.lib._flush()
        fs = self.host.fs
        with open(fs.path(fs.dev_rel(rel.PF), 'sriov_numvfs'), 'w') as f:
            f.write('0\n')

    def numvfs(self):
        fs = self.host.fs
        with open(fs.path(fs.dev_rel(rel.PF), 'sriov_numvfs')) as f:
            return int(f.read())

    def full_restore(self, carver):
        return restore.restore(
            carver_mod.Carver(carver.manager, carver.store,
                              mig_modes=carver_mod.MigModeStore(
                                  self.args[2])),
            CATALOG, sriov=sriov.SriovStore(self.args[2], boot_id='b2'),
            enable_vfs=True)  # nova-gpu-restore, before nova-compute

    def test_boot_restore_with_mig_mode_and_vfs_killed_at_every_step(self):
        """Steps: the MIG mode switch, the VF enable, then the six NVML
        changes of the layout's three instances.
        """
        carver_mod.MigModeStore(self.args[2]).set(self.address, True)
        sriov.SriovStore(self.args[2], boot_id='b1').set(rel.PF, 4)
        real_enable = privsep.enable_sriov_vfs
        steps = 2 + 2 * len(OLD.instances)
        old = {(g, s) for g, s, _v in OLD.instances}
        problems = []
        for at in range(steps + 1):
            self.full_reboot()

            def work(carver, at=at):
                count = _killing(carver.manager.nvml.lib, at)
                real_set = carver.manager.nvml.lib.nvmlDeviceSetMigMode

                def set_mode(*args):
                    if count[0] == at:
                        os.kill(os.getpid(), signal.SIGKILL)
                    count[0] += 1
                    return real_set(*args)
                carver.manager.nvml.lib.nvmlDeviceSetMigMode = set_mode

                def enable(*args):
                    if count[0] == at:
                        os.kill(os.getpid(), signal.SIGKILL)
                    count[0] += 1
                    return real_enable(*args)
                privsep.enable_sriov_vfs = enable
                self.full_restore(carver)
            status = self.carve_and_die(at, work)
            if at < steps:
                self.assertTrue(os.WIFSIGNALED(status), at)
            else:
                self.assertEqual(0, os.WEXITSTATUS(status))
            # the restart, as nova-gpu-restore: roll back, restore,
            # reconcile
            rig = self.rig()
            rolled = rig.reconciler().roll_back()
            carver = carver_mod.Carver(
                rig.manager, carver_mod.LayoutStore(self.args[2]))
            restored = self.full_restore(carver)
            reconciled = rig.reconciler().run()
            problems += ['kill %d: %s' % (at, e) for e in
                         rolled.errors + restored.failed + reconciled.errors]
            problems += self.left_after_restore(at, rig, carver, old)
            if rig.nvml.mig_mode(0) != (True, True):
                problems.append('kill %d: MIG mode %s' % (
                    at, rig.nvml.mig_mode(0)))
            if self.numvfs() != 4:
                problems.append('kill %d: %d VFs' % (at, self.numvfs()))
        self.assertEqual([], problems)


class TestStoreSurvivesTheAgent(testtools.TestCase):

    def test_layout_store_is_replaced_atomically(self):
        d = self.useFixture(fixtures.TempDir()).path
        store = carver_mod.LayoutStore(d)
        store.set('0000:07:00.0', OLD)
        store.set('0000:07:00.0', NEW)
        # No temporary file left beside the record (and its lock).
        self.assertEqual(['layouts.json', 'layouts.json.lock'],
                         sorted(os.listdir(d)))
        self.assertEqual(NEW, store.load()['0000:07:00.0'])
