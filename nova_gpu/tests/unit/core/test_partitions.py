"""NVSwitch partitions (Shared NVSwitch mode) in the core and the engine."""

import hypothesis as hyp
from hypothesis import strategies as hyp_st

from nova_gpu.core import engine as engine_mod
from nova_gpu.core import exceptions
from nova_gpu.core import fixtures
from nova_gpu.core import fragmentation as frag
from nova_gpu.core import host as H
from nova_gpu.core import partitions as P
from nova_gpu.core import request as R
from nova_gpu.tests.unit.core import base

BOARD = 'HGX-H100-8GPU'


def whole(count, **kw):
    return R.GpuRequest(H.WHOLE, count=count, **kw)


def take(host, *indices):
    host.allocate(H.Assignment(host.name, tuple(
        H.Slot(i, H.WHOLE) for i in indices)))


class PublishedTableTest(base.TestCase):

    def test_hgx_h100_table(self):
        count, parts = P.published(BOARD)
        self.assertEqual(8, count)
        self.assertEqual(15, len(parts))
        sizes = {}
        for pid, modules in parts:
            sizes.setdefault(len(modules), []).append(pid)
        self.assertEqual({8: [0], 4: [1, 2], 2: [3, 4, 5, 6],
                          1: list(range(7, 15))}, sizes)
        # Every GPU is in exactly one partition of each size.
        for size, ids in sizes.items():
            modules = sorted(m for pid, mods in parts if pid in ids
                             for m in mods)
            self.assertEqual(list(range(1, 9)), modules, size)
        # The pairs are modules 1+3, 2+4, 5+7, 6+8, not 1+2, ...
        # (nvswitch_partitions.yaml names the sources).
        self.assertEqual({3: [1, 3], 4: [2, 4], 5: [5, 7], 6: [6, 8]},
                         {pid: mods for pid, mods in parts
                          if len(mods) == 2})

    def test_unknown_board_is_named(self):
        err = self.assertRaises(exceptions.InvalidRequest, P.published,
                                'HGX-Z9')
        self.assertIn('HGX-Z9', str(err))
        self.assertIn(BOARD, str(err))

    def test_module_order_maps_to_host_indices(self):
        table = P.published_table(BOARD, gpu_order=[8, 7, 6, 5, 4, 3, 2, 1])
        self.assertEqual(frozenset({5, 7}), table.find([5, 7]).gpus)
        self.assertEqual(3, table.find([5, 7]).id)  # modules 3, 1
        self.assertIsNone(table.find([6, 7]))        # modules 2, 1


class TableValidationTest(base.TestCase):

    def test_bad_tables_are_named(self):
        for parts, words in (
                ([P.Partition(1, {0}), P.Partition(1, {1})], 'listed twice'),
                ([P.Partition(1, set())], 'no GPUs'),
                ([P.Partition(1, {0, 9})], 'names GPU 9'),
                ([P.Partition(1, {0, 1}, active=True),
                  P.Partition(2, {1, 2}, active=True)],
                 'both active and share GPU 1')):
            err = self.assertRaises(exceptions.InvalidRequest,
                                    P.PartitionTable, parts, 8)
            self.assertIn(words, str(err))

    def test_active_partition_blocks_overlapping_ones(self):
        table = P.published_table(BOARD, active={4})   # GPUs 1, 3
        self.assertEqual(frozenset({1, 3}), table.blocked)
        self.assertIsNone(table.partition_for([1, 3]))   # already active
        self.assertIsNone(table.partition_for(range(4)))  # overlaps
        self.assertIsNone(table.partition_for([1]))
        self.assertEqual(3, table.partition_for([0, 2]).id)
        self.assertEqual([], [p.id for p in table.available(8)])


class EnginePartitionTest(base.TestCase):

    def setUp(self):
        super().setUp()
        self.engine = engine_mod.PlacementEngine()

    def host(self, **kw):
        return fixtures.hgx_host('h', self.model('H100-80GB'),
                                 partitions=P.published_table(BOARD, **kw))

    def test_two_gpus_keep_four_gpu_partitions_free(self):
        host = self.host()
        take(host, 4)   # breaks partition 2 (GPUs 4-7) and 5 (4, 6)
        best = self.engine.best(host, whole(2))
        # The pair left in the broken 4-GPU partition, not one that
        # would break partition 1 (GPUs 0-3) as well.
        self.assertEqual((5, 7), best.placement.gpus)
        # Every choice is a partition.
        sets = {c.placement.gpus for c in self.engine.rank(host, whole(2))}
        self.assertEqual({(0, 2), (1, 3), (5, 7)}, sets)

    def test_without_partitions_any_nvlink_set_goes(self):
        host = fixtures.hgx_host('h', self.model('H100-80GB'))
        take(host, 1, 2)
        choices = self.engine.rank(host, whole(2, topology='nvlink'))
        self.assertIn((0, 3), {c.placement.gpus for c in choices})
        # The same state on a Shared NVSwitch host: GPUs 0 and 3 form no
        # partition, and the pairs with a GPU taken are not free.
        host = self.host()
        take(host, 1, 2)
        choices = self.engine.rank(host, whole(2, topology='nvlink'))
        self.assertEqual({(4, 6), (5, 7)},
                         {c.placement.gpus for c in choices})

    def test_single_gpu_takes_a_broken_pair_first(self):
        host = self.host()
        take(host, 5)
        self.assertEqual((7,), self.engine.best(host,
                                                whole(1)).placement.gpus)

    def test_unsupported_partition_is_never_chosen(self):
        host = self.host(unsupported={3, 4})   # pairs 0-2 and 1-3
        take(host, 4)
        best = self.engine.best(host, whole(2))
        self.assertEqual((5, 7), best.placement.gpus)
        take(host, 5)
        err = self.assertRaises(exceptions.NoFit, self.engine.best,
                                host, whole(2))
        self.assertIn('no free NVSwitch partition of 2 GPUs', str(err))
        # Placement's candidates are judged by the same rule.
        self.assertIsNone(self.engine.evaluate(host, whole(2), (0, 2)))
        self.assertIsNotNone(self.engine.evaluate(host, whole(1), (0,)))

    def test_gpu_in_active_partition_excludes_overlapping(self):
        # Partition 4 (GPUs 1, 3) is active: its GPUs are a guest's even
        # before the scheduler hears of the guest.
        host = self.host(active={4})
        sets = {c.placement.gpus for c in self.engine.rank(host, whole(2))}
        self.assertEqual({(0, 2), (4, 6), (5, 7)}, sets)
        self.assertEqual([(4, 5, 6, 7)], [
            c.placement.gpus for c in self.engine.rank(host, whole(4))])
        self.assertEqual([], self.engine.rank(host, whole(8)))
        self.assertIsNone(self.engine.evaluate(host, whole(4),
                                               (0, 1, 2, 3)))

    def test_size_without_partition_is_refused_with_reason(self):
        host = self.host()
        self.assertEqual([], self.engine.rank(host, whole(3)))
        self.assertIn('no NVSwitch partition of 3 GPUs',
                      self.engine.why_not(host, whole(3)))

    def test_vgpu_requests_ignore_partitions(self):
        host = self.host()
        choices = self.engine.rank(host, R.GpuRequest(H.VGPU, 'H100-40C'))
        self.assertTrue(choices)

    def test_demand_prefers_keeping_larger_partitions(self):
        # The fragmentation measure sees partitions: with 4-GPU demand,
        # breaking the last free 4-GPU partition loses all free capacity
        # to it.
        demand = frag.Demand([frag.DemandItem(whole(4), 1),
                              frag.DemandItem(whole(2), 1)])
        engine = engine_mod.PlacementEngine(demand)
        host = self.host()
        take(host, 4)
        before = frag.host_fragmentation(host, demand)
        by_set = {c.placement.gpus: c for c in engine.rank(host, whole(2))}
        self.assertEqual(0.0, by_set[(5, 7)].frag_delta)
        self.assertGreater(by_set[(0, 2)].frag_delta, 2.0)
        self.assertEqual((5, 7), engine.best(host, whole(2)).placement.gpus)
        take(host, 0, 2)
        after = frag.host_fragmentation(host, demand)
        self.assertAlmostEqual(by_set[(0, 2)].frag_delta,
                               (after - before) / H.MILLI)

    def test_host_copy_and_content_keep_partitions(self):
        host = self.host(unsupported={3})
        self.assertEqual(host.partitions, host.copy().partitions)
        plain = fixtures.hgx_host('h', self.model('H100-80GB'))
        self.assertNotEqual(plain.content(), host.content())


@hyp_st.composite
def partition_host(draw):
    """An HGX H100 host in Shared NVSwitch mode, random partitions
    unsupported or active, random GPUs taken (whole or by vGPU).
    """
    unsupported = draw(hyp_st.sets(hyp_st.integers(0, 14), max_size=5))
    table = P.published_table(BOARD, unsupported=unsupported)
    # One active partition at most, overlapping nothing (as FM allows).
    active = draw(hyp_st.one_of(hyp_st.none(),
                                hyp_st.sampled_from(table.partitions)))
    if active is not None:
        table = P.published_table(BOARD, unsupported=unsupported,
                                  active={active.id})
    host = fixtures.hgx_host('h', base.CATALOG.model('H100-80GB'),
                             partitions=table)
    for i in draw(hyp_st.sets(hyp_st.integers(0, 7), max_size=5)):
        if draw(hyp_st.booleans()):
            take(host, i)
        else:
            host.gpus[i].take(H.Slot(i, H.VGPU, 'H100-20C'))
    return host


class PartitionFragmentationPropertyTest(base.TestCase):
    """The engine's incremental measure equals ``host_fragmentation`` on
    Shared NVSwitch hosts, and every choice is an activatable partition.
    """

    @hyp.settings(max_examples=150, deadline=None)
    @hyp.given(partition_host(), hyp_st.data())
    def test_engine_delta_equals_host_fragmentation(self, host, data):
        counts = data.draw(hyp_st.lists(hyp_st.sampled_from((1, 2, 4, 8)),
                                        min_size=1, max_size=4))
        demand = frag.Demand([frag.DemandItem(whole(c), 1) for c in counts]
                             + [frag.DemandItem(
                                 R.GpuRequest(H.VGPU, 'H100-20C'), 1)])
        req = whole(data.draw(hyp_st.sampled_from((1, 2, 4, 8))))
        engine = engine_mod.PlacementEngine(demand)
        before = frag.host_fragmentation(host, demand)
        for choice in engine.rank(host, req):
            gpus = choice.placement.gpus
            self.assertIsNotNone(host.partitions.partition_for(gpus))
            self.assertTrue(all(host.gpus[i].is_free for i in gpus))
            host.allocate(choice.placement)
            after = frag.host_fragmentation(host, demand)
            host.free(choice.placement)
            self.assertAlmostEqual((after - before) / H.MILLI,
                                   choice.frag_delta, places=9)
