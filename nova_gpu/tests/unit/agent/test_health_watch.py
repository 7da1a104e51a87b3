"""The agent's NVML health pass: events, counters, a persisted quarantine."""

import json
import os

import fixtures
import pynvml
import testtools

from nova_gpu.agent import health
from nova_gpu.agent import nvml as nvml_mod
from nova_gpu import atomic_file
from nova_gpu.tests.unit.agent import fakenvml

GPU2 = '0000:52:00.0'


class WatchTest(testtools.TestCase):

    def setUp(self):
        super().setUp()
        self.lib = fakenvml.hgx_h100()
        self.nvml = nvml_mod.Nvml(lib=self.lib)
        self.dir = self.useFixture(fixtures.TempDir()).path
        self.store = health.HealthStore(self.dir)
        self.now = 1000.0
        self.watch = self.new_watch()

    def new_watch(self, boot='boot-1'):
        return health.HealthWatch(self.nvml, self.store, boot=boot,
                                  clock=lambda: self.now)

    def test_healthy_gpus_have_no_faults(self):
        healths = self.watch.cycle()
        self.assertEqual(8, len(healths))
        self.assertFalse(any(h.faults for h in healths.values()))

    def test_xid_48_quarantines_until_the_reset_zeroes_the_count(self):
        self.watch.cycle()  # registers the event set
        dev = self.lib.gpus[2]
        dev.ecc_volatile = 1
        self.lib.raise_event(dev, health.EVENT_XID, 48)
        self.lib.raise_event(dev, health.EVENT_DBE)
        healths = self.watch.cycle()
        self.assertTrue(healths[GPU2].quarantined)
        self.assertIn('Xid 48', healths[GPU2].reason())
        self.assertEqual(1, sum(h.quarantined for h in healths.values()))
        # Persisted: a restarted agent (a new watch) still holds it.
        self.now += 60
        self.assertTrue(self.new_watch().cycle()[GPU2].quarantined)
        # The operator resets the GPU: NVML zeroes the volatile count.
        self.lib.reset_counters(dev)
        healths = self.new_watch().cycle()
        self.assertFalse(healths[GPU2].quarantined)
        self.assertIn('back at 0', healths[GPU2].cleared[-1])

    def test_a_reboot_clears_what_a_reset_clears(self):
        self.watch.cycle()
        self.lib.raise_event(self.lib.gpus[2], health.EVENT_XID, 74)
        self.assertTrue(self.watch.cycle()[GPU2].quarantined)
        self.assertTrue(self.watch.cycle()[GPU2].quarantined)
        healths = self.new_watch(boot='boot-2').cycle()
        self.assertFalse(healths[GPU2].quarantined)

    def test_a_remapping_failure_stays_until_cleared(self):
        self.lib.gpus[2].remap = (0, 1, False, True)
        self.assertTrue(self.watch.cycle()[GPU2].quarantined)
        self.lib.gpus[2].remap = (0, 1, False, False)
        self.assertTrue(self.new_watch(boot='b2').cycle()[GPU2].quarantined)
        after = health.clear(self.store, GPU2, 'root on cmp1')
        self.assertFalse(after.quarantined)
        self.assertFalse(self.watch.cycle()[GPU2].quarantined)
        self.assertRaises(KeyError, health.clear, self.store, '0000:ff:00.0',
                          'root')

    def test_gpus_without_counters_are_not_taken_for_healthy_evidence(self):
        dev = self.lib.gpus[2]
        dev.health_counters = False
        dev.events_supported = 0
        samples = self.watch.samples()
        self.assertIsNone(samples[GPU2].ecc_volatile)
        self.assertIsNone(samples[GPU2].remap_pending)
        self.assertEqual(0, samples['0000:1b:00.0'].ecc_volatile)

    def test_an_event_storm_is_bounded(self):
        self.watch.cycle()
        for _n in range(health.MAX_EVENTS + 50):
            self.lib.raise_event(self.lib.gpus[0], health.EVENT_XID, 13)
        self.watch.cycle()
        left = self.lib.event_sets[0]['queue']
        self.assertEqual(50, len(left))  # the rest waits for the next pass

    def test_a_lost_gpu_is_quarantined_until_a_reboot(self):
        self.lib.lose(GPU2)
        healths = self.watch.cycle()
        self.assertIn('Xid 79', healths[GPU2].reason())
        self.assertEqual(1, sum(h.quarantined for h in healths.values()))
        self.assertTrue(self.new_watch().cycle()[GPU2].quarantined)

    def test_slowdown_reasons_are_named(self):
        self.lib.gpus[2].clock_reasons = 0x40 | 0x4
        sample = self.watch.samples()[GPU2]
        self.assertEqual(('software power cap', 'hardware thermal slowdown'),
                         sample.slowdown)

    def test_a_corrupt_file_is_kept_and_raises(self):
        with open(os.path.join(self.dir, health.FILE), 'w') as f:
            f.write('{not json')
        self.assertRaises(atomic_file.Unreadable, self.store.load)
        with open(os.path.join(self.dir, health.FILE)) as f:
            self.assertEqual('{not json', f.read())

    def test_file_round_trip(self):
        self.lib.gpus[2].retired_pending = True
        self.watch.cycle()
        with open(os.path.join(self.dir, health.FILE)) as f:
            data = json.load(f)
        self.assertTrue(data['gpus'][GPU2]['quarantined'])

    def test_timeout_is_the_end_of_the_queue(self):
        event_set = self.lib.nvmlEventSetCreate()
        self.assertRaises(pynvml.NVMLError_Timeout,
                          self.lib.nvmlEventSetWait_v2, event_set, 0)
