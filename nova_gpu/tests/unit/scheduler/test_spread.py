"""Equally good candidates are spread: each request draws its own.

Nova claims candidate 0 of a host. When several candidates are equally
good (VFs of one GPU, GPUs in the same state) and every scheduler puts the
same one first, concurrent requests claim the same device and all but one
fail. The view puts first the one this request draws, among the equally
good only: best fit and the rest of the order stay.
"""

import itertools
import random

import fixtures

from nova_gpu.core import report as report_mod
from nova_gpu.scheduler import gpu_spec
from nova_gpu.scheduler import view as view_mod
from nova_gpu.tests.unit.scheduler import base

FUNCTIONS = (4, 5, 6, 7)  # four VFs per GPU: A100-10C, four per GPU


def spec(**specs):
    return gpu_spec.parse({k.replace('__', ':'): v for k, v in specs.items()},
                          base.CATALOG, vcpus=4, memory_mb=8192)


STOCK = spec(resources__VGPU='1')


class SpecObj:
    """What the view reads of a Nova RequestSpec."""

    def __init__(self, instance_uuid, num_instances=1):
        self.instance_uuid = instance_uuid
        self.num_instances = num_instances


class Draws:
    """A view's draws, set by the test (each in [0, 1))."""

    def __init__(self, *values):
        self.values = list(values)

    def __call__(self):
        return self.values.pop(0)


class SpreadTest(base.TestCase):

    def setUp(self):
        super().setUp()
        self.draws = Draws()
        self.view = view_mod.GpuView(base.CATALOG, clock=lambda: self.now,
                                     draw=self.draws)
        self.uuids = itertools.count()

    def add_vf_host(self, nodename, count=2, used=None):
        """A100s on SR-IOV + mdev: one provider per VF, four VFs a GPU."""
        data = base.gpu_report(nodename, 'A100-40GB', count=count,
                               vgpu_type='A100-10C', used=used)
        for raw in data['gpus']:
            pf = raw['address']
            raw['providers'] = [report_mod.provider_dict(
                report_mod.mdev_provider_name(nodename, pf[:-1] + str(f)),
                report_mod.VF_MDEV, pf[:-1] + str(f),
                vgpu_type='A100-10C') for f in FUNCTIONS]
        entry = self.view.ingest(data)
        self.view.set_provider_uuids(nodename, {
            name: 'rp-' + name[-6:] for name in entry.providers})
        return entry

    def vfs(self, entry, gpu):
        return sorted(u for u, i in entry.uuids.items() if i == gpu)

    def decide(self, entry, candidates, spec_obj=None, previous=None,
               num_instances=0, later=True):
        """``entry``'s Decision for a new request; ``later``: after the
        earlier requests' claims (not concurrent with them).
        """
        if later:
            self.now += view_mod.PUT_FIRST_TTL
        spec_obj = spec_obj or SpecObj('i%d' % next(self.uuids))
        request = self.view.request(spec_obj, STOCK)
        return self.view.decide(request, entry.nodename, num_instances,
                                candidates=candidates, previous=previous)

    def first(self, decision, candidates):
        return list(candidates[decision.order[0]]['allocations'])[0]

    def test_equally_good_vfs_and_gpus_spread_by_the_draw(self):
        entry = self.add_vf_host('h1')
        offered = self.vfs(entry, 0) + self.vfs(entry, 1)
        candidates = [{'allocations': {rp: {'resources': {'VGPU': 1}}}}
                      for rp in offered]
        firsts = []
        for n in range(8):
            # The draw that picks the n-th of the eight equally good ones.
            self.draws.values.append((n + 0.5) / 8)
            decision = self.decide(entry, candidates)
            first = self.first(decision, candidates)
            firsts.append(first)
            # What the weighers read and Nova claims agree.
            self.assertEqual((entry.uuids[first],), decision.ranked.gpus)
            # Every candidate kept once, the rest in their order.
            self.assertEqual(sorted(decision.order), list(range(8)))
        # Each of the eight VFs, of either empty GPU, once.
        self.assertEqual(offered, firsts)

    def test_best_fit_is_kept(self):
        # GPU 1 has a vGPU (on its first VF, which Placement no longer
        # offers): its other VFs leave less free capacity, best fit.
        entry = self.add_vf_host('h1', used={1: 1})
        vf1 = self.vfs(entry, 1)
        offered = self.vfs(entry, 0) + vf1[1:]
        candidates = [{'allocations': {rp: {'resources': {'VGPU': 1}}}}
                      for rp in offered]
        firsts = set()
        for draw in (0.0, 0.4, 0.7, 0.99):
            self.draws.values.append(draw)
            decision = self.decide(entry, candidates)
            firsts.add(self.first(decision, candidates))
            self.assertEqual((1,), decision.ranked.gpus)
        # Only among the used GPU's three free VFs.
        self.assertEqual(set(vf1[1:]), firsts)

    def test_a_single_best_needs_no_draw(self):
        entry = self.add_vf_host('h1', used={1: 3})
        vf1 = self.vfs(entry, 1)
        offered = self.vfs(entry, 0) + vf1[3:]
        candidates = [{'allocations': {rp: {'resources': {'VGPU': 1}}}}
                      for rp in offered]
        decision = self.decide(entry, candidates)  # no draw left: none read
        self.assertEqual(vf1[3], self.first(decision, candidates))

    def test_the_stable_order_is_memoised_not_the_pick(self):
        # Hosts in the same state, the same candidates: one memoised order,
        # and still a pick of its own per decision.
        entry = self.add_vf_host('h1')
        offered = self.vfs(entry, 0)
        candidates = [{'allocations': {rp: {'resources': {'VGPU': 1}}}}
                      for rp in offered]
        self.draws.values.extend([0.9, 0.1, 0.9])
        picks = [self.first(self.decide(entry, candidates), candidates)
                 for _ in range(3)]
        self.assertEqual([offered[3], offered[0], offered[3]], picks)

    def test_schedulers_spread_with_their_own_draws(self):
        # Two scheduler services (two views), each with the default draw:
        # the same request on the same host does not always get the same
        # VF first. Seeded, so that the test cannot fail by chance.
        rng = random.Random(25)
        views = [view_mod.GpuView(base.CATALOG, clock=lambda: self.now,
                                  draw=rng.random) for _ in range(2)]
        entries = []
        for view in views:
            self.view = view
            entries.append(self.add_vf_host('h1'))
        offered = self.vfs(entries[0], 0) + self.vfs(entries[0], 1)
        self.assertEqual(offered, self.vfs(entries[1], 0)
                         + self.vfs(entries[1], 1))
        candidates = [{'allocations': {rp: {'resources': {'VGPU': 1}}}}
                      for rp in offered]
        same = 0
        seen = set()
        for n in range(40):
            firsts = []
            for view, entry in zip(views, entries):
                self.view = view
                firsts.append(self.first(self.decide(entry, candidates),
                                         candidates))
            seen.update(firsts)
            same += firsts[0] == firsts[1]
        # One in eight by chance; the stable order alone: all 40.
        self.assertLess(same, 15)
        self.assertEqual(set(offered), seen)

    def test_concurrent_requests_of_one_scheduler_take_distinct_vfs(self):
        entry = self.add_vf_host('h1')
        offered = self.vfs(entry, 0) + self.vfs(entry, 1)
        candidates = [{'allocations': {rp: {'resources': {'VGPU': 1}}}}
                      for rp in offered]
        # Eight requests at once, each drawing the first of the ties left:
        # eight VFs.
        firsts = []
        for n in range(8):
            self.draws.values.append(0.0)
            firsts.append(self.first(self.decide(entry, candidates,
                                                 later=False), candidates))
        self.assertEqual(offered, firsts)
        # A ninth while all eight may still be claimed: any of them.
        self.draws.values.append(0.99)
        self.assertEqual(offered[-1], self.first(
            self.decide(entry, candidates, later=False), candidates))
        # Once their claims are done, every VF Placement still offers is
        # drawn from again.
        self.draws.values.append(0.0)
        self.assertEqual(offered[0], self.first(
            self.decide(entry, candidates), candidates))

    def test_remembered_providers_are_bounded(self):
        entry = self.add_vf_host('h1')
        offered = self.vfs(entry, 0) + self.vfs(entry, 1)
        candidates = [{'allocations': {rp: {'resources': {'VGPU': 1}}}}
                      for rp in offered]
        self.useFixture(fixtures.MonkeyPatch(
            'nova_gpu.scheduler.view.MAX_PUT_FIRST', 3))
        for n in range(20):
            self.draws.values.append(0.5)
            self.decide(entry, candidates, later=n % 3 == 0)
            self.assertLessEqual(len(self.view._put_first), 3)

    def test_multi_create_never_draws_a_filled_vf(self):
        entry = self.add_vf_host('h1', count=1)
        offered = self.vfs(entry, 0)
        candidates = [{'allocations': {rp: {'resources': {'VGPU': 1}}}}
                      for rp in offered]
        spec_obj = SpecObj('i0', num_instances=4)
        previous = None
        claimed = []
        for n in range(4):
            spec_obj.instance_uuid = 'i%d' % n
            # Always the last of the equally good ones left.
            self.draws.values.append(0.99)
            previous = self.decide(entry, candidates, spec_obj, previous,
                                   num_instances=n, later=False)
            claimed.append(self.first(previous, candidates))
            self.assertEqual(set(previous.claimed), {claimed[-1]})
        # Each VF once (Placement would refuse a second claim on one).
        self.assertEqual(sorted(offered), sorted(claimed))
