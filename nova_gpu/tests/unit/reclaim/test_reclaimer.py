"""The reclaimer's decisions: only spot servers are evicted, after grace."""

import testtools

from nova_gpu.core import catalog
from nova_gpu.core import exceptions
from nova_gpu.core import fixtures
from nova_gpu.core import host as H
from nova_gpu.core import moves
from nova_gpu.core import request as R
from nova_gpu.reclaim import reclaimer

T4 = catalog.load_catalog().model('T4')
WHOLE = R.GpuRequest(H.WHOLE)


def vgpu(host, gpu, profile='T4-16C'):
    return H.Assignment(host, (H.Slot(gpu, H.VGPU, profile),))


class TestReclaimer(testtools.TestCase):

    def setUp(self):
        super().setUp()
        self.hosts = {n: fixtures.pcie_host(n, T4, gpus=2, numa_nodes=1)
                      for n in ('h0', 'h1')}
        self.servers = []
        for n, (host, gpu, spot, movable) in enumerate((
                ('h0', 0, True, False), ('h0', 1, False, False),
                ('h1', 0, True, False), ('h1', 1, False, True))):
            p = vgpu(host, gpu)
            self.hosts[host].allocate(p)
            self.servers.append(moves.Server('s%d' % n, p, spot=spot,
                                             movable=movable))

    def snapshot(self):
        return {n: h.snapshot() for n, h in self.hosts.items()}

    def test_refused_request_evicts_one_spot_after_grace(self):
        r = reclaimer.Reclaimer(action=reclaimer.DELETE, grace_s=120)
        decision = r.for_request(self.hosts, self.servers, WHOLE)
        self.assertEqual(1, decision.evictions)
        self.assertEqual(
            [(0.0, 'notify', 's0'), (120.0, 'delete', 's0')],
            [(s.at_s, s.action, s.server) for s in decision.steps])
        self.assertIn('evict spot server s0 from h0 GPU 0',
                      decision.steps[0].why)

    def test_on_demand_servers_are_never_evicted(self):
        for s in list(self.servers):
            if s.spot:
                self.hosts[s.host].free(s.placement)
                self.servers.remove(s)
        # Only s3 (on-demand, movable) could go, and nowhere to go: the
        # free GPUs are on its own host... so a whole GPU fits already.
        r = reclaimer.Reclaimer()
        self.assertEqual((), r.for_request(self.hosts, self.servers,
                                           WHOLE).plans[0].moves)
        two = R.GpuRequest(H.WHOLE, count=2)
        decision = r.for_request(self.hosts, self.servers, two)
        self.assertEqual([('live_migrate', 's3', 'h0')],
                         [(s.action, s.server, s.destination)
                          for s in decision.steps])

    def test_headroom_floor(self):
        r = reclaimer.Reclaimer(floor=2, reference=WHOLE)
        self.assertEqual(0, r.headroom(self.hosts))
        before = self.snapshot()
        decision = r.for_headroom(self.hosts, self.servers)
        self.assertEqual(before, self.snapshot(), 'hosts left as they were')
        self.assertEqual(2, decision.evictions)
        self.assertEqual(['s0', 's2'], sorted(
            s.server for s in decision.steps
            if s.action == reclaimer.SHELVE_OFFLOAD))
        self.assertEqual(4, len(decision.explain()))
        # A floor that spot capacity cannot reach: no decision at all.
        r = reclaimer.Reclaimer(floor=4, reference=WHOLE)
        self.assertIsNone(r.for_headroom(self.hosts, self.servers))
        self.assertEqual(before, self.snapshot())
        self.assertIsNone(reclaimer.Reclaimer().for_headroom(
            self.hosts, self.servers))

    def test_options_validated(self):
        self.assertRaises(exceptions.InvalidRequest, reclaimer.Reclaimer,
                          action='hibernate')
        self.assertRaises(exceptions.InvalidRequest, reclaimer.Reclaimer,
                          floor=1)
        self.assertRaises(exceptions.InvalidRequest, reclaimer.Reclaimer,
                          grace_s=-1)
