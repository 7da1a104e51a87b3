"""The move planner: evictions and live migrations that make room."""

import itertools

from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from nova_gpu.core import demand as demand_mod
from nova_gpu.core import engine as engine_mod
from nova_gpu.core import exceptions
from nova_gpu.core import fixtures
from nova_gpu.core import host as H
from nova_gpu.core import moves
from nova_gpu.core import request as R
from nova_gpu.tests.unit.core import base

CAT = base.CATALOG
T4 = CAT.model('T4')
ENGINE = engine_mod.PlacementEngine(demand_mod.catalog_demand(
    CAT, models={'T4'}))


def vgpu(host, gpu, profile, cpu=0, mem=0):
    return H.Assignment(host, (H.Slot(gpu, H.VGPU, profile),), None, cpu,
                        mem)


def whole(host, *gpus):
    return H.Assignment(host, tuple(H.Slot(g, H.WHOLE) for g in gpus))


def cloud(n_hosts=3, gpus=2):
    return {'h%d' % i: fixtures.pcie_host('h%d' % i, T4, gpus=gpus,
                                          numa_nodes=1)
            for i in range(n_hosts)}


def boot(hosts, servers, sid, placement, **kw):
    hosts[placement.host].allocate(placement)
    servers.append(moves.Server(sid, placement, **kw))


def snapshot(hosts):
    return {n: h.snapshot() for n, h in hosts.items()}


class TestPlanner(base.TestCase):

    def setUp(self):
        super().setUp()
        self.planner = moves.MovePlanner(ENGINE)

    def test_fits_now_needs_no_move(self):
        hosts = cloud()
        plan = self.planner.plan(hosts, [], R.GpuRequest(H.WHOLE, count=2))
        self.assertEqual((), plan.moves)
        self.assertEqual(2, len(plan.placement.slots))

    def test_evicts_one_spot_server_rather_than_two(self):
        hosts, servers = cloud(2), []
        boot(hosts, servers, 'spot-a', vgpu('h0', 0, 'T4-16C'), spot=True)
        boot(hosts, servers, 'spot-b', vgpu('h1', 0, 'T4-8C'), spot=True)
        boot(hosts, servers, 'spot-c', vgpu('h1', 0, 'T4-8C'), spot=True)
        boot(hosts, servers, 'od-1', whole('h0', 1))
        boot(hosts, servers, 'od-2', whole('h1', 1))
        plan = self.planner.plan(hosts, servers, R.GpuRequest(H.WHOLE))
        self.assertEqual(['spot-a'], [m.server.id for m in plan.moves])
        self.assertEqual(moves.EVICT, plan.moves[0].action)
        self.assertEqual(('h0', (0,)), (plan.host, plan.placement.gpus))

    def test_migrates_a_movable_spot_server_rather_than_evict_it(self):
        hosts, servers = cloud(2), []
        boot(hosts, servers, 'spot', vgpu('h0', 0, 'T4-8C'), spot=True,
             movable=True)
        boot(hosts, servers, 'od', whole('h0', 1))
        boot(hosts, servers, 'other', whole('h1', 0))
        boot(hosts, servers, 'peer', vgpu('h1', 1, 'T4-8C'))
        plan = self.planner.plan(hosts, servers, R.GpuRequest(H.WHOLE))
        self.assertEqual([(moves.MIGRATE, 'spot')],
                         [(m.action, m.server.id) for m in plan.moves])
        # Same vGPU type on the destination: next to the other T4-8C.
        self.assertEqual(('h1', (1,)), (plan.moves[0].destination.host,
                                        plan.moves[0].destination.gpus))
        self.assertEqual(8192, plan.memory_moved_mib)

    def test_never_moves_fixed_servers(self):
        hosts, servers = cloud(1), []
        boot(hosts, servers, 'od-1', vgpu('h0', 0, 'T4-4C'))
        boot(hosts, servers, 'od-2', whole('h0', 1))
        self.assertIsNone(self.planner.plan(hosts, servers,
                                            R.GpuRequest(H.WHOLE)))

    def test_passthrough_is_not_live_migrated(self):
        hosts, servers = cloud(2), []
        boot(hosts, servers, 'pt', whole('h0', 0, 1), movable=True)
        boot(hosts, servers, 'pt2', whole('h1', 0, 1), movable=True)
        self.assertIsNone(moves.migration_request(servers[0]))
        self.assertIsNone(self.planner.plan(hosts, servers,
                                            R.GpuRequest(H.WHOLE)))

    def test_no_destination_offers_the_type(self):
        hosts, servers = cloud(2), []
        boot(hosts, servers, 'mov', vgpu('h0', 0, 'T4-16C'), movable=True)
        boot(hosts, servers, 'fixed', whole('h0', 1))
        boot(hosts, servers, 'h1-a', vgpu('h1', 0, 'T4-4C'))
        boot(hosts, servers, 'h1-b', vgpu('h1', 1, 'T4-2Q'))
        self.assertIsNone(self.planner.plan(hosts, servers,
                                            R.GpuRequest(H.WHOLE)))

    def test_compatibility_rule_is_asked(self):
        hosts, servers = cloud(3, gpus=1), []
        boot(hosts, servers, 'mov', vgpu('h0', 0, 'T4-8C'), movable=True)
        boot(hosts, servers, 'f1', whole('h1', 0))
        boot(hosts, servers, 'f2', vgpu('h2', 0, 'T4-8C'))
        asked = []

        def compatible(server, host_name):
            asked.append((server.id, host_name))
            return host_name != 'h2'
        planner = moves.MovePlanner(ENGINE, compatible=compatible)
        self.assertIsNone(planner.plan(hosts, servers,
                                       R.GpuRequest(H.WHOLE)))
        self.assertIn(('mov', 'h2'), asked)
        planner = moves.MovePlanner(ENGINE)
        self.assertEqual('h2', planner.plan(
            hosts, servers, R.GpuRequest(H.WHOLE)).moves[0].destination.host)

    def test_explain_one_line_per_move(self):
        hosts, servers = cloud(2), []
        boot(hosts, servers, 'spot', vgpu('h0', 0, 'T4-8C'), spot=True)
        boot(hosts, servers, 'mov', vgpu('h0', 1, 'T4-8C'), movable=True)
        boot(hosts, servers, 'f', whole('h1', 0, 1))
        plan = self.planner.plan(hosts, servers,
                                 R.GpuRequest(H.WHOLE, count=2))
        self.assertIsNone(plan)  # mov has nowhere to go
        hosts['h2'] = fixtures.pcie_host('h2', T4, gpus=1, numa_nodes=1)
        plan = self.planner.plan(hosts, servers,
                                 R.GpuRequest(H.WHOLE, count=2))
        lines = plan.explain()
        self.assertEqual(3, len(lines))
        self.assertIn('live-migrate server mov from h0 GPU 1 to h2 GPU 0',
                      lines[0])
        self.assertIn('evict spot server spot from h0 GPU 0', lines[1])
        self.assertIn('place 2x whole on h0 GPU 0,1', lines[2])

    def test_targets_narrow_the_hosts_freed(self):
        hosts, servers = cloud(2), []
        boot(hosts, servers, 'a', vgpu('h0', 0, 'T4-16C'), spot=True)
        boot(hosts, servers, 'b', whole('h0', 1))
        boot(hosts, servers, 'c', vgpu('h1', 0, 'T4-8C'), spot=True)
        boot(hosts, servers, 'd', whole('h1', 1))
        req = R.GpuRequest(H.WHOLE)
        chosen = self.planner.plan(hosts, servers, req).host
        other = ({'h0', 'h1'} - {chosen}).pop()
        self.assertEqual(other, self.planner.plan(hosts, servers, req,
                                                  targets={other}).host)
        self.assertIsNone(self.planner.plan(hosts, servers, req,
                                            targets=()))

    def test_unknown_host_is_named(self):
        e = self.assertRaises(
            exceptions.InvalidRequest, self.planner.plan, cloud(1),
            [moves.Server('x', vgpu('nowhere', 0, 'T4-4C'), spot=True)],
            R.GpuRequest(H.WHOLE, count=4))
        self.assertIn('nowhere', str(e))

    def test_drain(self):
        hosts, servers = cloud(3), []
        boot(hosts, servers, 'a', vgpu('h0', 0, 'T4-4C'), movable=True)
        boot(hosts, servers, 'b', vgpu('h1', 0, 'T4-4C'), movable=True)
        boot(hosts, servers, 'c', vgpu('h1', 1, 'T4-8C'), movable=True)
        before = snapshot(hosts)
        plan = self.planner.drain(hosts, servers, 'h0', targets={'h1'})
        self.assertEqual(before, snapshot(hosts))
        self.assertEqual([('a', 'h1', (0,))],
                         [(m.server.id, m.destination.host,
                           m.destination.gpus) for m in plan.moves])
        plan.apply(hosts)
        self.assertTrue(all(g.is_free for g in hosts['h0'].gpus))
        boot(hosts, servers, 'fixed', whole('h2', 0))
        self.assertIsNone(self.planner.drain(hosts, servers, 'h2'))


# -- properties ---------------------------------------------------------

PROFILES = ('T4-16C', 'T4-8C', 'T4-4C')
REQUESTS = ([R.GpuRequest(H.WHOLE, count=n) for n in (1, 2)] +
            [R.GpuRequest(H.VGPU, p) for p in PROFILES])


@st.composite
def clouds(draw):
    """2-3 hosts of 1-2 T4s, filled by random servers."""
    n_hosts = draw(st.integers(2, 3))
    hosts = {'h%d' % i: fixtures.pcie_host(
        'h%d' % i, T4, gpus=draw(st.integers(1, 2)), numa_nodes=1)
        for i in range(n_hosts)}
    servers = []
    for n in range(draw(st.integers(2, 12))):
        name = draw(st.sampled_from(sorted(hosts)))
        gpu = draw(st.integers(0, len(hosts[name].gpus) - 1))
        kind = draw(st.sampled_from(('whole',) + PROFILES))
        placement = (whole(name, gpu) if kind == 'whole'
                     else vgpu(name, gpu, kind))
        try:
            hosts[name].allocate(placement)
        except exceptions.AllocationError:
            continue
        servers.append(moves.Server('s%d' % n, placement,
                                    spot=draw(st.booleans()),
                                    movable=draw(st.booleans())))
    return hosts, servers


def brute_force(hosts, servers, req):
    """Least (moves, evictions) over every subset, action, destination."""
    best = None
    for name, host in hosts.items():
        mine = [s for s in servers if s.host == name and (
            s.spot or (s.movable and moves.migration_request(s)))]
        for k in range(len(mine) + 1):
            for subset in itertools.combinations(mine, k):
                for s in subset:
                    host.free(s.placement)
                try:
                    if not ENGINE.rank(host, req):
                        continue
                    for actions in moves.MovePlanner._action_choices(subset):
                        movers = [s for s, a in zip(subset, actions)
                                  if a == moves.MIGRATE]
                        if placeable(hosts, movers, name):
                            cost = (k, len(subset) - len(movers))
                            best = cost if best is None else min(best, cost)
                finally:
                    for s in reversed(subset):
                        host.allocate(s.placement)
    return best


def placeable(hosts, movers, source):
    """Every mover fits some other host, trying every placement."""
    if not movers:
        return True
    mreq = moves.migration_request(movers[0])
    for name, host in hosts.items():
        if name == source:
            continue
        for choice in ENGINE.rank(host, mreq):
            host.allocate(choice.placement)
            try:
                if placeable(hosts, movers[1:], source):
                    return True
            finally:
                host.free(choice.placement)
    return False


class TestPlannerProperties(base.TestCase):

    @settings(max_examples=150, deadline=None)
    @given(clouds(), st.sampled_from(REQUESTS))
    def test_plan_is_valid_and_minimal(self, state, req):
        hosts, servers = state
        before = snapshot(hosts)
        plan = moves.MovePlanner(ENGINE, max_moves=8).plan(hosts, servers,
                                                           req)
        self.assertEqual(before, snapshot(hosts), 'planning changed hosts')
        best = brute_force(hosts, servers, req)
        self.assertEqual(before, snapshot(hosts))
        if plan is None:
            self.assertIsNone(best)
            return
        self.assertEqual(best, (len(plan.moves), plan.evictions))
        for move in plan.moves:
            self.assertTrue(move.server.spot or move.server.movable)
            if move.action == moves.EVICT:
                self.assertTrue(move.server.spot)
            else:
                self.assertTrue(move.server.movable)
                self.assertNotEqual(plan.host, move.destination.host)
        self.assertEqual(len(plan.moves),
                         len({m.server.id for m in plan.moves}))
        self.assertEqual(len(plan.moves) + 1 if plan.request else 0,
                         len(plan.explain()))
        # After the plan the request fits: its placement applies cleanly.
        plan.apply(hosts)
        self.assertEqual(req.count, len(plan.placement.slots))
