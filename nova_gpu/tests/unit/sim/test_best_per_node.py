"""The policies' per-node memo (``BestPerNode``) is exhaustive scoring.

``BestPerNode`` keeps each node's best candidate per task shape until the
node changes; scoring every candidate of every feasible node on every
task must choose the same node and GPU, on random clusters and task
sequences that repeat shapes (so the memo is used) and change nodes (so
it must be refreshed).
"""

import random

import fixtures
import numpy as np
import testtools

from nova_gpu.core import host as host_mod
from nova_gpu.core import scoring
from nova_gpu.sim import policies
from nova_gpu.sim import state
from nova_gpu.tests.unit.sim import test_vector_equivalence as vector


def exhaustive(policy, cluster, task, mask):
    """(node, gpu) of the first lowest key over every candidate."""
    node, gpu, key = policy._keys(cluster, task, np.flatnonzero(mask))
    best = int(np.argmin(key))
    return int(node[best]), int(gpu[best])


def random_shapes(rng, count=6):
    shapes = []
    for _ in range(count):
        num = rng.choice((0, 1, 1, 1, 2))
        milli = (rng.choice((100, 230, 470, 810)) if num == 1
                 and rng.random() < 0.7 else (1000 if num else 0))
        shapes.append((rng.choice((0, 2000, 8000)),
                       rng.choice((0, 4096, 30000)), num, milli))
    return shapes


class BestPerNodeTest(testtools.TestCase):

    def check(self, policy_class, seed):
        rng = random.Random(seed)
        typical = vector.random_typical(rng)
        cluster, _hosts = vector.random_cluster(rng, n=16)
        policy = policy_class()
        policy.setup(cluster, typical, typical)
        shapes = random_shapes(rng)
        access = np.ones(len(cluster.model_names), bool)
        placed = 0
        for step in range(60):
            task = rng.choice(shapes)
            mask = cluster.feasible(*task, access)
            if not mask.any():
                continue
            # Some tasks may use only some nodes (a model restriction).
            if rng.random() < 0.3:
                mask &= np.array([rng.random() < 0.5
                                  for _ in range(len(mask))])
                if not mask.any():
                    continue
            chosen = policy.best.choose(cluster, task, mask)
            expected = exhaustive(policy, cluster, task, mask)
            self.assertEqual(expected, chosen, 'seed %d step %d task %s'
                             % (seed, step, task))
            node, gpus = policy.choose(cluster, task, mask, None)
            cluster.allocate(node, task[0], task[1], gpus, task[3])
            placed += 1
        # The sequence changed nodes the memo then had to see again.
        self.assertGreater(placed, 10)

    def test_ours_equals_exhaustive(self):
        for seed in range(8):
            self.check(policies.OursPolicy, seed)

    def test_ours_without_best_fit_equals_exhaustive(self):
        # No best-fit tie-break: GPUs of a node tie more often, and the
        # first must win in every path.
        def untight():
            return policies.OursPolicy(scoring.CostWeights(tight=0))
        for seed in range(8):
            self.check(untight, seed)

    def test_fgd_equals_exhaustive(self):
        for seed in range(8):
            self.check(policies.FgdPolicy, seed)

    def test_share_ties_go_to_the_first_gpu(self):
        rng = random.Random(3)
        typical = vector.random_typical(rng)
        cluster, _hosts = vector.random_cluster(rng, n=4)
        cluster.left[:] = 0
        cluster.left[2, 3] = cluster.left[2, 5] = host_mod.MILLI
        cluster.cpu[:] = cluster.mem[:] = 10 ** 6
        cluster.ngpu[:] = state.MAX_GPUS
        cluster.recount()
        policy = policies.OursPolicy()
        policy.setup(cluster, typical, typical)
        task = (0, 0, 1, 500)
        mask = cluster.feasible(*task, np.ones(len(cluster.model_names),
                                               bool))
        self.assertEqual((2, 3), policy.best.choose(cluster, task, mask))


def twin_cluster(rng, copies=12):
    """Nodes of three kinds, ``copies`` of each, all free: a shape's
    first task finds many stale nodes in few states (``same_state``).
    """
    kinds = [(rng.choice((16000, 64000, 96000)),
              rng.choice((65536, 262144)), rng.choice((2, 4, 8)), model)
             for model in ('T4', 'A100-40GB', 'T4')]
    specs = [kinds[i % 3] for i in range(3 * copies)]
    nodes = vector.trace.Nodes(['n%d' % i for i in range(len(specs))],
                               np.array([s[0] for s in specs]),
                               np.array([s[1] for s in specs]),
                               np.array([s[2] for s in specs]),
                               [s[3] for s in specs])
    return state.Cluster(nodes)


class PlaceTest(testtools.TestCase):
    """``place`` (no feasibility mask: infeasible nodes have infinite
    keys, the model rule is in the memo) decides as exhaustive scoring
    over ``Cluster.feasible``'s mask, and says None exactly when that mask
    is empty.
    """

    def check(self, policy_class, seed, cluster, typical):
        rng = random.Random(seed)
        policy = policy_class()
        policy.setup(cluster, typical, typical)
        shapes = random_shapes(rng, 8)
        rules = [np.ones(len(cluster.model_names), bool),
                 np.array([m == 'T4' for m in cluster.model_names])]
        placed = refused = 0
        for step in range(80):
            task = rng.choice(shapes)
            access = rng.choice(rules)
            mask = cluster.feasible(*task, access)
            got = policy.place(cluster, task, access, None)
            if not mask.any():
                self.assertIsNone(got, 'seed %d step %d' % (seed, step))
                refused += 1
                continue
            node, gpu = exhaustive(policy, cluster, task, mask)
            self.assertEqual(node, got[0], 'seed %d step %d task %s'
                             % (seed, step, task))
            if task[2] == 1 and task[3] < host_mod.MILLI:
                self.assertEqual((gpu,), got[1])
            self.assertTrue(cluster.fits(node, *task, access))
            cluster.allocate(node, task[0], task[1], got[1], task[3])
            placed += 1
        self.assertGreater(placed, 10)
        return refused

    def test_random_states(self):
        refused = 0
        for seed in range(6):
            for policy_class in (policies.OursPolicy, policies.FgdPolicy):
                rng = random.Random(100 + seed)
                typical = vector.random_typical(rng)
                cluster, _hosts = vector.random_cluster(rng, n=16)
                refused += self.check(policy_class, seed, cluster, typical)
        # Some tasks found no node: None was asserted, not only choices.
        self.assertGreater(refused, 0)

    def test_nodes_in_the_same_state(self):
        for seed in range(6):
            rng = random.Random(200 + seed)
            typical = vector.random_typical(rng)
            for policy_class in (policies.OursPolicy, policies.FgdPolicy):
                cluster = twin_cluster(rng)
                self.assertGreaterEqual(len(cluster.changed),
                                        policies.SAME_STATE_MIN)
                self.check(policy_class, seed, cluster, typical)

    def test_same_state_groups_equal_nodes(self):
        cluster = twin_cluster(random.Random(5), copies=4)
        cluster.allocate(3, 0, 0, (0,), 500)  # one node leaves its kind
        nodes = np.arange(len(cluster.changed))
        reps, which = policies.same_state(cluster, nodes)
        self.assertEqual([0, 1, 2, 3], list(reps))
        self.assertEqual([0, 1, 2, 3, 1, 2, 0, 1, 2, 0, 1, 2],
                         list(which))

    def test_same_state_survives_mixing_collisions(self):
        # Every state mixes to 0: the check finds the collision and the
        # rows themselves are compared.
        self.useFixture(fixtures.MockPatchObject(
            policies, '_STATE_MIX', np.zeros_like(policies._STATE_MIX)))
        self.test_same_state_groups_equal_nodes()
