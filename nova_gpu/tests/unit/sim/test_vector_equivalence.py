"""The simulator's vectorised scoring is the core's scalar rule.

``nova_gpu.sim.state.frag_of`` and ``nova_gpu.sim.policies`` evaluate the
fragmentation measure and our placement cost for many nodes at once; the
scheduler engine uses ``nova_gpu.core.fragmentation.host_fragmentation``
and ``nova_gpu.core.scoring.host_placement_cost`` one host at a time.
Random cluster states must give the same numbers both ways.
"""

import random

import numpy as np
import testtools

from nova_gpu.core import catalog as catalog_mod
from nova_gpu.core import fragmentation
from nova_gpu.core import host as host_mod
from nova_gpu.core import request as request_mod
from nova_gpu.core import scoring
from nova_gpu.sim import policies
from nova_gpu.sim import state
from nova_gpu.sim import trace

MODELS = ('T4', 'A100-40GB')
CATALOG = catalog_mod.load_catalog()


def random_typical(rng):
    items = []
    for _ in range(rng.randint(3, 9)):
        kind = rng.choice(('cpu', 'share', 'share', 'whole'))
        spec = rng.choice((None, None, frozenset({'T4'}),
                           frozenset(MODELS)))
        cpu = rng.choice((0, 2000, 6000, 12000, 30000))
        mem = rng.choice((0, 8192, 30000, 90000))
        if kind == 'cpu':
            items.append(trace.Typical(cpu, mem, 0, 0, None, rng.random()))
        elif kind == 'share':
            items.append(trace.Typical(cpu, mem, 1, rng.randrange(50, 1000,
                                                                  10),
                                       spec, rng.random()))
        else:
            items.append(trace.Typical(cpu, mem, rng.choice((1, 2, 4, 8)),
                                       1000, spec, rng.random()))
    total = sum(t.weight for t in items)
    return [trace.Typical(t.cpu, t.memory, t.num_gpu, t.milli, t.spec,
                          t.weight / total) for t in items]


def core_demand(typical, memory):
    items = []
    for t in typical:
        if not t.milli:
            req = None
        elif t.milli < host_mod.MILLI:
            req = request_mod.GpuRequest(
                host_mod.SHARE, milli=t.milli, cpu_milli=t.cpu,
                memory_mib=t.memory if memory else 0, models=t.spec)
        else:
            req = request_mod.GpuRequest(
                host_mod.WHOLE, count=t.num_gpu, cpu_milli=t.cpu,
                memory_mib=t.memory if memory else 0, models=t.spec)
        items.append(fragmentation.DemandItem(req, t.weight))
    return fragmentation.Demand(items)


def random_cluster(rng, n=12):
    specs = [(rng.choice((16000, 64000, 96000)),
              rng.choice((65536, 262144, 393216)),
              rng.choice((1, 2, 4, 8)), rng.choice(MODELS))
             for _ in range(n)]
    nodes = trace.Nodes(['n%d' % i for i in range(n)],
                        np.array([s[0] for s in specs]),
                        np.array([s[1] for s in specs]),
                        np.array([s[2] for s in specs]),
                        [s[3] for s in specs])
    cluster = state.Cluster(nodes)
    hosts = []
    for i, (cpu, mem, ngpu, model) in enumerate(specs):
        gpus = [host_mod.Gpu(g, CATALOG.model(model)) for g in range(ngpu)]
        host = host_mod.Host(nodes.names[i], gpus, cpu, mem)
        for g in range(ngpu):
            pick = rng.random()
            if pick < 0.3:
                gpus[g].take(host_mod.Slot(g, host_mod.WHOLE))
                cluster.left[i, g] = 0
            elif pick < 0.7:
                milli = rng.randrange(10, 1000, 10)
                gpus[g].take(host_mod.Slot(g, host_mod.SHARE, milli))
                cluster.left[i, g] -= milli
        host.cpu_used = rng.randrange(0, cpu + 1, 1000)
        host.memory_used = rng.randrange(0, mem + 1, 1024)
        cluster.cpu[i] = host.cpu_free
        cluster.mem[i] = host.memory_free
        hosts.append(host)
    cluster.recount()
    return cluster, hosts


class FragmentationEquivalenceTest(testtools.TestCase):

    def test_vectorised_equals_scalar_on_random_states(self):
        rng = random.Random(2023)
        for trial in range(40):
            memory = bool(trial % 2)
            typical = random_typical(rng)
            cluster, hosts = random_cluster(rng)
            demand = state.DemandArrays(typical, cluster.model_names,
                                        memory=memory)
            frag = cluster.track(demand)[3]
            core = core_demand(typical, memory)
            for i, host in enumerate(hosts):
                self.assertAlmostEqual(
                    fragmentation.host_fragmentation(host, core), frag[i],
                    places=6, msg='trial %d node %d' % (trial, i))

    def test_one_node_twins_equal_the_vectorised_rule(self):
        # ``counters_one`` and ``frag_one`` (Python numbers, one node, as
        # ``Cluster._refresh`` and ``OursPolicy._one`` use them).
        rng = random.Random(31)
        for trial in range(20):
            typical = random_typical(rng)
            cluster, _hosts = random_cluster(rng)
            demand = state.DemandArrays(typical, cluster.model_names,
                                        memory=bool(trial % 2))
            cnt, lost = cluster._counters(cluster.left, demand.thresholds)
            frag = state.frag_of(demand, cluster.model, cluster.cpu,
                                 cluster.mem, cluster.total, cnt, lost)
            for i in range(len(frag)):
                c, lo = state.counters_one(cluster.left[i].tolist(),
                                           demand.threshold_list)
                self.assertEqual(cnt[i].tolist(), c)
                self.assertEqual(lost[i].tolist(), lo)
                # To the last bit: BestPerNode mixes values of both.
                self.assertEqual(
                    frag[i], state.frag_one(
                        demand, int(cluster.model[i]), int(cluster.cpu[i]),
                        int(cluster.mem[i]), int(cluster.total[i]), c, lo),
                    'trial %d node %d' % (trial, i))

    def test_pairwise_sum_is_numpys_row_sum(self):
        rng = random.Random(5)
        for n in list(range(1, 41)) + [127, 128, 129, 300]:
            values = [rng.random() * rng.choice((1, 1000, 1e6))
                      for _ in range(n)]
            rows = np.array([values, values])
            self.assertEqual(np.add.reduce(rows, 1)[1],
                             state.pairwise_sum(list(values)), n)

    def test_incremental_state_matches_recomputation(self):
        rng = random.Random(7)
        typical = random_typical(rng)
        cluster, hosts = random_cluster(rng)
        demand = state.DemandArrays(typical, cluster.model_names)
        entry = cluster.track(demand)
        for i in range(len(hosts)):
            free = np.flatnonzero(cluster.left[i] >= 100)
            if len(free) and cluster.cpu[i] >= 1000:
                cluster.allocate(i, 1000, 0, (int(free[0]),), 100)
        fresh = state.Cluster(cluster.nodes)
        fresh.left, fresh.cpu, fresh.mem = (cluster.left.copy(),
                                            cluster.cpu.copy(),
                                            cluster.mem.copy())
        fresh.recount()
        np.testing.assert_allclose(fresh.track(demand)[3], entry[3])


class CostEquivalenceTest(testtools.TestCase):

    def test_policy_cost_equals_core_scoring(self):
        rng = random.Random(11)
        weights = scoring.DEFAULT_WEIGHTS
        for trial in range(25):
            typical = random_typical(rng)
            cluster, hosts = random_cluster(rng)
            policy = policies.OursPolicy()
            policy.setup(cluster, typical, typical)
            core = core_demand(typical, memory=False)
            num = rng.choice((0, 1, 1, 2))
            milli = (rng.randrange(50, 1000, 10) if num == 1
                     and rng.random() < 0.7 else (1000 if num else 0))
            task = (rng.choice((0, 2000, 8000)), rng.choice((0, 4096)),
                    num, milli)
            mask = cluster.feasible(*task, np.ones(len(MODELS), bool))
            nodes = np.flatnonzero(mask)
            if not len(nodes):
                continue
            node, gpu, delta, total = policies.candidates(
                cluster, policy.entry, task, nodes)
            share = bool(num) and milli < host_mod.MILLI
            unit_free = cluster.left[node, gpu] if share else 0
            vector = scoring.placement_cost(
                weights, policy.strand, delta, cluster.left[node].sum(1),
                total, cluster.cpu[node], cluster.cpu[node] - task[0],
                cluster.mem[node], cluster.mem[node] - task[1], unit_free,
                policy.reserve[cluster.model[node]],
                unit_free - milli if share else None)
            reserve = scoring.ModelReserve(
                [(t.spec, t.weight * t.num_gpu * t.milli)
                 for t in typical if t.milli],
                {m: int(cluster.ngpu[cluster.model == i].sum())
                 for i, m in enumerate(cluster.model_names)})
            for k, n in enumerate(node):
                host = hosts[n]
                if share:
                    slots = (host_mod.Slot(int(gpu[k]), host_mod.SHARE,
                                           milli),)
                elif num:
                    slots = tuple(host_mod.Slot(g, host_mod.WHOLE)
                                  for g in policies.exclusive_gpus(
                                      cluster.left[n], num))
                else:
                    slots = ()
                placement = host_mod.Assignment(host.name, slots, None,
                                                task[0], task[1])
                scalar = scoring.host_placement_cost(
                    host, placement, core, policy.strand, weights, reserve)
                self.assertAlmostEqual(scalar, vector[k], places=6,
                                       msg='trial %d node %d' % (trial, n))
