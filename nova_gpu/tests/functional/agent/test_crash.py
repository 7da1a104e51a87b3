"""Crashes of the agent: the journal, reconcile's rollback and orphans.

Real libvirtd and mdevctl on the fake host; NVML faked at the pynvml
boundary with its MIG state in a file (as the driver keeps it).
"""

import io
import json
import logging
import os
import signal
import subprocess
import time

import libvirt
import pynvml
import testtools

from nova_gpu.agent import devices
from nova_gpu.agent import journal
from nova_gpu.agent import libvirt_host
from nova_gpu.agent import nvml
from nova_gpu.agent import privsep
from nova_gpu.agent import reconcile
from nova_gpu.agent import sysfs
from nova_gpu.bench import reliability_agent as rel
from nova_gpu.core import catalog
from nova_gpu.core import layout as layout_mod
from nova_gpu.tests.functional.agent import fakehost
from nova_gpu.tests.harness import green

A100 = catalog.load_catalog().model('A100-40GB')


class CrashTestCase(testtools.TestCase):

    def setUp(self):
        super().setUp()
        privsep.use_in_process()
        self.host = self.useFixture(fakehost.FakeHost(rel.build_host))
        self.fs = self.host.fs
        self.state_dir = os.path.join(self.host.dir, 'state')
        self.nvml_state = os.path.join(self.host.dir, 'nvml.json')
        self.conn = libvirt.open(self.host.uri)
        self.addCleanup(self.conn.close)
        self.restart()

    def restart(self):
        """New agent objects over the same host, as after a restart."""
        self.lib = rel.fake_nvml(self.nvml_state)
        self.lv = libvirt_host.LibvirtHost(self.host.uri, retries=1,
                                           retry_delay=0.05)
        self.addCleanup(self.lv.close)
        self.journal = journal.Journal.in_dir(self.state_dir)
        self.manager = devices.DeviceManager(
            sysfs.Sysfs(self.fs.root), self.lv, nvml.Nvml(lib=self.lib),
            timeout=5, journal=self.journal)

    def reconcile(self, grace=3600, remove_orphans=True, clock=None):
        kw = {'clock': clock} if clock else {}
        return reconcile.Reconciler(self.manager, grace_period=grace,
                                    remove_orphans=remove_orphans,
                                    orphan_kinds=reconcile.ORPHAN_KINDS,
                                    **kw).run()

    def abandon(self, op, **args):
        """Record an intent as a process that was then killed would."""
        key = self.journal.begin(op, **args)
        dead = subprocess.Popen(['true'])
        dead.wait()
        path = self.journal.path
        with open(path) as f:
            doc = json.load(f)
        doc['intents'][key]['owner'] = {'pid': dead.pid, 'start': 0}
        with open(path, 'w') as f:
            json.dump(doc, f)
        return key

    def define_domain(self, name, mdevs=(), pci=()):
        self.conn.defineXML(self.host.domain_xml(name, mdevs, pci))


class TestRollback(CrashTestCase):

    def test_half_made_mdev_rolled_back_even_without_orphan_pass(self):
        # killed after libvirt defined and started it, before completion
        uuid = 'aaaaaaaa-0000-4000-8000-000000000001'
        self.abandon('mdev_create', uuid=uuid, parent=rel.PARENT,
                     type_id=rel.MDEV_TYPE)
        name = self.lv.define_mdev(rel.PARENT, rel.MDEV_TYPE, uuid)
        self.lv.start_device(name, autostart=False)
        self.manager.wait_for(lambda: self.manager._libvirt_active(uuid),
                              'mdev up')
        # defined only (killed between define and start)
        other = 'aaaaaaaa-0000-4000-8000-000000000002'
        self.abandon('mdev_create', uuid=other, parent=rel.PARENT,
                     type_id=rel.MDEV_TYPE)
        self.lv.define_mdev(rel.PARENT, rel.MDEV_TYPE, other)
        self.restart()
        r = self.reconcile(remove_orphans=False)
        self.assertEqual(sorted([uuid, other]), sorted(r.rolled_back))
        self.assertEqual([], self.fs.mdevs())
        self.assertEqual({}, self.lv.mdevs())
        self.assertEqual({}, self.journal.intents())

    def test_in_use_device_of_an_abandoned_intent_kept(self):
        uuid = self.manager.create_mdev(rel.PARENT, rel.MDEV_TYPE)
        self.define_domain('guest', mdevs=[uuid])
        self.abandon('mdev_create', uuid=uuid, parent=rel.PARENT,
                     type_id=rel.MDEV_TYPE)
        vf = self.manager.create_vf_vgpu(rel.PF, rel.VGPU_TYPE)
        self.define_domain('guest2', pci=[vf])
        self.abandon('vf_create', vf=vf, type_id=rel.VGPU_TYPE)
        r = self.reconcile(grace=0)
        self.assertEqual([], r.rolled_back)
        self.assertEqual([], r.removed)
        self.assertEqual([uuid], self.fs.mdevs())
        self.assertTrue(self.lv.mdevs()[uuid]['persistent'])
        self.assertEqual(rel.VGPU_TYPE, self.manager.sysfs.pci_function(
            vf).current_vgpu_type)
        self.assertEqual({}, self.journal.intents())

    def test_half_made_vf_type_rolled_back(self):
        vf = self.manager.sysfs.pci_function(rel.PF).vfs[1]
        self.abandon('vf_create', vf=vf, type_id=rel.VGPU_TYPE)
        privsep.set_vgpu_type(self.fs.root, vf, rel.VGPU_TYPE)
        self.restart()
        r = self.reconcile(remove_orphans=False)
        self.assertEqual([vf], r.rolled_back)
        self.assertEqual(0, self.manager.sysfs.pci_function(
            vf).current_vgpu_type)

    def test_gpu_instance_without_compute_instance_rolled_back(self):
        # killed between the GPU instance and its compute instance, before
        # the id was journaled: found by its start slice
        self.abandon('mig_create', gpu='0000:07:00.0', profile='2g.10gb',
                     start=4, memory_slices=2)
        self.lib.add_gi(self.lib.gpus[0],
                        pynvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE, 4)
        self.lib._flush()
        # a remove cut short after the compute instance went
        gi = self.manager.create_mig(0, A100.mig_profile('1g.5gb'), 0)
        self.abandon('mig_remove', gpu='0000:07:00.0', gi_id=gi)
        self.restart()
        r = self.reconcile(remove_orphans=False)
        self.assertEqual(2, len(r.rolled_back), r)
        self.assertEqual({}, self.lib.gpus[0].gis)

    def test_unfinished_remove_finished(self):
        uuid = self.manager.create_mdev(rel.PARENT, rel.MDEV_TYPE)
        self.abandon('mdev_remove', uuid=uuid)
        self.lv.stop_device(self.lv.mdevs()[uuid]['name'])
        self.manager.wait_for(lambda: not self.fs.mdevs(), 'mdev gone')
        r = self.reconcile(remove_orphans=False)
        self.assertEqual([uuid], r.rolled_back)
        self.assertEqual({}, self.lv.mdevs())

    def test_failed_undo_handed_to_reconcile(self):
        # the device came up too late and libvirtd went away before the
        # create could undo itself: the intent goes to reconcile
        def fail(uuid):
            self.manager.wait_for(lambda: self.fs.mdevs(), 'mdev up')
            self.host.stop_libvirtd()
            raise RuntimeError('timed out')
        self.manager._wait_up = fail
        self.assertRaises(RuntimeError, self.manager.create_mdev,
                          rel.PARENT, rel.MDEV_TYPE)
        self.assertEqual(1, len(self.fs.mdevs()))
        self.assertEqual(1, len(self.journal.abandoned()))
        self.host.start_libvirtd()
        r = self.reconcile(remove_orphans=False)  # same process
        self.assertEqual(1, len(r.rolled_back), r)
        self.assertEqual([], self.fs.mdevs())
        self.assertEqual({}, self.lv.mdevs())
        self.assertEqual({}, self.journal.intents())


class TestOrphans(CrashTestCase):

    def test_grace_clock_survives_restart(self):
        now = [1000.0]
        orphan = self.manager.create_mdev(rel.PARENT, rel.MDEV_TYPE)
        r = self.reconcile(grace=300, clock=lambda: now[0])
        self.assertEqual([orphan], r.waiting)
        now[0] += 400
        self.restart()  # a new agent: the first-seen time is kept
        r = self.reconcile(grace=300, clock=lambda: now[0])
        self.assertEqual([orphan], r.removed)
        self.assertEqual({}, self.lv.mdevs())

    def test_unused_vf_type_reclaimed_used_kept(self):
        used = self.manager.create_vf_vgpu(rel.PF, rel.VGPU_TYPE)
        spare = self.manager.create_vf_vgpu(rel.PF, rel.VGPU_TYPE)
        self.define_domain('guest', pci=[used])
        r = self.reconcile(grace=3600)
        self.assertEqual([spare], r.waiting)
        r = self.reconcile(grace=0)
        self.assertEqual([spare], r.removed)
        self.assertIn(used, r.in_use)
        fn = self.manager.sysfs.pci_function
        self.assertEqual(rel.VGPU_TYPE, fn(used).current_vgpu_type)
        self.assertEqual(0, fn(spare).current_vgpu_type)
        r = self.reconcile(grace=0, remove_orphans=False)
        self.assertEqual(rel.VGPU_TYPE, fn(used).current_vgpu_type)

    def test_mig_without_vgpu_reclaimed_with_vgpu_kept(self):
        m = self.manager
        used = m.create_mig(0, A100.mig_profile('3g.20gb'), 0)
        self.lib.start_vgpu_on(self.lib.gpus[0], used)
        spare = m.create_mig(0, A100.mig_profile('1g.5gb'), 4)
        r = self.reconcile(grace=0)
        self.assertEqual(['0000:07:00.0/%d@4' % spare], r.removed)
        self.assertEqual([used], list(self.lib.gpus[0].gis))
        # NVML cannot list vGPUs: nothing can be known unused
        spare = m.create_mig(0, A100.mig_profile('1g.5gb'), 4)
        self.lib.vgpu_listing_fails = True
        r = self.reconcile(grace=0)
        self.assertEqual([], r.removed)
        self.assertEqual(2, len(self.lib.gpus[0].gis))

    def test_by_default_only_mdevs_are_orphans(self):
        # A vendor-VFIO pool's preset VF types and MIG instances made
        # ahead are capacity: the production default keeps them.
        spare_vf = self.manager.create_vf_vgpu(rel.PF, rel.VGPU_TYPE)
        spare_gi = self.manager.create_mig(0, A100.mig_profile('1g.5gb'), 4)
        orphan = self.manager.create_mdev(rel.PARENT, rel.MDEV_TYPE)
        r = reconcile.Reconciler(self.manager, grace_period=0).run()
        self.assertEqual([orphan], r.removed)
        fn = self.manager.sysfs.pci_function
        self.assertEqual(rel.VGPU_TYPE, fn(spare_vf).current_vgpu_type)
        self.assertEqual([spare_gi], list(self.lib.gpus[0].gis))
        self.assertRaises(ValueError, reconcile.Reconciler, self.manager,
                          orphan_kinds=['mdevs'])

    def test_carved_mig_instances_kept(self):
        carved = self.manager.create_mig(0, A100.mig_profile('1g.5gb'), 4)
        other = self.manager.create_mig(0, A100.mig_profile('1g.5gb'), 5)
        layout = layout_mod.Layout(layout_mod.MIG, instances=[
            ('1g.5gb', 4, None)])
        r = reconcile.Reconciler(
            self.manager, grace_period=0,
            orphan_kinds=reconcile.ORPHAN_KINDS,
            layouts=lambda: {'0000:07:00.0': layout}).run()
        self.assertEqual(['0000:07:00.0/%d@4' % carved], r.carved)
        self.assertEqual(['0000:07:00.0/%d@5' % other], r.removed)
        self.assertEqual([carved], list(self.lib.gpus[0].gis))


class TestSigkill(testtools.TestCase):

    def test_ten_sigkills_leave_nothing(self):
        found = rel.kills(10, seed=7)
        self.assertEqual(10, found['trials'])
        # libvirt's own refresh race can leave an mdev only libvirt lists
        # (active, transient, gone from sysfs); it is shown, not failed.
        self.addDetail('libvirt_stale', testtools.content.text_content(
            str(found['libvirt_stale'])))
        self.assertEqual([], [d for d in found['details']
                              if ' libvirt_stale ' not in d])
        self.assertEqual((0, 0, 0), (found['leaked'], found['half'],
                                     found['touched']))


@testtools.skipUnless(green.is_green(), 'eventlet mode only')
class TestForkedWorkerLogging(testtools.TestCase):
    """A worker SIGKILLed while it logs leaves the parent able to log.

    oslo.log's eventlet-aware handler lock (eventlet mode only: in native
    threading oslo.log keeps the standard lock) passes its token through a
    pipe, which a fork shares: a worker killed holding it hung the test
    process in CI. The forked worker takes locks of its own.
    """

    def test_killed_holder_does_not_take_the_parents_lock(self):
        from oslo_log import pipe_mutex

        handler = logging.StreamHandler(io.StringIO())
        handler.lock = pipe_mutex.PipeMutex()
        logger = logging.getLogger('nova_gpu.test.forked_worker')
        logger.addHandler(handler)
        self.addCleanup(logger.removeHandler, handler)
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                rel.own_logging_locks()
                handler.acquire()   # logging, when the kill comes
                os.write(w, b'r')
                time.sleep(60)
            finally:
                os._exit(1)
        os.close(w)
        self.addCleanup(os.close, r)
        os.read(r, 1)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        self.assertTrue(handler.lock.acquire(blocking=False))
        handler.lock.release()
