"""The carver and the restore at boot, on the faked NVML (A100 in MIG)."""

import json
import os

import fixtures
import testtools

from nova_gpu.agent import carver as carver_mod
from nova_gpu.agent import devices
from nova_gpu.agent import errors
from nova_gpu.agent import nvml
from nova_gpu.agent import restore
from nova_gpu.core import catalog
from nova_gpu.core import exceptions
from nova_gpu.core import layout as L
from nova_gpu.tests.unit.agent import fakenvml

CATALOG = catalog.load_catalog()
A100 = CATALOG.model('A100-40GB')
ADDRESS = '0000:07:00.0'


def mig(*instances):
    return L.Layout(L.MIG, instances=instances)


class CarverTest(testtools.TestCase):

    def setUp(self):
        super().setUp()
        self.dir = self.useFixture(fixtures.TempDir()).path
        # 3g.20gb at 0 and 2g.10gb at 4, as the fake starts
        self.lib = fakenvml.a100_mig()
        self.manager = devices.DeviceManager(None, nvml=nvml.Nvml(
            lib=self.lib))
        self.store = carver_mod.LayoutStore(self.dir)
        self.carver = carver_mod.Carver(self.manager, self.store)

    def state(self):
        return sorted(self.carver.mig_state(0, A100))

    def test_reshapes_idle_instances_and_records_the_layout(self):
        target = mig(('3g.20gb', 0, 'A100X-3-20C'),
                     ('1g.5gb', 4, 'A100X-1-5C'),
                     ('1g.5gb', 5, 'A100X-1-5C'),
                     ('1g.5gb', 6, 'A100X-1-5C'))
        self.carver.apply(0, A100, target)
        self.assertEqual([('1g.5gb', 4), ('1g.5gb', 5), ('1g.5gb', 6),
                          ('3g.20gb', 0)], self.state())
        self.assertEqual({ADDRESS: target}, self.store.load())
        # The 3g.20gb instance was kept, not re-made.
        self.assertNotIn(('destroy_gi', 1), self.lib.calls)
        # Nothing left in flight in the journal.
        self.assertEqual([], list(self.manager.journal.intents()))

    def test_an_instance_in_use_is_never_touched(self):
        dev = self.lib.gpus[0]
        self.lib.start_vgpu_on(dev, 2)  # a guest on the 2g.10gb instance
        before = self.state()
        e = self.assertRaises(errors.InUse, self.carver.apply, 0, A100,
                              mig(('3g.20gb', 0, None), ('3g.20gb', 4,
                                                         None)))
        self.assertIn('2g.10gb@4', str(e))
        self.assertEqual(before, self.state())
        self.assertEqual({}, self.store.load())

    def test_cannot_tell_what_is_in_use_means_in_use(self):
        self.lib.vgpu_listing_fails = True
        self.assertRaises(errors.InUse, self.carver.apply, 0, A100,
                          mig(('7g.40gb', 0, None)))

    def test_a_failed_create_rolls_back(self):
        before = self.state()
        self.lib.fail_compute_instance = True
        self.assertRaises(errors.AgentError, self.carver.apply, 0, A100,
                          mig(('3g.20gb', 0, None), ('1g.5gb', 4, None),
                              ('1g.5gb', 5, None)))
        self.lib.fail_compute_instance = False
        # The removed 2g.10gb could not be re-made while compute
        # instances failed; what matters: no half-made or new instance is
        # left, and the layout is not recorded.
        self.assertEqual([('3g.20gb', 0)], self.state())
        self.assertLessEqual(set(self.state()), set(before))
        self.assertEqual([], list(self.manager.journal.intents()))
        self.assertEqual({}, self.store.load())

    def test_an_invalid_layout_is_refused_before_any_step(self):
        self.assertRaises(exceptions.InvalidRequest, self.carver.apply, 0,
                          A100, mig(('3g.20gb', 2, None)))
        self.assertEqual([], [c for c in self.lib.calls
                              if c[0] in ('create_gi', 'destroy_gi')])

    def test_time_sliced_and_passthrough_are_only_recorded(self):
        self.carver.apply(0, A100, L.Layout(L.PASSTHROUGH))
        self.assertEqual(L.Layout(L.PASSTHROUGH), self.store.load()[ADDRESS])
        self.assertEqual(2, len(self.state()))


class RestoreTest(testtools.TestCase):

    def setUp(self):
        super().setUp()
        self.dir = self.useFixture(fixtures.TempDir()).path
        self.store = carver_mod.LayoutStore(self.dir)

    def boot(self):
        """A fresh agent on a host just rebooted: no GPU instance."""
        lib = fakenvml.a100_mig()
        lib.gpus[0].gis.clear()
        manager = devices.DeviceManager(None, nvml=nvml.Nvml(lib=lib))
        return lib, carver_mod.Carver(manager, self.store)

    def test_layout_made_again_after_a_reboot(self):
        target = mig(('3g.20gb', 0, None), ('2g.10gb', 4, None),
                     ('1g.5gb', 6, None))
        self.store.set(ADDRESS, target)
        lib, carver = self.boot()
        result = restore.restore(carver, CATALOG)
        self.assertEqual([ADDRESS], result.restored)
        self.assertEqual([('1g.5gb', 6), ('2g.10gb', 4), ('3g.20gb', 0)],
                         sorted(carver.mig_state(0, A100)))
        # Restoring again changes nothing.
        calls = len(lib.calls)
        restore.restore(carver, CATALOG)
        self.assertEqual(calls, len([c for c in lib.calls]))

    def test_a_gone_gpu_is_dropped(self):
        self.store.set('0000:99:00.0', mig(('7g.40gb', 0, None)))
        _lib, carver = self.boot()
        result = restore.restore(carver, CATALOG)
        self.assertEqual(['0000:99:00.0'], result.dropped)
        self.assertEqual({}, self.store.load())

    def test_an_unreadable_store_is_set_aside(self):
        with open(self.store.path, 'w') as f:
            f.write('{not json')
        self.assertEqual({}, self.store.load())
        self.assertTrue(os.path.exists(self.store.path + '.bad'))

    def test_store_round_trip(self):
        target = mig(('3g.20gb', 4, 'A100X-3-20C'))
        self.store.set(ADDRESS, target)
        with open(self.store.path) as f:
            self.assertEqual(1, json.load(f)['version'])
        self.assertEqual({ADDRESS: target}, self.store.load())
        self.store.set(ADDRESS, None)
        self.assertEqual({}, self.store.load())
