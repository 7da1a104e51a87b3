"""The policies' per-node memo (``BestPerNode``) is exhaustive scoring.

``BestPerNode`` keeps each node's best candidate per task shape until the
node changes; scoring every candidate of every feasible node on every
task must choose the same node and GPU, on random clusters and task
sequences that repeat shapes (so the memo is used) and change nodes (so
it must be refreshed).
"""

import random

import numpy as np
import testtools

from nova_gpu.core import host as host_mod
from nova_gpu.sim import policies
from nova_gpu.sim import state
from tests.unit.sim import test_vector_equivalence as vector


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
