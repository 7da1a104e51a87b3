from nova_gpu.core import fragmentation as frag
from nova_gpu.core import host as H
from nova_gpu.core import request as R
from tests.unit.core import base


class FragmentationTest(base.TestCase):
    """The FGD measure on hand-checked cases."""

    def host(self, shares, cpu=8000):
        model = self.model('T4')
        gpus = [H.Gpu(i, model) for i in range(len(shares))]
        host = H.Host('h', gpus, cpu, 100000)
        for i, milli in enumerate(shares):
            if milli:
                host.allocate(H.Placement('h', (H.Slot(i, H.SHARE,
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
