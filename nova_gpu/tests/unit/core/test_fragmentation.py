import dataclasses

import hypothesis as hyp
from hypothesis import strategies as hyp_st

from nova_gpu.core import engine as engine_mod
from nova_gpu.core import fragmentation as frag
from nova_gpu.core import host as H
from nova_gpu.core import request as R
from nova_gpu.tests.unit.core import base


class FragmentationTest(base.TestCase):
    """The FGD measure on hand-checked cases."""

    def host(self, shares, cpu=8000):
        model = self.model('T4')
        gpus = [H.Gpu(i, model) for i in range(len(shares))]
        host = H.Host('h', gpus, cpu, 100000)
        for i, milli in enumerate(shares):
            if milli:
                host.allocate(H.Assignment('h', (H.Slot(i, H.SHARE,
                                                        milli),)))
        return host

    def test_share_fragment_is_free_capacity_a_task_cannot_use(self):
        host = self.host([810, 0])  # 190 free on GPU 0, 1000 on GPU 1
        half = frag.Demand([frag.DemandItem(
            R.GpuRequest('share', milli=500), 1)])
        self.assertEqual(190, frag.host_fragmentation(host, half))
        small = frag.Demand([frag.DemandItem(
            R.GpuRequest('share', milli=100), 1)])
        self.assertEqual(0, frag.host_fragmentation(host, small))

    def test_weighted_sum_over_typical_tasks(self):
        host = self.host([810, 500])
        demand = frag.Demand([
            frag.DemandItem(R.GpuRequest('share', milli=500), 3),
            frag.DemandItem(R.GpuRequest('whole'), 1)])
        # 500-task: GPU0's 190 is lost; whole task: both GPUs are lost.
        self.assertAlmostEqual(0.75 * 190 + 0.25 * 690,
                               frag.host_fragmentation(host, demand))

    def test_task_that_cannot_fit_the_host_loses_everything(self):
        host = self.host([0, 0], cpu=1000)
        demand = frag.Demand([frag.DemandItem(
            R.GpuRequest('whole', cpu_milli=2000), 1)])
        self.assertEqual(2000, frag.host_fragmentation(host, demand))
        cpu_only = frag.Demand([frag.DemandItem(None, 1)])
        self.assertEqual(2000, frag.host_fragmentation(host, cpu_only))

    def test_demand_from_requests_keeps_most_frequent(self):
        a = R.GpuRequest('share', milli=500)
        b = R.GpuRequest('whole')
        c = R.GpuRequest('whole', count=8)
        demand = frag.Demand.from_requests([a] * 6 + [b] * 3 + [c],
                                           coverage=0.85)
        self.assertEqual([a, b], [i.request for i in demand.items])
        self.assertAlmostEqual(6 / 9, demand.items[0].weight)


class FitRuleTest(base.TestCase):
    """One fit rule: the fast paths answer as the slot rule does."""

    def gpus(self):
        a100, t4 = self.model('A100-40GB'), self.model('T4')
        mig = H.Gpu(0, a100, mig_enabled=True)
        mig.take(H.Slot(0, H.MIG, ('3g.20gb', 4, None)))
        vgpu = H.Gpu(1, a100, vgpu_types=['A100-10C'])
        vgpu.take(H.Slot(1, H.VGPU, 'A100-10C'))
        whole = H.Gpu(2, t4)
        whole.take(H.Slot(2, H.WHOLE))
        shared = H.Gpu(3, t4)
        shared.take(H.Slot(3, H.SHARE, 700))
        return [mig, vgpu, whole, shared, H.Gpu(4, a100), H.Gpu(5, t4)]

    def requests(self):
        yield R.GpuRequest(H.WHOLE)
        yield R.GpuRequest(H.WHOLE, models=['T4'])
        yield R.GpuRequest(H.SHARE, milli=300)
        yield R.GpuRequest(H.SHARE, milli=500)
        yield R.GpuRequest(H.MIG, '3g.20gb')
        yield R.GpuRequest(H.MIG, '7g.40gb')
        yield R.GpuRequest(H.VGPU, 'A100-10C')
        yield R.GpuRequest(H.VGPU, 'A100-20C', models=['A100-40GB'])
        yield R.GpuRequest(H.VGPU, 'T4-4C', models=['A100-40GB'])
        yield R.GpuRequest(H.VGPU)

    def test_fast_paths_agree_with_the_slot_rule(self):
        answers = set()
        for req in self.requests():
            for gpu in self.gpus():
                slow = (gpu.serves_model(req.models)
                        and bool(frag.unit_slots(gpu, req)))
                self.assertEqual(slow, frag.fit_checker(req)(gpu),
                                 (req, gpu.index))
                self.assertEqual(slow, frag.unit_fits(gpu, req))
                answers.add(slow)
        # Both answers occur: the comparison can fail.
        self.assertEqual({True, False}, answers)

    def test_model_rule_names_and_aliases(self):
        gpu = H.Gpu(0, self.model('A100-40GB'))
        self.assertTrue(gpu.serves_model(None))
        self.assertTrue(gpu.serves_model(frozenset(['A100-40GB'])))
        self.assertFalse(gpu.serves_model(frozenset(['T4'])))
        for alias in gpu.model.aliases:
            self.assertTrue(gpu.serves_model(frozenset([alias])))


# -- random states: the fast paths against the rule ---------------------------

RANDOM_MODELS = ('A100-40GB', 'H100-80GB', 'A30', 'T4', 'L4')


def _random_requests(catalog):
    """Every request kind, on every profile of the random models."""
    out = [R.GpuRequest(H.WHOLE), R.GpuRequest(H.VGPU)]
    out += [R.GpuRequest(H.SHARE, milli=m) for m in (10, 190, 500, 1000)]
    for name in RANDOM_MODELS:
        model = catalog.model(name)
        out.append(R.GpuRequest(H.WHOLE, models=[name]))
        out += [R.GpuRequest(H.VGPU, p) for p in model.vgpu_profiles]
        out.append(R.GpuRequest(H.VGPU, models=[model.aliases[0]]))
        if model.mig:
            out += [R.GpuRequest(H.MIG, p, models=[name])
                    for p in model.mig.profiles]
    return out


RANDOM_REQUESTS = _random_requests(base.CATALOG)


def _own_requests(gpu):
    """The random requests that name ``gpu``'s model, and the unnamed."""
    return [r for r in RANDOM_REQUESTS if gpu.serves_model(r.models)]


@hyp_st.composite
def random_gpu(draw):
    """A GPU of a random model and setup, in a state reached by taking
    random slots the rule offered (so every state is a reachable one).
    """
    model = base.CATALOG.model(draw(hyp_st.sampled_from(RANDOM_MODELS)))
    mig = bool(model.mig) and draw(hyp_st.booleans())
    names = sorted(model.vgpu_profiles)
    types = draw(hyp_st.one_of(hyp_st.none(), hyp_st.lists(
        hyp_st.sampled_from(names), min_size=1, max_size=3, unique=True)))
    gpu = H.Gpu(0, model, mig_enabled=mig, vgpu_types=types)
    for req in draw(hyp_st.lists(hyp_st.sampled_from(RANDOM_REQUESTS),
                                 max_size=8)):
        slots = frag.unit_slots(gpu, req)
        if slots:
            gpu.take(slots[draw(hyp_st.integers(0, len(slots) - 1))])
    return gpu


class FitRulePropertyTest(base.TestCase):
    """On random reachable GPU states, each named fast path answers as the
    rule (``unit_slots`` with ``Gpu.serves_model``) does.
    """

    @hyp.settings(max_examples=300, deadline=None)
    @hyp.given(random_gpu(), hyp_st.data())
    def test_fit_checker_equals_unit_slots(self, gpu, data):
        # Half the time a request of the GPU's own model: they fit often.
        req = data.draw(hyp_st.sampled_from(
            _own_requests(gpu) if data.draw(hyp_st.booleans())
            else RANDOM_REQUESTS))
        rule = gpu.serves_model(req.models) and bool(frag.unit_slots(gpu,
                                                                     req))
        self.assertEqual(rule, frag.fit_checker(req)(gpu),
                         (req, gpu.model.name, gpu.snapshot()))


@hyp_st.composite
def random_host(draw):
    """A host of 1-4 GPUs of one model, some of them taken."""
    model = base.CATALOG.model(draw(hyp_st.sampled_from(RANDOM_MODELS)))
    mig = bool(model.mig) and draw(hyp_st.booleans())
    count = draw(hyp_st.integers(1, 4))
    gpus = [H.Gpu(i, model, mig_enabled=mig) for i in range(count)]
    host = H.Host('h', gpus, 64000, 1 << 18)
    for req in draw(hyp_st.lists(hyp_st.sampled_from(RANDOM_REQUESTS),
                                 max_size=4)):
        gpu = gpus[draw(hyp_st.integers(0, count - 1))]
        slots = frag.unit_slots(gpu, req)
        if slots:
            gpu.take(slots[0])
    host.cpu_used = draw(hyp_st.sampled_from((0, 58000)))
    return host


def random_demand(requests):
    """Typical requests drawn from ``requests`` (and CPU-only ones), some
    bringing CPU: a choice's CPU then decides what still fits.
    """
    items = hyp_st.lists(hyp_st.tuples(
        hyp_st.sampled_from(requests + [None]), hyp_st.integers(1, 5),
        hyp_st.sampled_from((0, 4000))), min_size=1, max_size=6)
    return items.map(lambda drawn: frag.Demand([frag.DemandItem(
        r and dataclasses.replace(r, cpu_milli=cpu), w)
        for r, w, cpu in drawn]))


class IncrementalFragmentationPropertyTest(base.TestCase):
    """The engine's incremental measure (its fast path) is the rule's
    ``host_fragmentation`` on random hosts, demands and choices.
    """

    @hyp.settings(max_examples=200, deadline=None)
    @hyp.given(random_host(), hyp_st.data())
    def test_engine_delta_equals_host_fragmentation(self, host, data):
        own = _own_requests(host.gpus[0])
        demand = data.draw(random_demand(own))
        req = data.draw(hyp_st.sampled_from(own))
        # With 6,000 CPU milli free on half the hosts, the choice's CPU
        # decides whether typical requests of 4,000 still fit.
        req = dataclasses.replace(req, cpu_milli=4000)
        engine = engine_mod.PlacementEngine(demand)
        before = frag.host_fragmentation(host, demand)
        for choice in engine.rank(host, req)[:4]:
            host.allocate(choice.placement)
            after = frag.host_fragmentation(host, demand)
            host.free(choice.placement)
            self.assertAlmostEqual((after - before) / H.MILLI,
                                   choice.frag_delta, places=9)
