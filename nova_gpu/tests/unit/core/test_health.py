"""Which faults quarantine a GPU, and the evidence that lifts them."""

import testtools

from nova_gpu.core import fragmentation
from nova_gpu.core import health
from nova_gpu.core import host as host_mod
from nova_gpu.core import request as request_mod
from nova_gpu.tests.unit.core import base

BOOT = 'boot-1'


def sample(**kw):
    kw.setdefault('boot_id', BOOT)
    kw.setdefault('ecc_volatile', 0)
    kw.setdefault('retired_pending', False)
    kw.setdefault('remap_pending', False)
    kw.setdefault('remap_failure', False)
    return health.Sample(**kw)


class ObserveTest(testtools.TestCase):

    def test_healthy(self):
        h = health.observe(health.Health(), sample(), 100.0)
        self.assertFalse(h.quarantined)
        self.assertIsNone(h.reason())

    def test_application_xids_leave_the_gpu_in_service(self):
        for code in (13, 31, 43, 94):
            self.assertFalse(health.observe(
                health.Health(), sample(xids=(code,)), 1.0).quarantined)

    def test_double_bit_ecc_until_the_reset_zeroes_the_counter(self):
        h = health.observe(health.Health(),
                           sample(xids=(48,), ecc_volatile=2), 100.0)
        self.assertTrue(h.quarantined)
        self.assertIn('Xid 48: double-bit ECC error', h.reason())
        self.assertIn('needs a GPU reset', h.reason())
        # Still there next pass: no evidence yet.
        h = health.observe(h, sample(ecc_volatile=2), 160.0)
        self.assertTrue(h.quarantined)
        # After the reset: the volatile count is back at 0.
        h = health.observe(h, sample(ecc_volatile=0), 220.0)
        self.assertFalse(h.quarantined)
        self.assertIn('volatile uncorrectable ECC count back at 0',
                      h.cleared[-1])

    def test_a_gpu_without_counters_waits_for_a_reboot_or_an_operator(self):
        none = health.Sample(boot_id=BOOT)
        h = health.observe(health.Health(), health.Sample(
            xids=(74,), boot_id=BOOT), 1.0)
        self.assertTrue(h.quarantined)
        self.assertTrue(health.observe(h, none, 2.0).quarantined)
        # A zero ECC count is no evidence for an NVLink fault.
        self.assertTrue(health.observe(h, sample(), 3.0).quarantined)
        rebooted = health.observe(h, health.Sample(boot_id='boot-2'), 4.0)
        self.assertFalse(rebooted.quarantined)
        self.assertIn('the host rebooted', rebooted.cleared[-1])

    def test_pending_remapping_clears_replacement_does_not(self):
        h = health.observe(health.Health(), sample(remap_pending=True), 1.0)
        self.assertTrue(h.quarantined)
        self.assertFalse(health.observe(h, sample(), 2.0).quarantined)
        h = health.observe(health.Health(), sample(remap_failure=True), 1.0)
        self.assertIn('needs service or replacement', h.reason())
        h = health.observe(h, health.Sample(boot_id='boot-2'), 2.0)
        self.assertTrue(h.quarantined)  # not even a reboot
        h = health.clear(h, 'operator admin', 3.0)
        self.assertFalse(h.quarantined)
        self.assertIn('cleared by operator admin', h.cleared[-1])

    def test_an_unread_flag_is_no_evidence(self):
        # Found by the reliability part "health": retired pages pending,
        # then the pending status cannot be read (None) while the remap
        # flag reads False: the fault must stay.
        h = health.observe(health.Health(), sample(
            xids=(63,), retired_pending=True), 1.0)
        self.assertTrue(h.quarantined)
        unread = sample(retired_pending=None, remap_pending=False)
        self.assertTrue(health.observe(h, unread, 2.0).quarantined)
        self.assertFalse(health.observe(h, sample(), 3.0).quarantined)
        # The ECC count unread is no evidence either.
        h = health.observe(health.Health(), sample(ecc_volatile=3), 1.0)
        self.assertTrue(health.observe(h, sample(ecc_volatile=None),
                                       2.0).quarantined)

    def test_fallen_off_the_bus_needs_a_reboot(self):
        h = health.observe(health.Health(), health.Sample(
            xids=(79,), boot_id=BOOT), 1.0)
        self.assertIn('needs a reboot', h.reason())

    def test_slowdown_is_watched_not_quarantined(self):
        h = health.observe(health.Health(), sample(
            slowdown=('hardware thermal slowdown',)), 1.0)
        self.assertFalse(h.quarantined)
        self.assertEqual([health.SLOWDOWN], [f.kind for f in h.faults])
        self.assertEqual([], health.observe(h, sample(), 2.0).faults)

    def test_round_trip_and_bounds(self):
        h = health.Health()
        for n in range(100):
            h = health.observe(h, sample(xids=(48, 74, 95, 119, 120, 140),
                                         ecc_volatile=n + 1), float(n))
        self.assertLessEqual(len(h.faults), health.MAX_FAULTS)
        self.assertLessEqual(len(h.reason()), 250)
        again = health.Health.from_dict(h.to_dict())
        self.assertEqual(h.to_dict(), again.to_dict())
        # The first time of a fault is kept.
        self.assertEqual(0.0, h.faults[0].since)


class CapacityTest(testtools.TestCase):

    def test_a_quarantined_gpu_offers_no_slot_to_any_request(self):
        model = base.CATALOG.model('A100-40GB')
        gpu = host_mod.Gpu(0, model, vgpu_types=('A100-10C',))
        reqs = [request_mod.GpuRequest(host_mod.VGPU, 'A100-10C'),
                request_mod.GpuRequest(host_mod.WHOLE)]
        self.assertTrue(all(fragmentation.unit_slots(gpu, r) for r in reqs))
        gpu.quarantine = 'Xid 48: double-bit ECC error'
        self.assertEqual([(), ()],
                         [fragmentation.unit_slots(gpu, r) for r in reqs])
