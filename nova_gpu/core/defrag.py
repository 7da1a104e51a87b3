"""Defragmentation by live migration: what to free, and carrying it out.

Three parts, all OpenStack-free (the ``openstack gpu defrag`` command and
the ``nova-gpu-defrag`` service bind them to Nova):

* **Targets**: what to make room for. The large requests the demand model
  expects (``demand_targets``: requests of at least ``min_gpus`` whole
  GPUs, and the NVLink-connected variant where hosts have NVLink sets of
  that size), or what an operator names (``parse_target``:
  ``whole:4``, ``whole:8:nvlink``, ``vgpu:T4-16C:2``, ``host:NAME`` to
  empty a host).
* **Proposal** (``propose``): for each target that fits nowhere now, the
  move planner's plan (``moves.MovePlanner``) restricted to live
  migrations: defragmentation never evicts. Each accepted plan is applied
  to copies of the hosts and the room it made is held, so the next target
  is planned on the cloud as it will be.
* **Executor** (``Executor.run``): carries the moves out one at a time
  through a ``Mover`` (ask Nova to live-migrate the server to the named
  host, wait until it is done), re-checking each move first (the server
  is still where the plan found it, its vGPU can move, the driver rule of
  ``core.drivers`` allows the destination) and stopping at the first
  failure. It reports every step.

The cloud's hosts and servers come from ``core.inventory``, which marks
only mdev-backed vGPU guests movable (Nova live-migrates those, since
29.0, when the destination offers the same mdev type); the planner's
``moves.migration_request`` asks the destination for the same vGPU type.
``CallbackMover`` is the ``Mover`` both adapters and the reclaimer use: the
live-migration request and the server's state are callables they hand in
(``nova_gpu.cloud_api.Nova.mover`` binds them to Nova); nothing here
talks to OpenStack.
"""

import dataclasses
import time
import typing

import tenacity

from nova_gpu.core import demand as demand_mod
from nova_gpu.core import drivers as drivers_mod
from nova_gpu.core import engine as engine_mod
from nova_gpu.core import exceptions
from nova_gpu.core import host as host_mod
from nova_gpu.core import moves
from nova_gpu.core import request as request_mod

# Step outcomes.
DONE = 'done'
FAILED = 'failed'
NOT_RUN = 'not run'
PLANNED = 'planned'   # a dry run


class MigrationFailed(Exception):
    """A live migration did not end with the server on its destination."""


# -- targets ---------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Target:
    """Room to make: a request that must fit one host, or a host to empty.

    ``text`` is how an operator writes it (``parse_target``).
    """

    text: str
    request: request_mod.GpuRequest = None
    drain: str = None  # host name


def parse_target(text):
    """``whole:N[:nvlink|numa]``, ``vgpu:TYPE:N`` or ``host:NAME``."""
    value = (text or '').strip()
    parts = value.split(':')
    try:
        if parts[0] == 'host' and len(parts) == 2 and parts[1]:
            return Target(value, drain=parts[1])
        if parts[0] == 'whole' and len(parts) in (2, 3):
            topology = parts[2] if len(parts) == 3 else 'any'
            return Target(value, request_mod.GpuRequest(
                host_mod.WHOLE, count=_count(parts[1]), topology=topology))
        if parts[0] == 'vgpu' and len(parts) == 3 and parts[1]:
            return Target(value, request_mod.GpuRequest(
                host_mod.VGPU, parts[1], count=_count(parts[2])))
    except exceptions.InvalidRequest as e:
        raise exceptions.InvalidRequest(
            'defrag target %r: %s' % (value, e)) from None
    raise exceptions.InvalidRequest(
        'defrag target %r: expected whole:N[:nvlink|numa], vgpu:TYPE:N or '
        'host:NAME' % (value,))


def _count(text):
    if not text.isdigit() or not 1 <= int(text) <= 64:
        raise exceptions.InvalidRequest('a GPU count 1..64, got %r' % text)
    return int(text)


def gpus_needed(req):
    """Whole GPUs a request takes, or 0 when it may share a GPU."""
    if req.kind == host_mod.WHOLE:
        return req.count
    return 0


def demand_targets(demand, hosts, min_gpus=4):
    """The large requests ``demand`` expects: most likely, then largest
    first (room for 8 GPUs also serves 4).

    Large: at least ``min_gpus`` whole GPUs on one host, no more than the
    biggest host holds. Where a host has an NVLink-connected set of that
    size, the NVLink variant follows (a large training job wants one).
    """
    hosts = list(_by_name(hosts).values())
    biggest = max((len(h.gpus) for h in hosts), default=0)
    found, seen = [], set()
    items = sorted(demand.items, key=lambda i: (-i.weight,
                                                -gpus_needed(i.request)))
    for item in items:
        req = item.request
        count = gpus_needed(req)
        if count < max(min_gpus, 1) or count > biggest:
            continue
        plain = request_mod.GpuRequest(host_mod.WHOLE, count=count,
                                       models=req.models)
        variants = [(plain, 'whole:%d' % count)]
        if count > 1 and any(_nvlink_set(h, count) for h in hosts):
            variants.append((dataclasses.replace(plain, topology='nvlink'),
                             'whole:%d:nvlink' % count))
        for variant, text in variants:
            if variant not in seen:
                seen.add(variant)
                found.append(Target(text, variant))
    return found


def _nvlink_set(host, count):
    return any(len(g.nvlink_peers) + 1 >= count for g in host.gpus)


# -- the proposal ------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class TargetPlan:
    """What ``propose`` decided for one target."""

    target: Target
    plan: moves.Plan = None  # None: nothing to do, or no plan
    note: str = ''

    def explain(self):
        lines = ['%s: %s' % (self.target.text, self.note)]
        if self.plan is not None and self.plan.moves:
            lines += ['  ' + line for line in self.plan.explain()]
        return lines


@dataclasses.dataclass(frozen=True)
class Proposal:
    outcomes: tuple

    @property
    def moves(self):
        return tuple(m for o in self.outcomes if o.plan is not None
                     for m in o.plan.moves)

    def explain(self):
        return [line for o in self.outcomes for line in o.explain()]


def propose(hosts, servers, targets, planner=None, max_moves=None):
    """Live migrations that make room for ``targets``, in order.

    ``hosts`` (Host objects or name -> Host) are not changed: the work is
    done on copies. Only movable servers are offered to the planner, and
    as non-spot: defragmentation moves, it never evicts. ``max_moves``
    bounds the moves of the whole proposal (a target whose plan would
    pass it is left out, with a note).
    """
    planner = planner or moves.MovePlanner()
    work = {n: h.copy() for n, h in _by_name(hosts).items()}
    # Every server, none evictable: the planner then only live-migrates
    # movable ones, and a drain sees what cannot leave.
    pool = [dataclasses.replace(s, spot=False) for s in servers]
    budget = max_moves
    outcomes = []
    for target in targets:
        if target.drain is not None:
            if target.drain not in work:
                outcomes.append(TargetPlan(target, None, 'no such GPU host'))
                continue
            plan = planner.drain(work, pool, target.drain)
            if plan is None:
                outcomes.append(TargetPlan(target, None, _why_not_drain(
                    pool, target.drain)))
                continue
            if not plan.moves:
                outcomes.append(TargetPlan(target, None, 'already empty'))
                continue
        else:
            plan = planner.plan(work, pool, target.request)
            if plan is None:
                outcomes.append(TargetPlan(
                    target, None, 'no plan of at most %d live migrations '
                    'frees room' % planner.max_moves))
                continue
            if not plan.moves:
                outcomes.append(TargetPlan(
                    target, None, 'fits now on %s GPU %s' % (
                        plan.host, _gpus(plan))))
                continue
        if budget is not None and len(plan.moves) > budget:
            outcomes.append(TargetPlan(
                target, None, 'needs %d live migrations, %d left of '
                '--max-moves' % (len(plan.moves), budget)))
            continue
        plan.apply(work)  # the room made stays held for the next target
        if budget is not None:
            budget -= len(plan.moves)
        moved = {m.server.id: m.destination for m in plan.moves}
        pool = [dataclasses.replace(s, placement=moved[s.id])
                if s.id in moved else s for s in pool]
        where = ('%s emptied' % plan.host if target.drain else
                 'frees %s GPU %s' % (plan.host, _gpus(plan)))
        outcomes.append(TargetPlan(
            target, plan, '%s with %d live migration%s' % (
                where, len(plan.moves),
                '' if len(plan.moves) == 1 else 's')))
    return Proposal(tuple(outcomes))


def _gpus(plan):
    return ','.join(str(g) for g in plan.placement.gpus)


def _why_not_drain(servers, name):
    stuck = sorted(s.id for s in servers if s.host == name and (
        not s.movable or moves.migration_request(s) is None))
    if stuck:
        return 'cannot be emptied: %s cannot live-migrate' % ', '.join(stuck)
    return 'cannot be emptied: no destination takes every server'


# -- carrying it out ---------------------------------------------------------

class Step(typing.NamedTuple):
    number: int
    move: moves.Move
    status: str  # DONE, FAILED, NOT_RUN or PLANNED
    detail: str = ''
    seconds: float = 0.0


class Mover:
    """The callbacks the executor carries moves out through.

    ``live_migrate`` asks for the migration and returns; ``wait`` blocks
    until it is over and raises ``MigrationFailed`` (or anything) unless
    the server is then running on ``destination``; ``locate`` tells the
    host a server runs on now (None: gone), for the re-checks.
    """

    def live_migrate(self, server_id, destination):
        raise NotImplementedError

    def wait(self, server_id, destination):
        raise NotImplementedError

    def locate(self, server_id):
        raise NotImplementedError


class ServerState(typing.NamedTuple):
    status: str       # Nova's server status (ACTIVE, MIGRATING, ERROR...)
    host: str         # compute host
    task_state: str = None
    fault: str = None


class PollingMover(Mover):
    """``wait`` and ``locate`` on top of one status call.

    Subclasses give ``start(server_id, destination)`` (the live-migration
    request) and ``status(server_id)`` (a ``ServerState``, None if the
    server is gone). ``wait`` polls every ``interval`` seconds, up to
    ``timeout``: done when the server is ACTIVE with no task on
    ``destination``; failed when it is in ERROR, gone, or ACTIVE again on
    another host (Nova rolled the migration back).
    """

    def __init__(self, timeout=600.0, interval=2.0, sleep=time.sleep):
        if timeout <= 0 or interval <= 0:
            raise exceptions.InvalidRequest(
                'migration timeout and poll interval must be > 0')
        self.timeout = timeout
        self.interval = interval
        self.sleep = sleep

    def start(self, server_id, destination):
        raise NotImplementedError

    def status(self, server_id):
        raise NotImplementedError

    def live_migrate(self, server_id, destination):
        self.start(server_id, destination)

    def locate(self, server_id):
        state = self.status(server_id)
        return None if state is None else state.host

    def wait(self, server_id, destination):
        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_result(lambda state: state is None),
            wait=tenacity.wait_fixed(self.interval),
            # Counted in polls, not wall time, so that a test's sleep
            # stand-in bounds it too; a slow status call only adds.
            stop=tenacity.stop_after_attempt(
                int(self.timeout // self.interval) + 1),
            sleep=self.sleep, reraise=True)
        try:
            return retrying(self._settled, server_id, destination)
        except tenacity.RetryError:
            raise MigrationFailed(
                'server %s still migrating after %.0f s'
                % (server_id, self.timeout)) from None

    def _settled(self, server_id, destination):
        """The final state, None while migrating; raises on failure."""
        state = self.status(server_id)
        if state is None:
            raise MigrationFailed('server %s is gone' % server_id)
        if state.status == 'ERROR':
            raise MigrationFailed('server %s is in ERROR%s' % (
                server_id, ': %s' % state.fault if state.fault else ''))
        if state.status != 'ACTIVE' or state.task_state:
            return None
        if state.host != destination:
            raise MigrationFailed(
                'server %s is ACTIVE on %s, not %s: Nova did not migrate it '
                '(see its instance actions)' % (server_id, state.host,
                                                destination))
        return state


class Executor:
    """Carries moves out one at a time; see the module docstring.

    ``drivers``: host name -> ``drivers.DriverInfo`` (hosts absent:
    unknown, allowed), for the driver rule's pre-check.
    """

    def __init__(self, mover, drivers=None, clock=time.monotonic):
        self.mover = mover
        self.drivers = drivers or {}
        self.clock = clock

    def check(self, move):
        """Why ``move`` cannot be carried out now, or None."""
        if move.action != moves.MIGRATE:
            return 'defragmentation never evicts (%s)' % move.action
        server = move.server
        if not server.movable:
            return 'server %s is not movable' % server.id
        if moves.migration_request(server) is None:
            return ('server %s has devices Nova cannot live-migrate (PCI '
                    'passthrough, vendor-VFIO VF or bare MIG instance)'
                    % server.id)
        problem = drivers_mod.migration_problem(
            self.drivers.get(server.host),
            self.drivers.get(move.destination.host), server.driver_branch)
        if problem:
            return 'server %s cannot run on %s: %s' % (
                server.id, move.destination.host, problem)
        return None

    def run(self, plan_moves, dry_run=False):
        """A ``Step`` per move; after a failure the rest are NOT_RUN."""
        steps = []
        failed = False
        for number, move in enumerate(plan_moves, 1):
            if failed:
                steps.append(Step(number, move, NOT_RUN,
                                  'an earlier step failed'))
                continue
            if dry_run:
                problem = self.check(move)
                steps.append(Step(number, move, FAILED if problem
                                  else PLANNED, problem or move.explain()))
                failed = bool(problem)
                continue
            step = self._one(number, move)
            failed = step.status == FAILED
            steps.append(step)
        return steps

    def _one(self, number, move):
        start = self.clock()
        server, dest = move.server, move.destination.host

        def step(status, detail):
            return Step(number, move, status, detail, self.clock() - start)
        problem = self.check(move)
        if problem:
            return step(FAILED, problem)
        try:
            where = self.mover.locate(server.id)
            if where != server.host:
                return step(FAILED, 'server %s is now on %s, not %s as '
                            'planned: plan again' % (server.id, where,
                                                     server.host))
            self.mover.live_migrate(server.id, dest)
            self.mover.wait(server.id, dest)
            where = self.mover.locate(server.id)
        except Exception as e:  # the mover's, whatever the client raises
            return step(FAILED, '%s: %s' % (type(e).__name__, e))
        if where != dest:
            return step(FAILED, 'server %s ended on %s, not %s'
                        % (server.id, where, dest))
        return step(DONE, 'server %s is ACTIVE on %s' % (server.id, dest))


def _by_name(hosts):
    return hosts if isinstance(hosts, dict) else {h.name: h for h in hosts}


class CallbackMover(PollingMover):
    """``PollingMover`` over two callables the adapter hands in:
    ``start(server_id, destination)`` asks for the live migration,
    ``status(server_id)`` gives a ``ServerState`` (None: gone).
    """

    def __init__(self, start, status, **kw):
        super().__init__(**kw)
        self._start = start
        self._status = status

    def start(self, server_id, destination):
        self._start(server_id, destination)

    def status(self, server_id):
        return self._status(server_id)


def cloud_demand(catalog, hosts):
    """The demand model over the GPU models ``hosts`` have."""
    models = {g.model.name for h in _by_name(hosts).values()
              for g in h.gpus}
    return demand_mod.catalog_demand(catalog, models=models)


def propose_for_cloud(catalog, hosts, servers, infos, targets=None,
                      min_gpus=4, max_moves=4):
    """``propose`` with the planner and targets both adapters use.

    ``targets``: ``Target`` objects, or None for the large requests of
    the demand model (``demand_targets``); the planner scores against
    the same demand and checks the driver rule (``infos``).
    """
    demand = cloud_demand(catalog, hosts)
    if targets is None:
        targets = demand_targets(demand, hosts, min_gpus=min_gpus)
    planner = moves.MovePlanner(
        engine_mod.PlacementEngine(demand), max_moves=max_moves,
        compatible=drivers_mod.compatibility_rule(infos))
    return propose(hosts, servers, targets, planner, max_moves=max_moves)
