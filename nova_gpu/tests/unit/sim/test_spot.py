"""Spot tasks in the replay with departures: eviction for on-demand."""

import testtools

from nova_gpu.core import exceptions
from nova_gpu.sim import power
from nova_gpu.sim import trace
from nova_gpu.tests.unit.sim import test_power

H = 3600


class TestSpot(testtools.TestCase):

    def setUp(self):
        super().setUp()
        self.dir = self.useFixture(test_power._TempDir()).path
        # Two hosts of four T4 GPUs each.
        self.nodes = trace.load_nodes(test_power.write(
            self.dir, 'nodes.csv', 'sn,cpu_milli,memory_mib,gpu,model',
            [('a', 64000, 262144, 4, 'T4'), ('b', 64000, 262144, 4, 'T4')]))
        path = test_power.write(
            self.dir, 'tasks.csv', test_power.TASK_HEADER, [
                # bestfit packs: od and s1 fill one host, s2 and s4 take
                # two GPUs of the other.
                ('od', 1000, 1024, 3, 1000, '', 0, 10 * H),
                ('s1', 1000, 1024, 1, 1000, '', 1 * H, 10 * H),
                ('s2', 1000, 1024, 1, 1000, '', 2 * H, 10 * H),
                ('s4', 1000, 1024, 1, 1000, '', 2.5 * H, 10 * H),
                # On-demand, three GPUs on one host: one eviction on the
                # second host makes room; s1's would not (od is there).
                ('trio', 1000, 1024, 3, 1000, '', 3 * H, 10 * H),
                # Spot, nothing free: refused, never evicts.
                ('s3', 1000, 1024, 1, 1000, '', 4 * H, 10 * H)])
        self.tasks = trace.load_tasks(path)
        self.created, self.deleted = power.load_lifetimes(path, self.tasks)

    def replay(self, **kw):
        return power.replay_power(self.nodes, self.tasks, self.created,
                                  self.deleted, 'bestfit', samples=0,
                                  spot=('s1', 's2', 's3', 's4'), **kw)

    def test_on_demand_served_by_evicting_the_one_spot_needed(self):
        r = self.replay()
        # Exactly one of the two spot tasks of the second host goes.
        self.assertEqual(1, len(r.evicted))
        self.assertIn(r.evicted[0], ('s2', 's4'))
        self.assertEqual((1, 1, 1.0), (r.evictions, r.by_eviction,
                                       r.evictions_per_served))
        self.assertEqual((0, 0), (r.od_refused, r.od_refused_spot_left))
        self.assertEqual((3, 1), (r.spot_placed, r.spot_refused))
        self.assertEqual((5, 1), (r.placed, r.refused))
        # Up to the last arrival (4 h): od 3 GPUs x 4 h, trio 3 x 1 h;
        # s1 3 h, s2 and s4 2.5 h together (one evicted at 3 h).
        self.assertEqual((15.0, 5.5), (round(r.od_gpu_hours, 6),
                                       round(r.spot_gpu_hours, 6)))

    def test_without_eviction_the_on_demand_task_is_refused(self):
        r = self.replay(evict=False)
        self.assertEqual([], r.evicted)
        self.assertEqual((0, 0), (r.evictions, r.by_eviction))
        self.assertEqual((1, 1), (r.od_refused, r.od_refused_spot_left))
        self.assertEqual((4, 0), (r.spot_placed, r.spot_refused))

    def test_spot_share_is_seeded(self):
        kw = dict(samples=0, spot=0.5)
        a = power.replay_power(self.nodes, self.tasks, self.created,
                               self.deleted, 'bestfit', seed=3, **kw)
        b = power.replay_power(self.nodes, self.tasks, self.created,
                               self.deleted, 'bestfit', seed=3, **kw)
        self.assertEqual(0.5, a.spot_share)  # 3 of the 6 GPU tasks
        self.assertEqual((a.evicted, a.spot_gpu_hours),
                         (b.evicted, b.spot_gpu_hours))

    def test_bad_spot(self):
        e = self.assertRaises(exceptions.InvalidRequest, self.replay_bad,
                              1.5)
        self.assertIn('spot must be a share in [0, 1], got 1.5', str(e))
        e = self.assertRaises(exceptions.InvalidRequest, self.replay_bad,
                              ['nope'])
        self.assertIn('spot tasks nope are not GPU tasks', str(e))

    def replay_bad(self, spot):
        return power.replay_power(self.nodes, self.tasks, self.created,
                                  self.deleted, 'bestfit', spot=spot)
