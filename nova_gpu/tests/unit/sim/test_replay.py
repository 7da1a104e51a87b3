import os
import tempfile

import numpy as np
import testtools

from nova_gpu.sim import policies
from nova_gpu.sim import replay
from nova_gpu.sim import trace
from nova_gpu.tests.unit.sim import test_trace


def nodes_of(*specs):
    """Nodes from (cpu, memory, gpus, model) tuples."""
    return trace.Nodes(['n%d' % i for i in range(len(specs))],
                       np.array([s[0] for s in specs]),
                       np.array([s[1] for s in specs]),
                       np.array([s[2] for s in specs]),
                       [s[3] for s in specs])


def tasks_of(*specs):
    """Tasks from (cpu, memory, num_gpu, milli) tuples."""
    return trace.Tasks(['t%d' % i for i in range(len(specs))],
                       np.array([s[0] for s in specs]),
                       np.array([s[1] for s in specs]),
                       np.array([s[2] for s in specs]),
                       np.array([s[3] for s in specs]),
                       [None] * len(specs))


class SmallTraceReplayTest(testtools.TestCase):
    """Every policy yields a valid, work-conserving packing."""

    def setUp(self):
        super().setUp()
        self.nodes = trace.load_nodes(test_trace.NODES)
        self.tasks = trace.load_tasks(test_trace.TASKS)
        self.work = trace.workload(self.tasks, self.nodes.total_gpu_milli,
                                   1.3, 42)

    def audit(self, result):
        fd, path = tempfile.mkstemp(suffix='.csv')
        os.close(fd)
        self.addCleanup(os.unlink, path)
        result.write_placements(path)
        return replay.audit(self.nodes, replay.task_index(self.work), path)

    def test_every_policy_packs_validly(self):
        for name in policies.POLICIES:
            result = replay.replay(self.nodes, self.work, name, 42,
                                   typical_source=self.tasks)
            self.assertEqual([], self.audit(result), name)
            self.assertGreater(result.failed, 0, name)
            placed = sum(int(self.work.gpu_request[i])
                         for i, d in enumerate(result.decisions) if d[0] >= 0)
            self.assertEqual(placed, int(result.used[-1]), name)

    def test_audit_catches_overcommit_and_broken_spec(self):
        result = replay.replay(self.nodes, self.work, 'fgd', 42,
                               typical_source=self.tasks)
        spec_task = next(i for i, s in enumerate(self.work.spec)
                         if s == frozenset({'T4'})
                         and result.decisions[i][0] >= 0)
        g2 = self.nodes.models.index('G2')
        node, gpus, _ = result.decisions[spec_task]
        result.decisions[spec_task] = (g2, gpus, '')
        problems = self.audit(result)
        self.assertTrue(any('gpu_spec' in p for p in problems), problems)

    def test_audit_catches_a_needless_failure(self):
        result = replay.replay(self.nodes, self.work, 'bestfit', 42,
                               typical_source=self.tasks)
        first = next(i for i, d in enumerate(result.decisions) if d[0] >= 0)
        result.decisions[first] = (-1, (), 'pretend')
        problems = self.audit(result)
        self.assertTrue(any('failed but fits' in p for p in problems))

    def test_curve_rises_and_stays_below_arrival(self):
        result = replay.replay(self.nodes, self.work, 'ours', 42,
                               typical_source=self.tasks)
        curve = result.curve()
        self.assertIn(130, curve)
        values = [curve[k] for k in sorted(curve)]
        self.assertEqual(sorted(values), values)
        for k, v in curve.items():
            self.assertLessEqual(v, k + 1.5)

    def test_replay_is_deterministic(self):
        a = replay.replay(self.nodes, self.work, 'random', 7,
                          typical_source=self.tasks)
        b = replay.replay(self.nodes, self.work, 'random', 7,
                          typical_source=self.tasks)
        self.assertEqual(a.decisions, b.decisions)


class PolicyChoiceTest(testtools.TestCase):
    """Decisions small enough to check by hand."""

    def test_bestfit_fills_the_fuller_node_and_tightest_gpu(self):
        nodes = nodes_of((8000, 8192, 2, 'T4'), (8000, 8192, 2, 'T4'))
        tasks = tasks_of((1000, 1024, 1, 1000), (1000, 1024, 1, 300),
                         (1000, 1024, 1, 600))
        result = replay.replay(nodes, tasks, 'bestfit')
        # The whole GPU opens node 0; both shares follow it, the 600 on
        # the GPU where it fits tightest (the one left with 700).
        self.assertEqual([(0, (0,), ''), (0, (1,), ''), (0, (1,), '')],
                         result.decisions)

    def test_fgd_completes_a_gpu_rather_than_opening_one(self):
        nodes = nodes_of((64000, 65536, 2, 'T4'), (64000, 65536, 2, 'T4'))
        # Typical tasks (the list itself): 500-milli shares.
        tasks = tasks_of((1000, 1024, 1, 500), (1000, 1024, 1, 500),
                         (1000, 1024, 1, 500))
        result = replay.replay(nodes, tasks, 'fgd')
        self.assertEqual(result.decisions[0][0], result.decisions[1][0])
        self.assertEqual(result.decisions[0][1], result.decisions[1][1])

    def test_failure_says_why(self):
        nodes = nodes_of((4000, 4096, 1, 'T4'))
        tasks = tasks_of((8000, 1024, 1, 1000))
        result = replay.replay(nodes, tasks, 'ours')
        node, gpus, reason = result.decisions[0]
        self.assertEqual(-1, node)
        self.assertIn('0 nodes have 8000 CPU milli free', reason)
