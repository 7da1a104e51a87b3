"""Replay with departures: idle hosts, idle GPU-hours, consolidation."""

import os
import tempfile

import testtools

from nova_gpu.core import exceptions
from nova_gpu.sim import power
from nova_gpu.sim import trace

H = 3600


def write(directory, name, header, rows):
    path = os.path.join(directory, name)
    with open(path, 'w') as f:
        f.write(header + '\n')
        for row in rows:
            f.write(','.join(str(x) for x in row) + '\n')
    return path


TASK_HEADER = ('name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,'
               'creation_time,deletion_time')


class TestPower(testtools.TestCase):

    def setUp(self):
        super().setUp()
        self.dir = self.useFixture(_TempDir()).path
        self.nodes = trace.load_nodes(write(
            self.dir, 'nodes.csv', 'sn,cpu_milli,memory_mib,gpu,model',
            [('a', 64000, 262144, 2, 'T4'), ('b', 64000, 262144, 2, 'T4')]))

    def tasks(self, rows):
        path = write(self.dir, 'tasks.csv', TASK_HEADER, rows)
        tasks = trace.load_tasks(path)
        return (tasks,) + power.load_lifetimes(path, tasks)

    def test_idle_gpu_hours_exact(self):
        tasks, c, d = self.tasks([
            ('t0', 1000, 1024, 1, 500, '', 1 * H, 3 * H),
            ('t1', 1000, 1024, 1, 500, '', 4 * H, ''),
            ('cpu', 1000, 1024, 0, 0, '', 0, 9 * H)])
        r = power.replay_power(self.nodes, tasks, c, d, 'bestfit',
                               samples=5)
        # Measured from the first to the last arrival (1..4 h), CPU-only
        # tasks left out. One host runs t0 from 1 h to 3 h: 2 GPUs idle
        # for 2 h, then 4 GPUs for 1 h.
        self.assertEqual(2 * 2 + 4 * 1, round(r.idle_gpu_hours, 6))
        self.assertEqual((2, 0), (r.placed, r.refused))
        self.assertEqual([2, 1, 1, 2, 2], [s[1] for s in r.samples])
        self.assertEqual(4.0, r.samples[-1][0])

    def test_consolidation_drains_the_light_host(self):
        rows = [('big', 1000, 1024, 1, 800, '', 0, 10 * H),
                ('small', 1000, 1024, 1, 200, '', 60, 10 * H),
                ('last', 1000, 1024, 1, 100, '', 10 * H, 11 * H)]
        tasks, c, d = self.tasks(rows)
        plain = power.replay_power(self.nodes, tasks, c, d, 'nova')
        self.assertEqual(0, round(plain.idle_gpu_hours))  # spread: both on
        packed = power.replay_power(self.nodes, tasks, c, d, 'nova',
                                    consolidate=True, period_s=H,
                                    light=0.3)
        self.assertEqual((1, 1), (packed.drains, packed.migrations))
        # Drained at 1 h: 2 GPUs idle until 10 h.
        self.assertEqual(18, round(packed.idle_gpu_hours))
        self.assertEqual(plain.placed, packed.placed)
        self.assertEqual(16384 * 200 // 1000 / 1024, packed.memory_moved_gib)

    def test_multi_gpu_tasks_do_not_move(self):
        rows = [('pair', 1000, 1024, 2, 1000, '', 0, 10 * H),
                ('small', 1000, 1024, 1, 200, '', 60, 10 * H),
                ('last', 1000, 1024, 1, 100, '', 10 * H, 11 * H)]
        tasks, c, d = self.tasks(rows)
        r = power.replay_power(self.nodes, tasks, c, d, 'nova',
                               consolidate=True, period_s=H, light=0.3)
        self.assertEqual(0, r.migrations)

    def test_defrag_makes_room_for_a_large_task(self):
        nodes = trace.load_nodes(write(
            self.dir, 'four.csv', 'sn,cpu_milli,memory_mib,gpu,model',
            [('a', 64000, 262144, 4, 'T4'), ('b', 64000, 262144, 4, 'T4'),
             ('c', 64000, 262144, 4, 'V100M16')]))
        tasks, c, d = self.tasks([
            ('s0', 1000, 1024, 1, 500, '', 0, 10 * H),
            ('s1', 1000, 1024, 1, 500, '', 1, 10 * H),
            ('s2', 1000, 1024, 1, 500, '', 2, 10 * H),
            ('quad', 1000, 1024, 4, 1000, 'T4', 3, 10 * H)])
        plain = power.replay_power(nodes, tasks, c, d, 'nova')
        self.assertEqual((1, 1), (plain.refused, plain.large_refused))
        moved = power.replay_power(nodes, tasks, c, d, 'nova', defrag=True)
        self.assertEqual((0, 0, 1), (moved.refused, moved.large_refused,
                                     moved.defragmented))
        # One T4 task moved to the other T4 host, never to the V100 one.
        self.assertEqual((1, 0), (moved.migrations, moved.evictions))
        self.assertEqual(4, moved.placed)

    def test_lifetimes_validated(self):
        e = self.assertRaises(exceptions.InvalidRequest, self.tasks,
                              [('t', 1, 1, 1, 100, '', 50, 10)])
        self.assertIn('deleted (10.0) before it is created (50.0)', str(e))
        e = self.assertRaises(exceptions.InvalidRequest, self.tasks,
                              [('t', 1, 1, 1, 100, '', 'soon', 10)])
        self.assertIn("must be numbers, got 'soon'", str(e))
        path = write(self.dir, 'old.csv',
                     'name,cpu_milli,memory_mib,num_gpu,gpu_milli',
                     [('t', 1, 1, 1, 100)])
        e = self.assertRaises(exceptions.InvalidRequest,
                              power.load_lifetimes, path,
                              trace.load_tasks(path))
        self.assertIn('lacks column(s) creation_time, deletion_time',
                      str(e))

    def test_at_load_keeps_order_and_lifetimes(self):
        tasks, c, d = self.tasks([
            ('t0', 1000, 1024, 1, 1000, '', 0, 100),
            ('t1', 1000, 1024, 1, 500, '', 5, 25),
            ('t2', 1000, 1024, 0, 0, '', 1, 2)])
        out, arrive, leave = power.at_load(tasks, c, d,
                                           self.nodes.total_gpu_milli, 0.5,
                                           repeat=2, cap_quantile=1.0)
        self.assertEqual(['t0-0', 't2-0', 't1-0', 't0-1', 't2-1', 't1-1'],
                         out.names)
        self.assertEqual([100, 1, 20] * 2,
                         [round(x) for x in leave - arrive])
        self.assertTrue((arrive[1:] >= arrive[:-1]).all())
        # Little's law: the GPU work over the arrival span is the load.
        gpu = out.num_gpu > 0
        work = float((out.milli * (leave - arrive))[gpu].sum())
        rate = gpu.sum() / arrive[-1]
        self.assertLess(abs(work / gpu.sum() * rate
                            / self.nodes.total_gpu_milli - 0.5), 0.45)
        self.assertRaises(exceptions.InvalidRequest, power.at_load, tasks,
                          c, d, 1000, 0)


class _TempDir:
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.path = self._tmp.name

    def cleanUp(self):
        self._tmp.cleanup()

    def getDetails(self):
        return {}
