"""mdev lifecycle against a real libvirtd and mdevctl on a fake sysfs."""

import libvirt
import testtools

from nova_gpu.agent import devices
from nova_gpu.agent import discovery
from nova_gpu.agent import errors
from nova_gpu.agent import libvirt_host
from nova_gpu.agent import reconcile
from nova_gpu.agent import sysfs
from nova_gpu.tests.functional.agent import fakehost

PARENT = '0000:3b:00.0'


class MdevTestCase(testtools.TestCase):
    hide_mdevctl = False

    def setUp(self):
        super().setUp()
        self.host = self.useFixture(fakehost.FakeHost(
            lambda fs: fakehost.t4_host(fs, gpus=2),
            hide_mdevctl=self.hide_mdevctl))
        self.fs = self.host.fs
        self.sysfs = sysfs.Sysfs(self.fs.root)
        self.lv = libvirt_host.LibvirtHost(self.host.uri, retries=1,
                                           retry_delay=0.05)
        self.addCleanup(self.lv.close)
        self.manager = devices.DeviceManager(self.sysfs, self.lv,
                                             timeout=5)
        self.conn = libvirt.open(self.host.uri)
        self.addCleanup(self.conn.close)

    def define_domain(self, name, mdevs=(), pci=()):
        return self.conn.defineXML(self.host.domain_xml(name, mdevs, pci))


class TestMdevLifecycle(MdevTestCase):

    def test_discovery_sees_parents_and_types(self):
        inv = discovery.Discovery(self.sysfs, host='cmp1',
                                  libvirt=self.lv).discover()
        self.assertEqual(['0000:3b:00.0', '0000:4b:00.0'],
                         [g.address for g in inv.gpus])
        self.assertTrue(inv.sources['libvirt'])
        self.assertEqual('T4', inv.gpus[0].model.name)
        self.assertEqual(['T4-1Q', 'T4-2Q'], inv.gpus[0].vgpu_profiles)
        report = inv.report(generation=3)
        self.assertEqual('cmp1_pci_0000_3b_00_0',
                         report['gpus'][0]['provider'])
        self.assertEqual(16, report['gpus'][0]['mdev_types'][
            'nvidia-222']['available'])

    def test_create_is_persistent_active_autostart(self):
        uuid = self.manager.create_mdev(PARENT, 'nvidia-222')
        self.assertEqual([uuid], self.fs.mdevs())
        info = self.lv.mdevs()[uuid]
        self.assertTrue(info['active'])
        self.assertTrue(info['persistent'])
        self.assertTrue(info['autostart'])
        self.assertEqual('nvidia-222', info['mdev_type'])
        self.assertEqual(15, self.fs.available(PARENT, 'nvidia-222'))
        # mdevctl keeps the definition where it starts it after boot
        dev = self.conn.nodeDeviceLookupByName(info['name'])
        self.assertIn(uuid, dev.XMLDesc(0))
        inv = discovery.Discovery(self.sysfs, host='cmp1').discover()
        self.assertEqual([(uuid, 'T4-1Q')], inv.gpus[0].mdevs)
        self.assertEqual({'T4-1Q': 1}, inv.host.gpus[0].vgpus)

    def test_remove_undefines(self):
        uuid = self.manager.create_mdev(PARENT, 'nvidia-223')
        self.manager.remove_mdev(uuid)
        self.assertEqual([], self.fs.mdevs())
        self.assertNotIn(uuid, self.lv.mdevs())
        self.assertEqual(8, self.fs.available(PARENT, 'nvidia-223'))

    def test_undefining_a_device_gone_since_listed_is_done(self):
        # A killed agent's mdevctl undefine went through; libvirt drops the
        # device between reconcile's listing and its undefine.
        uuid = self.manager.create_mdev(PARENT, 'nvidia-223')
        name = self.lv.mdevs()[uuid]['name']
        self.manager.remove_mdev(uuid)
        self.lv.undefine_device(name)
        self.assertNotIn(uuid, self.lv.mdevs())

    def make_stale_entry(self):
        """libvirt's stale entry (``devices.is_stale_libvirt_entry``): an
        mdev gone from sysfs without udev's "remove" reaching libvirtd,
        then undefined; libvirt keeps it as active and transient.
        """
        uuid = self.manager.create_mdev(PARENT, 'nvidia-222')
        name = self.lv.mdevs()[uuid]['name']
        self.fs.remove_mdev(uuid)  # the kernel; udev says nothing
        self.lv.undefine_device(name)
        info = self.lv.mdevs()[uuid]
        self.assertEqual((True, False), (info['active'], info['persistent']))
        self.assertEqual([], self.fs.mdevs())
        return uuid

    def test_stale_entry_cleared_by_removal(self):
        uuid = self.make_stale_entry()
        self.manager.remove_mdev(uuid)
        self.assertNotIn(uuid, self.lv.mdevs())
        self.assertEqual([], self.fs.mdevs())
        self.assertEqual(16, self.fs.available(PARENT, 'nvidia-222'))

    def test_stale_entry_cleared_by_reconcile(self):
        uuid = self.make_stale_entry()
        rec = reconcile.Reconciler(self.manager, grace_period=0)
        # the first cycle lets udev's word arrive; the next one clears it
        self.assertEqual([uuid], rec.run().libvirt_stale)
        result = rec.run()
        self.assertEqual(([], [], []), (result.libvirt_stale, result.removed,
                                        result.errors))
        self.assertNotIn(uuid, self.lv.mdevs())
        self.assertEqual([], self.fs.mdevs())

    def test_refuses_to_remove_device_in_use(self):
        uuid = self.manager.create_mdev(PARENT, 'nvidia-222')
        self.define_domain('guest1', mdevs=[uuid])
        e = self.assertRaises(errors.InUse, self.manager.remove_mdev, uuid)
        self.assertIn('guest1', str(e))
        self.assertEqual([uuid], self.fs.mdevs())
        self.assertTrue(self.lv.mdevs()[uuid]['persistent'])

    def test_unknown_type_missing_parent_no_capacity(self):
        e = self.assertRaises(errors.NotFound, self.manager.create_mdev,
                              PARENT, 'nvidia-999')
        self.assertIn("'nvidia-999' is not supported by 0000:3b:00.0", str(e))
        self.assertIn('nvidia-222, nvidia-223', str(e))
        e = self.assertRaises(errors.NotFound, self.manager.create_mdev,
                              '0000:99:00.0', 'nvidia-222')
        self.assertIn('parent 0000:99:00.0 does not exist', str(e))
        for _ in range(8):
            self.manager.create_mdev(PARENT, 'nvidia-223')
        e = self.assertRaises(errors.NoCapacity, self.manager.create_mdev,
                              PARENT, 'nvidia-223')
        self.assertIn('no instances of mdev type nvidia-223', str(e))
        self.assertEqual(8, len(self.fs.mdevs()))
        self.assertEqual(8, len(self.lv.mdevs()))

    def test_kernel_refusal_leaves_nothing_behind(self):
        # The kernel takes no more instances although sysfs said one was
        # left (a race with another creator): the define is rolled back.
        self.fs._set_available(PARENT, 'nvidia-222', 1)
        self.fs.mdev_types[(PARENT, 'nvidia-222')] = 1
        self.manager.timeout = 1
        self.kernel_blocked = self.fs.available
        self.fs.available = lambda addr, t: 0 if t == 'nvidia-222' else \
            self.kernel_blocked(addr, t)
        self.assertRaises(errors.AgentError, self.manager.create_mdev,
                          PARENT, 'nvidia-222')
        self.fs.available = self.kernel_blocked
        self.assertEqual([], self.fs.mdevs())
        self.assertEqual({}, self.lv.mdevs())

    def test_libvirtd_down(self):
        self.host.stop_libvirtd()
        e = self.assertRaises(errors.Unavailable, self.manager.create_mdev,
                              PARENT, 'nvidia-222')
        self.assertIn('libvirtd at qemu+unix', str(e))
        self.assertIn('not reachable', str(e))
        self.assertEqual([], self.fs.mdevs())
        self.host.start_libvirtd()
        uuid = self.manager.create_mdev(PARENT, 'nvidia-222')
        self.assertEqual([uuid], self.fs.mdevs())


class TestWithoutMdevctl(MdevTestCase):
    hide_mdevctl = True

    def test_clear_error_and_nothing_left(self):
        self.manager.check_mdevctl = False  # the agent's host has it
        e = self.assertRaises(errors.AgentError, self.manager.create_mdev,
                              PARENT, 'nvidia-222')
        self.assertIn('mdevctl', str(e))
        self.assertEqual([], self.fs.mdevs())
        self.assertEqual({}, self.lv.mdevs())


class TestReconcile(MdevTestCase):

    def reconciler(self, grace=0):
        return reconcile.Reconciler(self.manager, grace_period=grace)

    def test_reboot_restarts_persistent_mdevs(self):
        used = self.manager.create_mdev(PARENT, 'nvidia-222')
        spare = self.manager.create_mdev(PARENT, 'nvidia-222',
                                         autostart=True)
        self.define_domain('guest1', mdevs=[used])
        self.host.reboot()
        self.assertEqual([], self.fs.mdevs())
        result = reconcile.Reconciler(self.manager,
                                      remove_orphans=False).run()
        self.assertEqual(sorted([used, spare]), sorted(result.started),
                         'libvirtd log:\n' + self.host.log_tail())
        self.assertEqual(sorted([used, spare]), self.fs.mdevs())
        self.assertEqual([], result.errors)

    def test_orphans_removed_used_kept(self):
        used = self.manager.create_mdev(PARENT, 'nvidia-222')
        orphan = self.manager.create_mdev(PARENT, 'nvidia-222')
        stopped_guest = self.manager.create_mdev('0000:4b:00.0',
                                                 'nvidia-223')
        self.define_domain('running-or-not', mdevs=[used])
        self.define_domain('shut-off', mdevs=[stopped_guest])
        r = self.reconciler(grace=3600).run()
        self.assertEqual([orphan], r.waiting)
        self.assertEqual([], r.removed)
        r = self.reconciler(grace=0).run()
        self.assertEqual([orphan], r.removed)
        self.assertEqual(sorted([used, stopped_guest]), sorted(r.in_use))
        self.assertEqual(sorted([used, stopped_guest]), self.fs.mdevs())
        self.assertNotIn(orphan, self.lv.mdevs())

    def test_adopts_transient_mdev_in_use(self):
        # An mdev made outside libvirt (echo UUID > create) used by a guest
        uuid = 'aaaaaaaa-1111-2222-3333-444444444444'
        path = self.fs.path(self.fs.dev_rel(PARENT), 'mdev_supported_types',
                            'nvidia-223', 'create')
        with open(path, 'w') as f:
            f.write(uuid)
        self.manager.wait_for(lambda: self.sysfs.mdev_active(uuid), 'mdev')
        self.define_domain('guest', mdevs=[uuid])
        r = self.reconciler().run()
        self.assertEqual([uuid], r.adopted)
        info = self.lv.mdevs()[uuid]
        self.assertTrue(info['persistent'])
        self.assertEqual([uuid], self.fs.mdevs())
