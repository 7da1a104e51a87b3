"""The usage ledger's accounting rule (``nova_gpu.core.usage``)."""

import dataclasses
import json

import testtools

from nova_gpu.core import catalog as catalog_mod
from nova_gpu.core import host as host_mod
from nova_gpu.core import report as report_mod
from nova_gpu.core import usage

CATALOG = catalog_mod.load_catalog()
A100 = CATALOG.model('A100-40GB')
L4 = CATALOG.model('L4')
S1, S2 = 'server-1', 'server-2'


def held(server, profile='A100-10C', model=A100, kind=host_mod.VGPU):
    name, share, fb = usage.device_size(model, kind, profile)
    return usage.Holding(server, model.name, name, kind, share, fb)


def total(ledger, server, model='A100-40GB', profile='A100-10C'):
    return ledger.totals[(server, model, profile)]


class DeviceSizeTest(testtools.TestCase):

    def test_whole_gpu_counts_one(self):
        self.assertEqual(('whole', 1.0, 40.0),
                         usage.device_size(A100, host_mod.WHOLE, None))

    def test_time_sliced_vgpu_counts_its_share(self):
        self.assertEqual(('A100-10C', 0.25, 10.0),
                         usage.device_size(A100, host_mod.VGPU, 'A100-10C'))
        self.assertEqual(('L4-12C', 0.5, 12.0),
                         usage.device_size(L4, host_mod.VGPU, 'L4-12C'))

    def test_mixed_sizes_count_frame_buffer(self):
        mixing = dataclasses.replace(A100, time_sliced_mixing=True)
        self.assertEqual(('A100-8C', 0.2, 8.0),
                         usage.device_size(mixing, host_mod.VGPU,
                                           'A100-8C'))

    def test_mig_counts_memory_slices(self):
        self.assertEqual(('3g.20gb', 0.5, 20.0), usage.device_size(
            A100, host_mod.MIG, ['3g.20gb', 4, None]))
        self.assertEqual(('A100-1-5C', 0.125, 5.0), usage.device_size(
            A100, host_mod.MIG, ['1g.5gb', 2, 'A100-1-5C']))

    def test_share(self):
        self.assertEqual(('share', 0.3, 12.0),
                         usage.device_size(A100, host_mod.SHARE, 300))


class HoldingsTest(testtools.TestCase):

    def test_devices_of_a_report(self):
        host = host_mod.Host('gpu-1', [
            host_mod.Gpu(0, A100, address='0000:3b:00.0', mig_enabled=True),
            host_mod.Gpu(1, L4, address='0000:5e:00.0')])
        raw = report_mod.host_to_dict(host, devices={
            0: [{'kind': 'mig', 'detail': ['3g.20gb', 0, None]}],
            1: [{'kind': 'vgpu', 'detail': 'L4-12C', 'uuid': 'm-1',
                 'instance': S1},
                {'kind': 'vgpu', 'detail': 'L4-12C', 'uuid': 'm-2',
                 'instance': S2}]})
        found, unattributed = usage.holdings(
            report_mod.parse(raw, CATALOG), raw)
        self.assertEqual({'m-1': held(S1, 'L4-12C', L4),
                          'm-2': held(S2, 'L4-12C', L4)}, found)
        # the MIG instance names no guest: not billed, counted apart
        self.assertEqual(1, unattributed)


class LedgerTest(testtools.TestCase):

    def setUp(self):
        super().setUp()
        self.ledger = usage.Ledger(max_interval=180)

    def test_counted_from_first_seen_to_first_gone(self):
        ledger = self.ledger
        ledger.observe('a', 0, {})
        ledger.observe('a', 60, {'m': held(S1)})
        ledger.observe('a', 120, {'m': held(S1)})
        ledger.observe('a', 180, {'m': held(S1)})
        ledger.observe('a', 240, {})
        ledger.observe('a', 300, {})
        t = total(ledger, S1)
        self.assertEqual(180.0, t.seconds)
        self.assertEqual(45.0, t.gpu_seconds)
        self.assertEqual(1800.0, t.fb_gib_seconds)
        (session,) = ledger.sessions
        self.assertEqual((60.0, 240.0), (session.start, session.end))

    def test_a_series_starts_at_zero(self):
        self.ledger.observe('a', 0, {'m': held(S1)})
        self.assertEqual(0.0, total(self.ledger, S1).seconds)

    def test_gap_counted_when_still_held(self):
        # the exporter (or the agent, or the broker) away for an hour:
        # the same server holds the device before and after
        self.ledger.observe('a', 0, {'m': held(S1)})
        self.ledger.observe('a', 3600, {'m': held(S1)})
        self.assertEqual(3600.0, total(self.ledger, S1).seconds)

    def test_gap_capped_when_released(self):
        self.ledger.observe('a', 0, {'m': held(S1)})
        self.ledger.observe('a', 3600, {})
        self.assertEqual(180.0, total(self.ledger, S1).seconds)

    def test_device_given_to_another_server(self):
        self.ledger.observe('a', 0, {'m': held(S1)})
        self.ledger.observe('a', 60, {'m': held(S2)})
        self.ledger.observe('a', 120, {'m': held(S2)})
        self.assertEqual(60.0, total(self.ledger, S1).seconds)
        self.assertEqual(60.0, total(self.ledger, S2).seconds)

    def test_shares_of_one_gpu(self):
        mig = usage.Holding(S1, 'A100-40GB', '3g.20gb', host_mod.MIG,
                            *usage.device_size(
                                A100, host_mod.MIG, ['3g.20gb', 0,
                                                     None])[1:])
        whole = usage.Holding(S2, 'L4', 'whole', host_mod.WHOLE,
                              *usage.device_size(L4, host_mod.WHOLE,
                                                 None)[1:])
        self.ledger.observe('a', 0, {'g0': mig, 'g1': whole})
        self.ledger.observe('a', 100, {'g0': mig, 'g1': whole})
        self.assertEqual(50.0, total(self.ledger, S1, profile='3g.20gb')
                         .gpu_seconds)
        self.assertEqual(2000.0, total(self.ledger, S1, profile='3g.20gb')
                         .fb_gib_seconds)
        self.assertEqual(100.0, total(self.ledger, S2, 'L4', 'whole')
                         .gpu_seconds)

    def test_clock_set_back_counts_nothing_negative(self):
        self.ledger.observe('a', 100, {'m': held(S1)})
        self.ledger.observe('a', 200, {'m': held(S1)})
        self.ledger.observe('a', 150, {'m': held(S1)})  # set back 50 s
        self.assertEqual(1, self.ledger.clock_steps)
        self.assertEqual(100.0, total(self.ledger, S1).seconds)
        self.ledger.observe('a', 210, {'m': held(S1)})
        self.assertEqual(160.0, total(self.ledger, S1).seconds)

    def test_resize_to_another_profile_on_another_host(self):
        ledger = self.ledger
        small, big = held(S1), held(S1, 'L4-12C', L4)
        ledger.observe('a100', 0, {'m1': small})
        ledger.observe('l4', 5, {})
        ledger.observe('a100', 60, {'m1': small})
        # VERIFY_RESIZE: the destination holds the new device, the source
        # keeps the old one (shut off) until the resize is confirmed
        ledger.observe('l4', 65, {'m2': big})
        ledger.observe('a100', 120, {'m1': small})
        ledger.observe('l4', 125, {'m2': big})
        ledger.observe('a100', 180, {})  # confirmed
        ledger.observe('l4', 185, {'m2': big})
        self.assertEqual(65.0, total(ledger, S1).seconds)
        self.assertEqual(120.0, total(ledger, S1, 'L4', 'L4-12C').seconds)
        # one span of time, counted once: 0 .. 185
        self.assertEqual(185.0, sum(t.seconds for k, t in
                                    ledger.totals.items() if k[0] == S1))
        self.assertEqual(65 * 0.25 + 120 * 0.5, sum(
            t.gpu_seconds for t in ledger.totals.values()))

    def test_live_migration_continues(self):
        ledger = self.ledger
        ledger.observe('a', 0, {'m1': held(S1)})
        ledger.observe('b', 30, {})
        ledger.observe('a', 60, {'m1': held(S1)})
        ledger.observe('b', 90, {'m2': held(S1)})   # both hold it
        ledger.observe('a', 120, {'m1': held(S1)})
        ledger.observe('b', 150, {'m2': held(S1)})
        ledger.observe('a', 180, {})
        ledger.observe('b', 210, {'m2': held(S1)})
        self.assertEqual(210.0, total(ledger, S1).seconds)
        self.assertEqual(
            [('a', 0.0, 90.0), ('b', 90.0, 210.0)],
            [(s.host, s.start, s.end) for s in ledger.sessions])

    def test_reverted_resize_goes_back_to_the_source(self):
        ledger = self.ledger
        ledger.observe('a', 0, {'m1': held(S1)})
        ledger.observe('b', 50, {'m2': held(S1, 'L4-12C', L4)})
        ledger.observe('a', 60, {'m1': held(S1)})
        ledger.observe('b', 110, {})                   # reverted
        ledger.observe('a', 120, {'m1': held(S1)})
        ledger.observe('a', 180, {'m1': held(S1)})
        self.assertEqual(50.0 + 70.0, total(ledger, S1).seconds)
        self.assertEqual(60.0, total(ledger, S1, 'L4', 'L4-12C').seconds)

    def test_home_that_stopped_reporting_gives_way(self):
        ledger = self.ledger
        ledger.observe('a', 0, {'m1': held(S1)})
        ledger.observe('b', 0, {'m2': held(S1)})      # newest: home b
        ledger.observe('a', 60, {'m1': held(S1)})
        ledger.observe('b', 60, {})                   # b lets it go: a
        ledger.observe('a', 120, {'m1': held(S1)})
        self.assertEqual(120.0, total(ledger, S1).seconds)

    def test_usage_in_a_window_by_project(self):
        ledger = self.ledger
        for t in range(0, 401, 100):
            ledger.observe('a', t, {'m1': held(S1), 'm2': held(S2)})
        ledger.set_project(S1, 'p1')
        self.assertEqual([S2], ledger.unknown_projects())
        (row,) = ledger.usage(150, 250, project='p1')
        self.assertEqual(
            {'project_id': 'p1', 'server_id': S1, 'model': 'A100-40GB',
             'profile': 'A100-10C', 'seconds': 100.0, 'gpu_seconds': 25.0,
             'fb_gib_seconds': 1000.0, 'first': 150.0, 'last': 250.0},
            row)
        self.assertEqual([('', S2)], [(r['project_id'], r['server_id'])
                                      for r in ledger.usage(0, 1000,
                                                            server=S2)])
        self.assertEqual([], ledger.usage(500, 600))

    def test_prune_forgets_old_sessions_and_their_counters(self):
        ledger = usage.Ledger(max_interval=180, retention=1000)
        ledger.observe('a', 0, {'m1': held(S1)})
        ledger.observe('a', 100, {'m2': held(S2)})
        ledger.observe('a', 200, {'m2': held(S2)})
        ledger.set_project(S1, 'p1')
        ledger.prune(1050)
        self.assertEqual(2, len(ledger.totals))
        ledger.prune(1150)
        self.assertEqual([(S2, 'A100-40GB', 'A100-10C')],
                         list(ledger.totals))
        self.assertEqual({}, ledger.projects)


class RestartTest(testtools.TestCase):
    """Saved and read back: neither counted twice nor lost."""

    OBSERVATIONS = [('a', t, {'m1': held(S1)}) for t in range(0, 301, 60)]
    OBSERVATIONS += [('b', 330, {'m2': held(S1, 'L4-12C', L4)}),
                     ('a', 360, {'m1': held(S1)}), ('b', 390, {}),
                     ('a', 420, {}), ('a', 480, {'m3': held(S2)}),
                     ('a', 540, {'m3': held(S2)})]

    def run_all(self, restart_at=None, lose=0):
        ledger = usage.Ledger(max_interval=180)
        saved = []
        for n, (host, t, what) in enumerate(self.OBSERVATIONS):
            if n == restart_at:
                # a crash: the last ``lose`` observations since the write
                # never reached the file
                ledger = usage.Ledger.from_dict(
                    json.loads(saved[-1 - lose]), max_interval=180)
            ledger.observe(host, t, what)
            saved.append(json.dumps(ledger.to_dict()))
        return ledger

    def figures(self, ledger):
        return ({k: dataclasses.astuple(t) for k, t in ledger.totals.items()},
                ledger.usage(0, 10000))

    def test_restart_counts_the_same(self):
        expected = self.figures(self.run_all())
        for at in range(1, len(self.OBSERVATIONS)):
            self.assertEqual(expected, self.figures(self.run_all(at)), at)

    def test_crash_loses_observations_not_time(self):
        # Observations taken after the last write are lost with the
        # crash; the next one counts from the last written: the totals
        # come out the same.
        expected = self.figures(self.run_all())
        got = self.figures(self.run_all(restart_at=4, lose=2))
        self.assertEqual(expected[0], got[0])

    def test_malformed_saved_ledger_is_refused(self):
        self.assertRaises(usage.LedgerError, usage.Ledger.from_dict,
                          {'version': 99})
        data = usage.Ledger().to_dict()
        data['sessions'] = [['s', 'h', 'd', 'm', 'p', 'x', 1, 0, 1]]
        self.assertRaises(usage.LedgerError, usage.Ledger.from_dict, data)
        data['sessions'] = [['too', 'short']]
        self.assertRaises(usage.LedgerError, usage.Ledger.from_dict, data)
