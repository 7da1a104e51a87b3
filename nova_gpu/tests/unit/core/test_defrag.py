"""Defragmentation: targets, proposals, the executor and state building."""

import types

from nova_gpu.core import defrag
from nova_gpu.core import demand as demand_mod
from nova_gpu.core import drivers
from nova_gpu.core import exceptions
from nova_gpu.core import fixtures
from nova_gpu.core import host as H
from nova_gpu.core import inventory
from nova_gpu.core import moves
from nova_gpu.core import report as report_mod
from nova_gpu.core import request as R
from nova_gpu.tests.unit.core import base

CAT = base.CATALOG
T4 = CAT.model('T4')
FULL = 'T4-16C'  # one per GPU: each guest holds a whole GPU


def cloud(names=('a', 'b'), gpus=2):
    return {n: fixtures.pcie_host(n, T4, gpus=gpus, numa_nodes=1,
                                  vgpu_types=[FULL]) for n in names}


def vgpu(host, gpu, profile=FULL):
    return H.Assignment(host, (H.Slot(gpu, H.VGPU, profile),))


def boot(hosts, servers, sid, placement, **kw):
    kw.setdefault('movable', True)
    hosts[placement.host].allocate(placement)
    servers.append(moves.Server(sid, placement, **kw))


def fragmented():
    """s1 on a GPU 0, s2 on b GPU 0: no host has two free GPUs."""
    hosts, servers = cloud(), []
    boot(hosts, servers, 's1', vgpu('a', 0))
    boot(hosts, servers, 's2', vgpu('b', 0))
    return hosts, servers


WHOLE2 = defrag.parse_target('whole:2')


class TargetsTest(base.TestCase):

    def test_parse(self):
        t = defrag.parse_target('whole:8:nvlink')
        self.assertEqual(R.GpuRequest(H.WHOLE, count=8, topology='nvlink'),
                         t.request)
        self.assertEqual(R.GpuRequest(H.VGPU, FULL, count=2),
                         defrag.parse_target('vgpu:T4-16C:2').request)
        self.assertEqual('h1', defrag.parse_target(' host:h1 ').drain)
        for bad in ('', 'whole', 'whole:x', 'whole:0', 'whole:4:ring',
                    'vgpu::2', 'host:', 'gpus:4'):
            e = self.assertRaises(exceptions.InvalidRequest,
                                  defrag.parse_target, bad)
            self.assertIn('defrag target', str(e))

    def test_large_requests_of_the_demand(self):
        demand = demand_mod.catalog_demand(CAT, models={'T4'})
        hosts = cloud(gpus=8)
        self.assertEqual(['whole:8', 'whole:4'],
                         [t.text for t in defrag.demand_targets(demand,
                                                                hosts)])
        # nothing larger than the biggest host
        self.assertEqual(['whole:4', 'whole:2'], [
            t.text for t in defrag.demand_targets(demand, cloud(gpus=4),
                                                  min_gpus=2)])
        # NVLink sets get their own target
        hgx = {'g': fixtures.hgx_host('g', CAT.model('H100-80GB'))}
        self.assertEqual(['whole:8', 'whole:8:nvlink', 'whole:4',
                          'whole:4:nvlink'],
                         [t.text for t in defrag.demand_targets(demand, hgx)])


class ProposeTest(base.TestCase):

    def test_one_migration_frees_a_host(self):
        hosts, servers = fragmented()
        before = {n: h.snapshot() for n, h in hosts.items()}
        proposal = defrag.propose(hosts, servers, [WHOLE2])
        (move,) = proposal.moves
        self.assertEqual(moves.MIGRATE, move.action)
        self.assertEqual(('s1', 'a', 'b'), (move.server.id, move.server.host,
                                            move.destination.host))
        self.assertEqual(16384, move.memory_mib)
        self.assertEqual(before, {n: h.snapshot() for n, h in hosts.items()})
        lines = proposal.explain()
        self.assertEqual('whole:2: frees a GPU 0,1 with 1 live migration',
                         lines[0])
        self.assertIn('live-migrate server s1 from a GPU 0 to b GPU 1',
                      lines[1])

    def test_never_evicts_nor_moves_unmovable(self):
        hosts, servers = cloud(), []
        boot(hosts, servers, 's1', vgpu('a', 0), movable=False, spot=True)
        boot(hosts, servers, 's2', vgpu('b', 0), movable=False, spot=True)
        proposal = defrag.propose(hosts, servers, [WHOLE2])
        self.assertEqual((), proposal.moves)
        self.assertIn('no plan', proposal.explain()[0])

    def test_fits_now(self):
        hosts, servers = cloud(), []
        boot(hosts, servers, 's1', vgpu('a', 0))
        proposal = defrag.propose(hosts, servers, [WHOLE2])
        self.assertEqual((), proposal.moves)
        self.assertEqual(['whole:2: fits now on b GPU 0,1'],
                         proposal.explain())

    def test_room_made_is_held_for_the_next_target(self):
        hosts, servers = cloud(('a', 'b', 'c')), []
        for n, h in enumerate('abc'):
            boot(hosts, servers, 's%d' % n, vgpu(h, 0))
        proposal = defrag.propose(hosts, servers, [WHOLE2, WHOLE2])
        # the first frees one host with one move; the second cannot use
        # the same room and finds no second host to free
        self.assertEqual(1, len(proposal.moves))
        self.assertIn('no plan', proposal.explain()[-1])

    def test_max_moves(self):
        hosts, servers = fragmented()
        proposal = defrag.propose(hosts, servers, [WHOLE2], max_moves=0)
        self.assertEqual((), proposal.moves)
        self.assertIn('needs 1 live migrations, 0 left', proposal.explain()[0])

    def test_drain(self):
        hosts, servers = fragmented()
        proposal = defrag.propose(hosts, servers,
                                  [defrag.parse_target('host:a')])
        self.assertEqual(['s1'], [m.server.id for m in proposal.moves])
        hosts['b'].free(servers[1].placement)
        servers[1] = moves.Server('s2', servers[1].placement)
        hosts['b'].allocate(servers[1].placement)
        stuck = defrag.propose(hosts, servers,
                               [defrag.parse_target('host:b'),
                                defrag.parse_target('host:z')])
        self.assertEqual(['host:b: cannot be emptied: s2 cannot '
                          'live-migrate', 'host:z: no such GPU host'],
                         stuck.explain())

    def test_driver_rule(self):
        hosts, servers = fragmented()
        servers = [moves.Server(s.id, s.placement, movable=True,
                                driver_branch='R550') for s in servers]
        old = drivers.DriverInfo.build('535.183.04')
        planner = moves.MovePlanner(
            compatible=drivers.compatibility_rule({'a': old, 'b': old}))
        self.assertEqual((), defrag.propose(hosts, servers, [WHOLE2],
                                            planner).moves)


class FakeMover(defrag.Mover):
    """Moves servers in a dict; ``fail`` names servers whose move fails."""

    def __init__(self, where, fail=(), land=None):
        self.where = dict(where)
        self.fail = set(fail)
        self.land = land or {}
        self.calls = []

    def live_migrate(self, server_id, destination):
        self.calls.append((server_id, destination))
        if server_id in self.fail:
            raise RuntimeError('No valid host was found')
        self.where[server_id] = self.land.get(server_id, destination)

    def wait(self, server_id, destination):
        pass

    def locate(self, server_id):
        return self.where.get(server_id)


def two_moves():
    hosts, servers = cloud(('a', 'b', 'c')), []
    boot(hosts, servers, 's1', vgpu('a', 0))
    boot(hosts, servers, 's2', vgpu('b', 0))
    m1 = moves.Move(moves.MIGRATE, servers[0], vgpu('c', 0), 16384)
    m2 = moves.Move(moves.MIGRATE, servers[1], vgpu('c', 1), 16384)
    return servers, [m1, m2]


class ExecutorTest(base.TestCase):

    def test_carries_out_in_order(self):
        servers, plan = two_moves()
        mover = FakeMover({'s1': 'a', 's2': 'b'})
        steps = defrag.Executor(mover).run(plan)
        self.assertEqual([defrag.DONE, defrag.DONE], [s.status for s in steps])
        self.assertEqual([('s1', 'c'), ('s2', 'c')], mover.calls)
        self.assertEqual('server s1 is ACTIVE on c', steps[0].detail)

    def test_stops_at_first_failure(self):
        servers, plan = two_moves()
        mover = FakeMover({'s1': 'a', 's2': 'b'}, fail={'s1'})
        steps = defrag.Executor(mover).run(plan)
        self.assertEqual([defrag.FAILED, defrag.NOT_RUN],
                         [s.status for s in steps])
        self.assertIn('No valid host', steps[0].detail)
        self.assertEqual([('s1', 'c')], mover.calls)

    def test_rechecks_where_the_server_is(self):
        servers, plan = two_moves()
        mover = FakeMover({'s1': 'b', 's2': 'b'})
        steps = defrag.Executor(mover).run(plan)
        self.assertEqual(defrag.FAILED, steps[0].status)
        self.assertIn('now on b, not a as planned', steps[0].detail)
        self.assertEqual([], mover.calls)

    def test_ends_elsewhere(self):
        servers, plan = two_moves()
        mover = FakeMover({'s1': 'a', 's2': 'b'}, land={'s1': 'a'})
        steps = defrag.Executor(mover).run(plan[:1])
        self.assertEqual('server s1 ended on a, not c', steps[0].detail)

    def test_refuses_what_nova_cannot_move(self):
        servers, plan = two_moves()
        evict = moves.Move(moves.EVICT, servers[0])
        passthrough = moves.Server(
            'p', H.Assignment('a', (H.Slot(1, H.WHOLE),)), movable=True)
        steps = defrag.Executor(FakeMover({})).run(
            [evict], dry_run=True)
        self.assertIn('never evicts', steps[0].detail)
        steps = defrag.Executor(FakeMover({'p': 'a'})).run(
            [plan[0]._replace(server=passthrough)])
        self.assertIn('cannot live-migrate', steps[0].detail)

    def test_driver_precheck(self):
        servers, plan = two_moves()
        moved = plan[0]._replace(server=moves.Server(
            's1', servers[0].placement, movable=True, driver_branch='R550'))
        infos = {'c': drivers.DriverInfo.build('535.183.04')}
        mover = FakeMover({'s1': 'a'})
        (step,) = defrag.Executor(mover, infos).run([moved])
        self.assertEqual(defrag.FAILED, step.status)
        self.assertIn('guest driver branch R550 is not supported', step.detail)
        self.assertEqual([], mover.calls)

    def test_dry_run_moves_nothing(self):
        servers, plan = two_moves()
        mover = FakeMover({'s1': 'a', 's2': 'b'})
        steps = defrag.Executor(mover).run(plan, dry_run=True)
        self.assertEqual([defrag.PLANNED] * 2, [s.status for s in steps])
        self.assertEqual([], mover.calls)


class StatusMover(defrag.PollingMover):
    def __init__(self, states, **kw):
        super().__init__(sleep=lambda s: None, **kw)
        self.states = list(states)
        self.started = []

    def start(self, server_id, destination):
        self.started.append((server_id, destination))

    def status(self, server_id):
        return self.states.pop(0) if len(self.states) > 1 else self.states[0]


class PollingMoverTest(base.TestCase):
    S = defrag.ServerState

    def test_waits_until_active_on_destination(self):
        mover = StatusMover([self.S('MIGRATING', 'a', 'migrating'),
                             self.S('ACTIVE', 'b', 'migrating'),
                             self.S('ACTIVE', 'b')])
        mover.live_migrate('s', 'b')
        self.assertEqual(self.S('ACTIVE', 'b'), mover.wait('s', 'b'))
        self.assertEqual([('s', 'b')], mover.started)

    def test_failures(self):
        mover = StatusMover([self.S('ERROR', 'a', None, 'boom')])
        e = self.assertRaises(defrag.MigrationFailed, mover.wait, 's', 'b')
        self.assertEqual('server s is in ERROR: boom', str(e))
        mover = StatusMover([self.S('MIGRATING', 'a', 'migrating'),
                             self.S('ACTIVE', 'a')])
        e = self.assertRaises(defrag.MigrationFailed, mover.wait, 's', 'b')
        self.assertIn('ACTIVE on a, not b', str(e))
        mover = StatusMover([None])
        self.assertIn('gone', str(self.assertRaises(
            defrag.MigrationFailed, mover.wait, 's', 'b')))

    def test_timeout(self):
        clock = [0.0]

        def sleep(s):
            clock[0] += s
        mover = StatusMover([self.S('MIGRATING', 'a', 'migrating')],
                            timeout=5, interval=1)
        mover.sleep = sleep
        e = self.assertRaises(defrag.MigrationFailed, mover.wait, 's', 'b')
        self.assertEqual('server s still migrating after 5 s', str(e))
        self.assertLessEqual(5, clock[0])
        self.assertRaises(exceptions.InvalidRequest, defrag.PollingMover,
                          timeout=0)


def exporter_details(hosts):
    """What nova-gpu-exporter's /v1/hosts/<h> says of core hosts."""
    out = []
    for h in hosts.values():
        raw = report_mod.host_to_dict(h, devices={
            g.index: [{'kind': H.VGPU, 'detail': name}
                      for name, n in g.vgpus.items() for _ in range(n)]
            for g in h.gpus})
        out.append({'host': h.name, 'nodename': h.name, 'generation': 3,
                    'gpus': [{k: g[k] for k in (
                        'index', 'address', 'model', 'numa_node',
                        'mig_enabled', 'vgpu_types', 'devices')}
                        for g in raw['gpus']]})
    return out


def providers(hosts, kind=report_mod.PF_MDEV):
    return [{'name': '%s_pci_%d' % (h.name, g.index), 'host': h.name,
             'gpu': g.index, 'kind': kind, 'vgpu_type': FULL, 'mig': None}
            for h in hosts.values() for g in h.gpus]


class StateTest(base.TestCase):

    def test_hosts_and_servers_from_plain_data(self):
        hosts, _servers = fragmented()
        built, infos = inventory.hosts_from_api(exporter_details(hosts), CAT)
        self.assertEqual({n: h.snapshot()[3] for n, h in hosts.items()},
                         {n: h.snapshot()[3] for n, h in built.items()})
        self.assertEqual({}, infos)
        records = [
            inventory.ServerRecord('s1', 'a', 'ACTIVE', {
                'a_pci_0': {'VGPU': 1}, 'a': {'VCPU': 2}}),
            inventory.ServerRecord('s2', 'b', 'SHUTOFF', {
                'b_pci_0': {'VGPU': 1}}),
            inventory.ServerRecord('cpu-only', 'a', 'ACTIVE',
                                   {'a': {'VCPU': 1}}),
            inventory.ServerRecord('stale', 'a', 'ACTIVE', {
                'a_pci_1': {'VGPU': 1}}),
            inventory.ServerRecord('lost', 'z', 'ACTIVE', {
                'a_pci_1': {'VGPU': 1}}),
            inventory.ServerRecord('twice', 'a', 'ACTIVE', {
                'a_pci_0': {'VGPU': 1}})]
        servers, problems = inventory.servers_from_records(
            records, providers(built), built)
        self.assertEqual([('s1', True), ('s2', False)],
                         [(s.id, s.movable) for s in servers])
        self.assertEqual((H.Slot(0, H.VGPU, FULL),),
                         servers[0].placement.slots)
        self.assertEqual(3, len(problems))
        self.assertIn('server stale: its GPU devices are not in the report',
                      problems[0])
        self.assertIn('host z has no GPU report', problems[1])
        # s1's device, claimed again: one server per device
        self.assertIn('server twice: its GPU devices are not', problems[2])
        self.assertEqual({n: h.snapshot()[3] for n, h in hosts.items()},
                         {n: h.snapshot()[3] for n, h in built.items()})
        # PCI devices do not live-migrate
        servers, _p = inventory.servers_from_records(
            records[:1], providers(built, report_mod.PCI_POOL), built)
        self.assertFalse(servers[0].movable)
        # A provider set up for no vGPU type holds no server's device.
        untyped = providers(built)
        for p in untyped:
            p['vgpu_type'] = None
        servers, problems = inventory.servers_from_records(
            records[:1], untyped, built)
        self.assertEqual([], servers)
        self.assertEqual(['server s1: provider a_pci_0 has no vGPU type'],
                         problems)

    def test_bad_exporter_answer_names_the_field(self):
        hosts, _servers = fragmented()
        details = exporter_details(hosts)
        details[0]['gpus'][0]['model'] = 'NOPE'
        e = self.assertRaises(exceptions.InvalidRequest,
                              inventory.hosts_from_api, details, CAT)
        self.assertIn('gpus[0].model', str(e))


class FakeCloud:
    """The cloud port ``read_servers`` reads (``core.inventory``)."""

    def __init__(self, servers, allocations, images=None):
        self._servers = servers
        self._allocations = allocations
        self.images = images or {}

    def servers(self):
        return self._servers

    def allocations(self, server_id):
        return self._allocations.get(server_id, {})

    def image_property(self, image_id, key):
        return self.images[image_id].get(key)


class ReadServersTest(base.TestCase):

    def test_records(self):
        def server(sid, host, image):
            return types.SimpleNamespace(id=sid, host=host, status='ACTIVE',
                                         image_id=image)
        conn = FakeCloud(
            [server('s1', 'a', 'img-550'), server('s2', 'a', 'img-bad'),
             server('s3', 'elsewhere', 'img-550'),
             server('s4', 'a', 'img-550'), server('s5', 'a', 'img-gone'),
             server('s6', 'a', None)],
            {'s1': {'a_pci_0': {'VGPU': 1}},
             's2': {'a_pci_0': {'VGPU': 1}},
             's4': {'a': {'VCPU': 1}},
             's5': {'a_pci_0': {'VGPU': 1}},
             's6': {'a_pci_0': {'VGPU': 1}}},
            {'img-550': {drivers.IMAGE_PROPERTY: '550'},
             'img-bad': {drivers.IMAGE_PROPERTY: 'latest'}})
        records, problems = inventory.read_servers(
            conn, {'a': None}, [{'name': 'a_pci_0'}])
        # s5: its image is gone (unknown branch); s6: boot from volume.
        self.assertEqual([('s1', 'ACTIVE', 'R550'), ('s2', 'UNMOVABLE', None),
                          ('s5', 'ACTIVE', None), ('s6', 'ACTIVE', None)],
                         [(r.id, r.status, r.driver_branch) for r in records])
        self.assertEqual({'a_pci_0': {'VGPU': 1}}, records[0].allocations)
        self.assertIn('server s2: image property', problems[0])
