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
