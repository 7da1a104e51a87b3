"""Property-based tests: no allocate/free sequence breaks the invariants."""

from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from nova_gpu.core import demand as demand_mod
from nova_gpu.core import engine as engine_mod
from nova_gpu.core import exceptions
from nova_gpu.core import fixtures
from nova_gpu.core import host as H
from nova_gpu.core import request as R
from nova_gpu.tests.unit.core import base

CAT = base.CATALOG
A100 = CAT.model('A100-40GB')
ENGINE = engine_mod.PlacementEngine(demand_mod.catalog_demand(
    CAT, models={'A100-40GB'}))

REQUESTS = (
    [R.GpuRequest('vgpu', p) for p in A100.vgpu_profiles] +
    [R.GpuRequest('mig', p) for p in A100.mig.profiles] +
    [R.GpuRequest('whole', count=n, topology=t)
     for n in (1, 2, 3, 4) for t in ('any', 'numa', 'nvlink')] +
    [R.GpuRequest('share', milli=m) for m in (100, 250, 460, 810, 1000)])

# An operation: (allocate a request) or (free the i-th live placement).
OPS = st.lists(st.one_of(
    st.tuples(st.just('alloc'), st.sampled_from(REQUESTS),
              st.booleans()),
    st.tuples(st.just('free'), st.integers(0, 50), st.booleans())),
    max_size=60)


def check_gpu(test, gpu):
    test.assertGreaterEqual(gpu.free_milli, 0)
    test.assertLessEqual(gpu.used_milli, H.MILLI)
    kinds = [bool(gpu.whole), bool(gpu.share_milli), bool(gpu.vgpus),
             bool(gpu.mig_mask)]
    test.assertLessEqual(sum(kinds), 1, 'one tenancy kind per GPU')
    if gpu.vgpus:
        if not gpu.model.time_sliced_mixing:
            test.assertEqual(1, len(gpu.vgpus), 'same profile per GPU')
        for name, count in gpu.vgpus.items():
            test.assertLessEqual(count,
                                 gpu.model.vgpu_profiles[name].max_instances)
        test.assertLessEqual(gpu.vgpu_fb_mib, gpu.model.framebuffer_mib)
    mask = 0
    compute = 0
    for start, (name, at, _vgpu) in gpu.mig_instances.items():
        profile = gpu.model.mig_profile(name)
        test.assertEqual(start, at)
        test.assertIn(start, profile.starts, 'NVIDIA placement rule')
        test.assertFalse(mask & profile.mask(start), 'MIG overlap')
        mask |= profile.mask(start)
        compute += profile.compute_slices
    test.assertEqual(mask, gpu.mig_mask)
    test.assertLessEqual(compute, gpu.model.mig.compute_slices
                         if gpu.model.mig else 0)


class PropertyTest(base.TestCase):

    @settings(max_examples=150, deadline=None)
    @given(OPS, st.booleans())
    def test_sequences_never_overcommit_and_free_restores(self, ops, mig):
        host = fixtures.hgx_host('h', A100, mig=mig, cpu_milli=64000,
                                 memory_mib=1 << 20)
        empty = host.snapshot()
        live = []
        for op, arg, pick_last in ops:
            if op == 'alloc':
                ranked = ENGINE.rank(host, arg)
                if not ranked:
                    continue
                choice = ranked[-1 if pick_last else 0]
                before = host.snapshot()
                host.allocate(choice.placement)
                # Allocate then free is the identity, wherever we are.
                host.free(choice.placement)
                self.assertEqual(before, host.snapshot())
                host.allocate(choice.placement)
                live.append(choice.placement)
            elif live:
                # Free in any order, then check free-then-allocate too.
                placement = live.pop(arg % len(live))
                before = host.snapshot()
                host.free(placement)
                after = host.snapshot()
                host.allocate(placement)
                self.assertEqual(before, host.snapshot())
                host.free(placement)
                self.assertEqual(after, host.snapshot())
            for gpu in host.gpus:
                check_gpu(self, gpu)
            self.assertLessEqual(host.cpu_used, host.cpu_milli)
        while live:
            host.free(live.pop())
        self.assertEqual(empty, host.snapshot())

    @settings(max_examples=100, deadline=None)
    @given(st.lists(st.tuples(st.integers(0, 7),
                              st.sampled_from(sorted(A100.mig.profiles)),
                              st.integers(0, 7)), max_size=30))
    def test_arbitrary_mig_slots_are_refused_unless_valid(self, slots):
        host = fixtures.hgx_host('h', A100, mig=True)
        for gpu_index, name, start in slots:
            gpu = host.gpus[gpu_index]
            valid = start in gpu.mig_starts(A100.mig_profile(name))
            slot = H.Slot(gpu_index, H.MIG, (name, start, None))
            if valid:
                gpu.take(slot)
            else:
                self.assertRaises(exceptions.AllocationError, gpu.take,
                                  slot)
            check_gpu(self, gpu)

    @settings(max_examples=100, deadline=None)
    @given(st.lists(st.sampled_from(REQUESTS), max_size=25))
    def test_rank_only_offers_what_allocate_accepts(self, requests):
        host = fixtures.hgx_host('h', A100, mig=False)
        for r in requests:
            for choice in ENGINE.rank(host, r):
                before = host.snapshot()
                host.allocate(choice.placement)
                host.free(choice.placement)
                self.assertEqual(before, host.snapshot())
            ranked = ENGINE.rank(host, r)
            if ranked:
                host.allocate(ranked[0].placement)
