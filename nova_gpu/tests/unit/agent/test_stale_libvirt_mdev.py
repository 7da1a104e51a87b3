"""An mdev libvirt keeps listing after it is gone from the host.

libvirt 9's node-device driver can apply an ``mdevctl list`` of active
mdevs that began before the mdev stopped after udev's "remove" event: the
mdev comes back in libvirt's list as active and transient, and stays there
(seen once in CI: ``nova-gpu remove mdev`` timed out "waiting for libvirt
to forget mdev"). The host holds nothing more; the removal must succeed,
say what libvirt shows, and reconcile must not try again every cycle.
"""

import fixtures
import testtools

from nova_gpu.agent import devices
from nova_gpu.agent import errors
from nova_gpu.agent import reconcile
from nova_gpu.agent import sysfs
from nova_gpu.tests.unit.agent import fakesys

PARENT = '0000:3b:00.0'
UUID = '8aacbfd0-73c4-404f-ab17-d2dbba78aebd'


class RacyLibvirt:
    """Knows one persistent active mdev. ``stop_device`` removes it from
    the fake sysfs (the kernel); with ``stale``, libvirt's list keeps it
    afterwards as active and transient, as the late mdevctl query leaves
    it; without, it forgets it as udev's "remove" tells it to.
    """

    def __init__(self, fs, stale, clearable=False):
        self.fs = fs
        self.stale = stale
        self.clearable = clearable
        self.transient = []
        self.known = {UUID: {'uuid': UUID, 'name': 'mdev_' + UUID,
                             'parent': 'pci_0000_3b_00_0',
                             'parent_addr': PARENT, 'mdev_type': 'nvidia-222',
                             'active': True, 'persistent': True,
                             'autostart': True}}
        self.stopped = []
        self.undefined = []

    def domain_refs(self):
        return {}

    def mdevs(self):
        return {k: dict(v) for k, v in self.known.items()}

    def stop_device(self, name):
        self.stopped.append(name)
        self.fs.remove_mdev(UUID)
        if not self.stale:
            if self.known[UUID]['persistent']:
                self.known[UUID]['active'] = False
            else:
                del self.known[UUID]

    def create_transient_mdev(self, parent, type_id, uuid):
        # udev's "add" makes libvirt's stale entry real again, its
        # "remove" (stop_device) then drops the transient entry.
        self.transient.append((parent, type_id, uuid))
        if not self.clearable:
            raise errors.AgentError('no instance of %s left' % type_id)
        self.fs.materialise_mdev(parent, type_id, uuid)
        self.stale = False
        return 'mdev_' + uuid

    def undefine_device(self, name):
        self.undefined.append(name)
        if self.stale:
            self.known[UUID]['persistent'] = False
            self.known[UUID]['autostart'] = False
        elif not self.known[UUID]['active']:
            del self.known[UUID]


class StaleEntryTest(testtools.TestCase):

    def setUp(self):
        super().setUp()
        root = self.useFixture(fixtures.TempDir()).path
        self.fs = fakesys.FakeSysfs(root)
        self.fs.add_pci(PARENT, '0x1eb8')
        self.fs.add_mdev_type(PARENT, 'nvidia-222', 'GRID T4-1Q', 16)
        self.fs.materialise_mdev(PARENT, 'nvidia-222', UUID)
        self.sysfs = sysfs.Sysfs(root)
        self.logger = self.useFixture(fixtures.FakeLogger())

    def manager(self, stale, clearable=False):
        self.lv = RacyLibvirt(self.fs, stale, clearable)
        return devices.DeviceManager(self.sysfs, self.lv, timeout=0.2)

    def test_cleared_when_a_transient_mdev_can_start(self):
        manager = self.manager(stale=True, clearable=True)
        manager.remove_mdev(UUID)
        self.assertEqual([(PARENT, 'nvidia-222', UUID)], self.lv.transient)
        self.assertEqual({}, self.lv.mdevs())
        self.assertEqual([], self.fs.mdevs())
        self.assertEqual(16, self.fs.available(PARENT, 'nvidia-222'))
        self.assertIn('cleared by starting and stopping a transient mdev',
                      self.logger.output)
        self.assertNotIn('restart virtnodedevd', self.logger.output)
        self.assertEqual({}, manager.journal.intents())

    def test_removal_succeeds_and_names_the_stale_entry(self):
        manager = self.manager(stale=True)
        manager.remove_mdev(UUID)
        self.assertEqual(['mdev_' + UUID], self.lv.stopped)
        self.assertEqual(['mdev_' + UUID], self.lv.undefined)
        self.assertEqual([], self.fs.mdevs())
        self.assertEqual(16, self.fs.available(PARENT, 'nvidia-222'))
        self.assertIn('%s is gone from sysfs and has no mdevctl definition, '
                      'but libvirt still lists it' % UUID,
                      self.logger.output)
        self.assertEqual({}, manager.journal.intents())
        # it was tried: no instance of the type left on the parent
        self.assertEqual([(PARENT, 'nvidia-222', UUID)], self.lv.transient)

    def test_an_entry_udev_catches_up_with_is_left_to_libvirt(self):
        # Removed a moment ago by someone else: libvirt lists it until
        # udev's "remove" arrives. Nothing is started again.
        manager = self.manager(stale=True, clearable=True)
        self.lv.known[UUID].update(persistent=False, autostart=False)
        self.fs.remove_mdev(UUID)
        calls = []
        real = self.lv.mdevs

        def mdevs():
            calls.append(1)
            if len(calls) > 3:
                self.lv.known.pop(UUID, None)
            return real()

        self.lv.mdevs = mdevs
        e = self.assertRaises(errors.NotFound, manager.remove_mdev, UUID)
        self.assertEqual('no mdev %s on this host' % UUID, str(e))
        self.assertEqual([], self.lv.transient)
        rec = reconcile.Reconciler(manager, grace_period=0)
        self.assertEqual([], rec.run().libvirt_stale)

    def test_removing_it_again_is_not_found_naming_why(self):
        manager = self.manager(stale=True)
        manager.remove_mdev(UUID)
        e = self.assertRaises(errors.NotFound, manager.remove_mdev, UUID)
        self.assertIn('no mdev %s on this host; ' % UUID, str(e))
        self.assertIn('stale entry', str(e))
        self.assertEqual(1, len(self.lv.stopped))

    def test_reconcile_leaves_it_alone(self):
        manager = self.manager(stale=True)
        manager.remove_mdev(UUID)
        rec = reconcile.Reconciler(manager, grace_period=0)
        for _ in range(2):
            result = rec.run()
            self.assertEqual([], result.removed)
            self.assertEqual([], result.waiting)
            self.assertEqual([], result.errors)
            self.assertEqual([UUID], result.libvirt_stale)
        # one warning from the removal, one from reconcile: not every cycle
        self.assertEqual(2, self.logger.output.count('still lists it'))
        self.assertEqual(1, len(self.lv.stopped))
        self.assertEqual(1, len(self.lv.undefined))

    def test_an_entry_libvirt_still_defines_is_an_error(self):
        # Not the race: a definition that stays is something left on the
        # host (mdevctl would start it at boot), so the wait times out.
        manager = self.manager(stale=True)
        self.lv.undefine_device = lambda name: None
        e = self.assertRaises(errors.AgentError, manager.remove_mdev, UUID)
        self.assertIn('waiting for libvirt to forget mdev %s' % UUID, str(e))

    def test_without_the_race_it_is_forgotten(self):
        manager = self.manager(stale=False)
        manager.remove_mdev(UUID)
        self.assertEqual({}, self.lv.mdevs())
        self.assertNotIn('stale entry', self.logger.output)
