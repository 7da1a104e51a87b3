"""Idle guest devices: windows, threshold, missing samples, right-sizing."""

import testtools

from nova_gpu.core import catalog as catalog_mod
from nova_gpu.core import idle

CATALOG = catalog_mod.load_catalog()
A100 = CATALOG.model('A100-40GB')
L4 = CATALOG.model('L4')
T0 = 1700000000.0


def fill(window, start, end, compute, memory=1024, step=60):
    t = start
    while t <= end:
        window.add(t, compute, memory)
        t += step


class WindowTest(testtools.TestCase):

    def test_idle_after_the_configured_time(self):
        w = idle.Window(threshold=0.05, idle_after=1800)
        fill(w, T0, T0 + 1740, 0.01)
        self.assertEqual(idle.BUSY, w.verdict(T0 + 1740).state)
        w.add(T0 + 1800, 0.01, 1024)
        v = w.verdict(T0 + 1800)
        self.assertTrue(v.idle)
        self.assertEqual(T0, v.since)
        self.assertEqual(1800, v.seconds)
        self.assertEqual(0.01, v.peak_compute)
        self.assertEqual(1024, v.peak_memory_mib)

    def test_one_busy_reading_starts_the_run_again(self):
        w = idle.Window(idle_after=1800)
        fill(w, T0, T0 + 1200, 0.0)
        w.add(T0 + 1260, 0.5, 1024)
        fill(w, T0 + 1320, T0 + 3000, 0.0)
        self.assertFalse(w.verdict(T0 + 3000).idle)
        fill(w, T0 + 3060, T0 + 3120, 0.0)
        v = w.verdict(T0 + 3120)
        self.assertTrue(v.idle)
        self.assertEqual(T0 + 1320, v.since)

    def test_threshold_is_of_the_devices_own_share(self):
        # a 1/8 vGPU running its whole slice: 12.5% of the GPU, busy
        w = idle.Window(share=0.125, threshold=0.05, idle_after=600)
        fill(w, T0, T0 + 600, 0.125)
        self.assertEqual(idle.BUSY, w.verdict(T0 + 600).state)
        # 0.5% of the GPU is 4% of its share: idle
        w = idle.Window(share=0.125, threshold=0.05, idle_after=600)
        fill(w, T0, T0 + 600, 0.005)
        self.assertTrue(w.verdict(T0 + 600).idle)
        # at the threshold is not under it
        w = idle.Window(share=1.0, threshold=0.05, idle_after=600)
        fill(w, T0, T0 + 600, 0.05)
        self.assertFalse(w.verdict(T0 + 600).idle)

    def test_no_readings_no_verdict(self):
        w = idle.Window(idle_after=600)
        fill(w, T0, T0 + 3600, None)   # NVML unsupported: never idle
        self.assertEqual(idle.UNKNOWN, w.verdict(T0 + 3600).state)
        self.assertEqual(0, len(w))

    def test_readings_stopping_give_no_verdict(self):
        w = idle.Window(idle_after=600, max_gap=300)
        fill(w, T0, T0 + 900, 0.0)
        self.assertTrue(w.verdict(T0 + 900).idle)
        self.assertTrue(w.verdict(T0 + 1200).idle)
        self.assertEqual(idle.UNKNOWN, w.verdict(T0 + 1201).state)

    def test_a_gap_breaks_the_run(self):
        w = idle.Window(idle_after=600, max_gap=300)
        fill(w, T0, T0 + 500, 0.0)
        fill(w, T0 + 900, T0 + 1200, 0.0)
        self.assertFalse(w.verdict(T0 + 1200).idle)
        v = w.verdict(T0 + 1200)
        self.assertEqual(6, v.samples)   # the readings before the gap went
        w.add(T0 + 1500, 0.0, 1024)
        self.assertEqual(T0 + 900, w.verdict(T0 + 1500).since)

    def test_clock_set_back_starts_again(self):
        w = idle.Window(idle_after=600)
        fill(w, T0, T0 + 600, 0.0)
        w.add(T0 + 100, 0.0, 10)
        v = w.verdict(T0 + 100)
        self.assertFalse(v.idle)
        self.assertEqual(1, v.samples)

    def test_memory_is_bounded(self):
        w = idle.Window(idle_after=600, max_samples=50)
        fill(w, T0, T0 + 600, 0.0, step=1)
        self.assertEqual(50, len(w))
        self.assertTrue(w.verdict(T0 + 600).idle)
        w = idle.Window(idle_after=600)
        fill(w, T0, T0 + 6000, 0.0)
        self.assertEqual(11, len(w))    # only the last idle_after seconds

    def test_peak_over_the_window(self):
        w = idle.Window(idle_after=600)
        w.add(T0, 0.9, 30000)
        fill(w, T0 + 60, T0 + 660, 0.01, 2048)
        v = w.verdict(T0 + 660)
        self.assertTrue(v.idle)
        self.assertEqual(0.01, v.peak_compute)      # the 0.9 aged out
        self.assertEqual(2048, v.peak_memory_mib)

    def test_memory_peak_needs_every_reading(self):
        w = idle.Window(idle_after=600)
        fill(w, T0, T0 + 600, 0.0, None)
        v = w.verdict(T0 + 600)
        self.assertTrue(v.idle)
        self.assertIsNone(v.peak_memory_mib)

    def test_bad_parameters(self):
        self.assertRaises(ValueError, idle.Window, share=0)
        self.assertRaises(ValueError, idle.Window, idle_after=0)


class TrackerTest(testtools.TestCase):

    def test_windows_per_key_and_gone_devices_dropped(self):
        t = idle.Tracker(idle_after=600)
        for n in range(11):
            t.observe(T0 + 60 * n, {'a': (1.0, 0.0, 10), 'b': (1.0, 0.9, 10)})
        self.assertTrue(t.verdict('a', T0 + 600).idle)
        self.assertEqual(idle.BUSY, t.verdict('b', T0 + 600).state)
        t.observe(T0 + 660, {'a': (1.0, 0.0, 10)})
        self.assertEqual({'a'}, set(t.windows))
        self.assertEqual(idle.UNKNOWN, t.verdict('b', T0 + 660).state)

    def test_a_new_size_is_a_new_window(self):
        t = idle.Tracker(idle_after=600)
        for n in range(11):
            t.observe(T0 + 60 * n, {'a': (1.0, 0.0, 10)})
        t.observe(T0 + 720, {'a': (0.5, 0.0, 10)})   # resized in place
        self.assertFalse(t.verdict('a', T0 + 720).idle)


def verdict(compute, memory):
    return idle.Verdict(idle.IDLE, since=T0, seconds=1800,
                        peak_compute=compute, peak_memory_mib=memory)


class SuggestTest(testtools.TestCase):

    def test_sizes(self):
        by = {(s.kind, s.profile): s for s in idle.sizes(A100)}
        self.assertEqual((1 / 7, 5120), (by['mig', '1g.5gb'].compute,
                                         by['mig', '1g.5gb'].memory_mib))
        self.assertEqual((0.25, 10240), (by['vgpu', 'A100-10C'].compute,
                                         by['vgpu', 'A100-10C'].memory_mib))
        self.assertNotIn(('vgpu', 'A100-1-5C'), by)   # MIG-backed
        self.assertEqual(by['whole', 'whole'],
                         idle.device_size(A100, 'whole', None))
        self.assertEqual(by['mig', '3g.20gb'], idle.device_size(
            A100, 'mig', ['3g.20gb', 0, 'A100-3-20C']))

    def test_smallest_of_the_same_model(self):
        whole = idle.device_size(A100, 'whole', None)
        s = idle.suggest(A100, whole, verdict(0.1, 4000),
                         CATALOG.models.values())
        self.assertEqual('A100-4C', s.profile)   # 1/10 compute, 4 GiB
        s = idle.suggest(A100, whole, verdict(0.13, 4000))
        self.assertEqual('1g.5gb', s.profile)    # 1/7 compute, 5 GiB
        s = idle.suggest(A100, whole, verdict(0.2, 4000),
                         CATALOG.models.values())
        self.assertEqual(0.2, s.compute)      # A100-8C: 1/5
        self.assertGreaterEqual(s.memory_mib, 4000)

    def test_none_when_nothing_smaller_fits(self):
        mig = idle.device_size(A100, 'mig', ['1g.5gb', 0, None])
        self.assertIsNone(idle.suggest(A100, mig, verdict(0.14, 5000),
                                       CATALOG.models.values()))
        whole = idle.device_size(A100, 'whole', None)
        self.assertIsNone(idle.suggest(A100, whole, verdict(0.9, 39000),
                                       CATALOG.models.values()))

    def test_no_peak_no_suggestion(self):
        whole = idle.device_size(A100, 'whole', None)
        self.assertIsNone(idle.suggest(A100, whole, verdict(0.0, None)))
        self.assertIsNone(idle.suggest(A100, whole, verdict(None, 10)))

    def test_a_smaller_model_for_a_guest_that_barely_computes(self):
        # L4's smallest device (1 GiB) would not be smaller than ... an
        # idle whole L4 whose peak memory no L4 profile is under: none of
        # the same model; a smaller model's smallest device holding it.
        whole = idle.device_size(L4, 'whole', None)
        small = min((s for s in idle.sizes(L4)),
                    key=lambda s: (s.compute, s.memory_mib))
        self.assertIsNotNone(idle.suggest(L4, whole,
                                          verdict(0.0, small.memory_mib)))
        current = small
        smaller = [m for m in CATALOG.models.values()
                   if 0 < m.framebuffer_mib < L4.framebuffer_mib]
        found = idle.suggest(L4, current, verdict(0.0, small.memory_mib),
                             CATALOG.models.values())
        if smaller and any(m.framebuffer_mib >= small.memory_mib
                           for m in smaller):
            self.assertIsNotNone(found)
            self.assertNotEqual('L4', found.model)
            self.assertLess(CATALOG.model(found.model).framebuffer_mib,
                            L4.framebuffer_mib)
        # a guest that computes is never moved to another model
        self.assertIsNone(idle.suggest(L4, current,
                                       verdict(current.compute,
                                               small.memory_mib),
                                       CATALOG.models.values()))


def row(server, device, since, **kw):
    return dict(server_id=server, device=device, since=since, **kw)


class NoticesTest(testtools.TestCase):
    """``idle.notices``: once per idle episode, cleared when it ends."""

    def apply(self, told, found):
        for n in found:
            if n.told() is None:
                told.pop(n.server_id, None)
            else:
                told[n.server_id] = n.told()

    def actions(self, found):
        return [(n.action, n.server_id) for n in found]

    def test_one_episode_told_once_then_cleared(self):
        told = {}
        found = idle.notices(told, 'h1', [row('s1', 'd1', 100.0)])
        self.assertEqual([(idle.TELL, 's1')], self.actions(found))
        self.apply(told, found)
        self.assertEqual({'s1': {'host': 'h1', 'devices': {'d1': 100.0}}},
                         told)
        # the next reports of the same episode: nothing
        for _ in range(3):
            self.assertEqual([], idle.notices(
                told, 'h1', [row('s1', 'd1', 100.0)]))
        # busy again: cleared
        found = idle.notices(told, 'h1', [])
        self.assertEqual([(idle.CLEAR, 's1')], self.actions(found))
        self.apply(told, found)
        self.assertEqual({}, told)

    def test_a_new_episode_is_told_again(self):
        told = {'s1': {'host': 'h1', 'devices': {'d1': 100.0}}}
        self.assertEqual([(idle.TELL, 's1')], self.actions(idle.notices(
            told, 'h1', [row('s1', 'd1', 5000.0)])))

    def test_a_second_device_idle_is_told_fewer_is_an_update(self):
        told = {'s1': {'host': 'h1', 'devices': {'d1': 100.0}}}
        both = [row('s1', 'd1', 100.0), row('s1', 'd2', 300.0)]
        found = idle.notices(told, 'h1', both)
        self.assertEqual([(idle.TELL, 's1')], self.actions(found))
        self.assertEqual(2, len(found[0].devices))
        self.apply(told, found)
        found = idle.notices(told, 'h1', [row('s1', 'd2', 300.0)])
        self.assertEqual([(idle.UPDATE, 's1')], self.actions(found))

    def test_other_hosts_clear_nothing(self):
        told = {'s1': {'host': 'h1', 'devices': {'d1': 100.0}}}
        self.assertEqual([], idle.notices(told, 'h2', []))
        # moved to h2 and idle there in the same episode: an update
        found = idle.notices(told, 'h2', [row('s1', 'd1', 100.0)])
        self.assertEqual([(idle.UPDATE, 's1')], self.actions(found))

    def test_devices_of_no_server_tell_no_one(self):
        self.assertEqual([], idle.notices(
            {}, 'h1', [row(None, 'd1', 1.0), row('', 'd2', 1.0)]))
