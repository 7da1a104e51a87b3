from nova_gpu.core import engine as engine_mod
from nova_gpu.core import exceptions
from nova_gpu.core import fixtures
from nova_gpu.core import fragmentation as frag
from nova_gpu.core import host as H
from nova_gpu.core import request as R
from nova_gpu.tests.unit.core import base


def req(*args, **kw):
    return R.GpuRequest(*args, **kw)


class RequestTest(base.TestCase):

    def test_invalid_requests_are_named(self):
        for kwargs, words in (
                ({'kind': 'magic'}, 'unknown request kind'),
                ({'kind': 'whole', 'count': 0}, 'count'),
                ({'kind': 'share', 'milli': 1500}, '1..1000'),
                ({'kind': 'whole', 'milli': 10}, 'milli'),
                ({'kind': 'mig'}, 'needs a profile'),
                ({'kind': 'whole', 'profile': 'x'}, 'takes no profile'),
                ({'kind': 'whole', 'topology': 'ring'}, 'topology'),
                ({'kind': 'whole', 'numa_affinity': 'maybe'}, 'NUMA'),
                ({'kind': 'whole', 'cpu_milli': -1}, 'negative'),
                ({'kind': 'whole', 'models': []}, 'empty model list')):
            err = self.assertRaises(exceptions.InvalidRequest,
                                    R.GpuRequest, **kwargs)
            self.assertIn(words, str(err))


class EngineTest(base.TestCase):

    def setUp(self):
        super().setUp()
        self.demand = frag.Demand([
            frag.DemandItem(req('vgpu', 'A100-10C'), 2),
            frag.DemandItem(req('vgpu', 'A100-20C'), 1),
            frag.DemandItem(req('whole', count=2), 1),
            frag.DemandItem(req('mig', '4g.20gb'), 1),
            frag.DemandItem(req('mig', '1g.5gb'), 1)])
        self.engine = engine_mod.PlacementEngine(self.demand)

    def a100(self, **kw):
        return fixtures.hgx_host('h', self.model('A100-40GB'), **kw)

    def test_vgpu_packs_onto_the_gpu_already_serving_the_profile(self):
        host = self.a100()
        first = self.engine.best(host, req('vgpu', 'A100-10C'))
        host.allocate(first.placement)
        second = self.engine.best(host, req('vgpu', 'A100-10C'))
        self.assertEqual(first.placement.gpus, second.placement.gpus)

    def test_other_profile_avoids_used_gpu(self):
        host = self.a100()
        host.allocate(self.engine.best(host, req('vgpu',
                                                 'A100-10C')).placement)
        used = host.gpus[0]
        choice = self.engine.best(host, req('vgpu', 'A100-20C'))
        self.assertNotIn(used.index, choice.placement.gpus)
        for c in self.engine.rank(host, req('vgpu', 'A100-20C')):
            self.assertNotIn(used.index, c.placement.gpus)

    def test_mig_start_keeps_big_profiles_possible(self):
        host = self.a100(mig=True)
        choice = self.engine.best(host, req('mig', '1g.5gb'))
        (slot,) = choice.placement.slots
        # 1g.5gb at slice 0 would rule out 4g.20gb (only at 0) on that GPU.
        self.assertNotEqual(0, slot.detail[1])

    def test_every_mig_choice_is_a_valid_nvidia_placement(self):
        host = self.a100(mig=True)
        profile = self.model('A100-40GB').mig_profile('3g.20gb')
        host.allocate(self.engine.best(host, req('mig', '3g.20gb'))
                      .placement)
        for c in self.engine.rank(host, req('mig', '3g.20gb')):
            (slot,) = c.placement.slots
            self.assertIn(slot.detail[1], profile.starts)
            self.assertIn(slot.detail[1],
                          host.gpus[slot.gpu].mig_starts(profile))

    def test_mig_backed_vgpu_takes_a_mig_slot(self):
        host = self.a100(mig=True)
        choice = self.engine.best(host, req('vgpu', 'A100-3-20C'))
        (slot,) = choice.placement.slots
        self.assertEqual(H.MIG, slot.kind)
        self.assertEqual('3g.20gb', slot.detail[0])
        self.assertEqual('A100-3-20C', slot.detail[2])

    def test_nvlink_set_is_connected(self):
        cat = self.catalog
        host = fixtures.pcie_host('p', cat.model('L40S'), gpus=4)
        r = req('whole', count=2, topology='nvlink')
        self.assertEqual([], self.engine.rank(host, r))
        err = self.assertRaises(exceptions.NoFit, self.engine.best, host, r)
        self.assertIn('topology=nvlink', str(err))
        ok = self.engine.best(fixtures.hgx_host('x', cat.model('H100-80GB')),
                              r)
        self.assertEqual(2, len(ok.placement.gpus))

    def test_numa_topology_is_strict(self):
        host = fixtures.pcie_host('p', self.model('L40S'), gpus=4)
        # Leave one free GPU on each NUMA node.
        host.allocate(H.Assignment('p', (H.Slot(0, H.WHOLE),
                                         H.Slot(2, H.WHOLE))))
        r = req('whole', count=2, topology='numa')
        self.assertEqual([], self.engine.rank(host, r))
        loose = self.engine.best(host, req('whole', count=2))
        self.assertEqual((1, 3), loose.placement.gpus)
        self.assertEqual(2.0 + 0.1, loose.topology)

    def test_whole_gpus_prefer_one_numa_node(self):
        host = self.a100()
        choice = self.engine.best(host, req('whole', count=4))
        self.assertEqual(1, len({host.gpus[i].numa_node
                                 for i in choice.placement.gpus}))

    def test_numa_affinity_require_and_prefer(self):
        host = fixtures.pcie_host('p', self.model('L40S'), gpus=4,
                                  cpu_milli=16000, memory_mib=64000)
        # NUMA node 0 has no room for 6 CPUs any more.
        host.allocate(H.Assignment('p', (), 0, 5000, 0))
        r = req('whole', cpu_milli=6000, memory_mib=1000,
                numa_affinity='require')
        for c in self.engine.rank(host, r):
            self.assertEqual(1, c.placement.numa_node)
            self.assertEqual(1, host.gpus[c.placement.gpus[0]].numa_node)
        prefer = self.engine.rank(host, req('whole', cpu_milli=6000,
                                            numa_affinity='prefer'))
        self.assertEqual(4, len(prefer))
        self.assertEqual(1, prefer[0].placement.numa_node)
        self.assertEqual(1.0, prefer[-1].numa)

    def test_models_constraint(self):
        host = self.a100()
        r = req('whole', models={'H100-80GB'})
        err = self.assertRaises(exceptions.NoFit, self.engine.best, host, r)
        self.assertIn('no GPU of model H100-80GB', str(err))
        self.assertTrue(self.engine.rank(host, req(
            'whole', models={'A100'})))  # aliases count

    def test_no_fit_names_cpu(self):
        host = self.a100()
        err = self.assertRaises(exceptions.NoFit, self.engine.best, host,
                                req('whole', cpu_milli=10 ** 9))
        self.assertIn('CPU', err.reason)

    def test_no_fit_names_profile(self):
        host = fixtures.pcie_host('p', self.model('T4'), gpus=1)
        host.allocate(H.Assignment('p', (H.Slot(0, H.VGPU, 'T4-8C'),)))
        err = self.assertRaises(exceptions.NoFit, self.engine.best, host,
                                req('vgpu', 'T4-4C'))
        self.assertIn('T4-4C', err.reason)

    def test_rank_leaves_state_untouched(self):
        host = self.a100(mig=True)
        before = host.snapshot()
        self.engine.rank(host, req('mig', '2g.10gb'))
        self.assertEqual(before, host.snapshot())

    def test_fragmentation_matches_scalar_measure(self):
        # The incremental bookkeeping must agree with the plain formula.
        host = self.a100()
        r = req('vgpu', 'A100-20C')
        for choice in self.engine.rank(host, r):
            before = frag.host_fragmentation(host, self.demand)
            host.allocate(choice.placement)
            after = frag.host_fragmentation(host, self.demand)
            host.free(choice.placement)
            self.assertAlmostEqual((after - before) / 1000,
                                   choice.frag_delta)


class EngineScoringTest(base.TestCase):
    """The engine costs choices with the same function the simulator uses."""

    def test_share_costs_equal_core_scoring(self):
        from nova_gpu.core import scoring
        model = self.model('T4')
        host = H.Host('t', [H.Gpu(i, model) for i in range(4)], 32000,
                      128000)
        for i, milli in enumerate((810, 500, 250)):
            host.allocate(H.Assignment('t', (H.Slot(i, H.SHARE, milli),),
                                       None, 4000, 8000))
        demand = frag.Demand([
            frag.DemandItem(req('share', milli=500, cpu_milli=4000), 3),
            frag.DemandItem(req('share', milli=200, cpu_milli=2000), 2),
            frag.DemandItem(req('whole', cpu_milli=8000), 2)])
        engine = engine_mod.PlacementEngine(demand)
        strand = scoring.StrandModel.from_demand(demand)
        ranked = engine.rank(host, req('share', milli=190, cpu_milli=1000,
                                       memory_mib=500))
        self.assertEqual(4, len(ranked))
        for choice in ranked:
            expected = scoring.host_placement_cost(host, choice.placement,
                                                   demand, strand)
            self.assertAlmostEqual(
                scoring.DEFAULT_WEIGHTS.quantum * expected, choice.cost)
        # The 190 share fills GPU 0's 190-milli sliver exactly.
        self.assertEqual((0,), ranked[0].placement.gpus)


class TieBreakTest(base.TestCase):
    """Equally good choices: which one a decision takes (issue 25)."""

    def test_draws_cover_every_choice_evenly(self):
        for count in (1, 2, 3, 8):
            picks = [engine_mod.tie_break(count, (n + 0.5) / (4 * count))
                     for n in range(4 * count)]
            self.assertEqual({i: 4 for i in range(count)},
                             {i: picks.count(i) for i in set(picks)})

    def test_bounds(self):
        self.assertEqual(0, engine_mod.tie_break(0, 0.7))
        self.assertEqual(0, engine_mod.tie_break(1, 0.99))
        self.assertEqual(0, engine_mod.tie_break(5, 0.0))
        self.assertEqual(4, engine_mod.tie_break(5, 0.9999999999))
        # A draw of 1.0 (outside [0, 1)) still names a choice.
        self.assertEqual(4, engine_mod.tie_break(5, 1.0))

    def test_equal_costs_are_equally_good_best_fit_is_not(self):
        model = self.model('A100-40GB')
        host = H.Host('t', [H.Gpu(i, model) for i in range(3)], 32000,
                      128000)
        host.allocate(H.Assignment('t', (H.Slot(2, H.VGPU, 'A100-10C'),),
                                   None, 0, 0))
        engine = engine_mod.PlacementEngine(frag.Demand([
            frag.DemandItem(req('vgpu', 'A100-10C'), 1)]))
        by_gpu = {c.placement.gpus: c
                  for c in engine.rank(host, req('vgpu', 'A100-10C'))}
        # GPUs 0 and 1 are in the same state: the policy cannot tell them
        # apart. GPU 2 leaves less free (best fit): better, not equal.
        self.assertTrue(engine_mod.equally_good(by_gpu[(0,)], by_gpu[(1,)]))
        self.assertFalse(engine_mod.equally_good(by_gpu[(0,)],
                                                 by_gpu[(2,)]))
        self.assertLess(by_gpu[(2,)].cost, by_gpu[(0,)].cost)
        noisy = by_gpu[(0,)]._replace(cost=by_gpu[(0,)].cost + 1e-15)
        self.assertTrue(engine_mod.equally_good(by_gpu[(0,)], noisy))
