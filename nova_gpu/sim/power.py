"""Power: idle hosts over a replay with departures, and consolidation.

The FGD replay (``replay``) never lets a task leave. Here tasks arrive at
their ``creation_time`` and leave at their ``deletion_time`` (columns of
the Alibaba ``openb_pod_list_*.csv``), placed by one of the simulator's
policies (``policies``). A host that runs nothing is idle: it could be
powered down. Over the replay we integrate the idle hosts' GPUs over
time (idle GPU-hours: what powering idle hosts down saves) and sample
the idle host count.

``consolidate`` adds the move planner (``nova_gpu.core.moves``): every
``period_s`` of trace time, lightly used hosts (GPU use at most
``light``) are drained by live migration onto hosts that stay on, so
that they become idle. Each task is a server with its GPU share
(SHARE slots of a core ``Host``, one per GPU); single-GPU tasks are
movable (a vGPU guest of any size, up to a full-GPU profile, live-migrates
in Nova), multi-GPU tasks are not. CPU-only tasks are left out: in a
cloud they run on CPU hosts.

``spot``: that share of the GPU tasks (drawn with the seed) are spot
servers. A spot task that fits no node is refused; an on-demand one asks
the move planner, as the reclaimer does (``Reclaimer.for_request``), for
a plan that evicts spot servers only (no live migration), and is placed
where it makes room; the evicted spot tasks end there. ``evict=False``
is the baseline: on-demand tasks are refused like spot ones.
"""

import csv
import dataclasses
import math
import time

import numpy as np

from nova_gpu.core import catalog as catalog_mod
from nova_gpu.core import exceptions
from nova_gpu.core import host as host_mod
from nova_gpu.core import moves
from nova_gpu.core import request as request_mod
from nova_gpu.sim import policies as policies_mod
from nova_gpu.sim import state as state_mod
from nova_gpu.sim import trace as trace_mod

TIME_COLUMNS = ('name', 'creation_time', 'deletion_time')
HOUR = 3600.0
LARGE = 4  # GPUs: a large request (4- and 8-GPU tasks of the trace)
DEFRAG_TARGETS = 16  # hosts the planner may free for one large task


def load_lifetimes(path, tasks):
    """(created, deleted) seconds per task of ``tasks`` (same file).

    An empty ``deletion_time`` means the task never leaves (inf).
    """
    with open(path, newline='') as f:
        reader = csv.DictReader(f)
        missing = [c for c in TIME_COLUMNS
                   if c not in (reader.fieldnames or ())]
        if missing:
            raise exceptions.InvalidRequest(
                'task list %s lacks column(s) %s: no departures to replay'
                % (path, ', '.join(missing)))
        times = {}
        for line, row in enumerate(reader, 2):
            try:
                created = float(row['creation_time'])
                raw = (row['deletion_time'] or '').strip()
                deleted = float(raw) if raw else math.inf
            except ValueError:
                raise exceptions.InvalidRequest(
                    '%s line %d: creation_time and deletion_time must be '
                    'numbers, got %r and %r' % (
                        path, line, row['creation_time'],
                        row['deletion_time'])) from None
            if deleted < created:
                raise exceptions.InvalidRequest(
                    '%s line %d: %s is deleted (%s) before it is created '
                    '(%s)' % (path, line, row['name'], deleted, created))
            times[row['name']] = (created, deleted)
    try:
        pairs = [times[n] for n in tasks.names]
    except KeyError as e:
        raise exceptions.InvalidRequest('%s has no times for task %s'
                                        % (path, e.args[0])) from None
    return (np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs]))


def at_load(tasks, created, deleted, capacity_milli, load, repeat=1,
            seed=0, cap_quantile=0.95):
    """(tasks, arrivals, departures) for an offered GPU ``load``.

    The trace's own times are a snapshot: about 40 GPUs busy at once on a
    6,212-GPU cluster. Keeping each task's lifetime (``deleted -
    created``, cut at its ``cap_quantile`` so that the few tasks that ran
    for months do not stand for the whole load) and its order, arrivals
    become a Poisson process whose rate makes the mean GPU demand
    ``load`` x the capacity (Little's law). The list is replayed
    ``repeat`` times in a row so that the load has time to settle.
    """
    if not 0 < load <= 2 or repeat < 1:
        raise exceptions.InvalidRequest(
            'load must be in (0, 2] and repeat >= 1, got %r and %r'
            % (load, repeat))
    if repeat > 1:
        first = np.argsort(created, kind='stable')
        lives = (deleted - created)[first]
        tasks = tasks.take(np.tile(first, repeat))
        tasks.names = ['%s-%d' % (n, k // len(first))
                       for k, n in enumerate(tasks.names)]
        # Only the order and the lifetimes matter from here on.
        created = np.arange(len(tasks), dtype=float)
        deleted = created + np.tile(lives, repeat)
    life = deleted - created
    finite = life[np.isfinite(life)]
    cap = float(np.quantile(finite, cap_quantile)) if len(finite) else 1.0
    life = np.clip(np.where(np.isfinite(life), life, cap), 1.0,
                   max(cap, 1.0))
    gpu = tasks.num_gpu > 0
    work = float((tasks.num_gpu * tasks.milli * life)[gpu].sum())
    rate = load * capacity_milli / work * gpu.sum()  # GPU tasks / second
    rng = np.random.default_rng(seed)
    arrivals = np.empty(len(life))
    order = np.argsort(created, kind='stable')
    arrivals[order] = np.cumsum(rng.exponential(1.0 / rate, len(life)))
    return tasks, arrivals, arrivals + life


class DepartingCluster(state_mod.Cluster):
    """The simulator's cluster state, plus tasks leaving."""

    def release(self, node, cpu, mem, gpus, milli):
        """Undo ``allocate(node, cpu, mem, gpus, milli)``."""
        self.cpu[node] += cpu
        self.mem[node] += mem
        for g in gpus:
            self.left[node, g] += milli
        self.used -= milli * len(gpus)
        # The policies' fragmentation counters follow the node's state.
        self._refresh(node)


@dataclasses.dataclass
class PowerResult:
    policy: str
    consolidate: bool
    hosts: int
    gpus: int
    placed: int
    refused: int
    idle_gpu_hours: float
    samples: list  # (hour, idle hosts)
    drains: int = 0
    migrations: int = 0
    large_refused: int = 0  # refused tasks of LARGE GPUs or more
    defragmented: int = 0  # tasks placed after moves (``defrag``)
    evictions: int = 0
    memory_moved_gib: float = 0.0
    seconds: float = 0.0
    defrag: bool = False
    spot_share: float = 0.0
    evict: bool = False
    spot_placed: int = 0
    spot_refused: int = 0
    od_refused: int = 0
    # On-demand tasks refused although evicting the spot tasks of one
    # host would have made room (spot capacity remained).
    od_refused_spot_left: int = 0
    by_eviction: int = 0  # on-demand tasks placed after evictions
    od_gpu_hours: float = 0.0  # GPU-hours served, up to the last arrival
    spot_gpu_hours: float = 0.0
    evicted: list = dataclasses.field(default_factory=list)  # task names

    @property
    def evictions_per_served(self):
        return self.evictions / self.by_eviction if self.by_eviction else 0.0

    @property
    def mean_idle_hosts(self):
        return (sum(s[1] for s in self.samples) / len(self.samples)
                if self.samples else 0.0)


class _Fleet:
    """Core hosts and servers mirroring the cluster, for the planner."""

    def __init__(self, nodes, catalog=None):
        catalog = catalog or catalog_mod.load_catalog()
        self.models = {m: _model(catalog, m) for m in set(nodes.models)}
        self.hosts = {}
        for i, name in enumerate(nodes.names):
            model = self.models[nodes.models[i]]
            self.hosts[name] = host_mod.Host(
                name, [host_mod.Gpu(g, model)
                       for g in range(int(nodes.gpus[i]))],
                int(nodes.cpu[i]), int(nodes.memory[i]))
        self.servers = {}  # task index -> moves.Server

    def place(self, task, name, gpus, cpu, mem, milli, movable,
              spot=False):
        placement = host_mod.Assignment(
            name, tuple(host_mod.Slot(int(g), host_mod.SHARE, int(milli))
                        for g in gpus), None, int(cpu), int(mem))
        self.hosts[name].allocate(placement)
        self.servers[task] = moves.Server(str(task), placement,
                                          spot=spot, movable=movable)

    def remove(self, task):
        server = self.servers.pop(task)
        self.hosts[server.host].free(server.placement)
        return server


def replay_power(nodes, tasks, created, deleted, policy, consolidate=False,
                 period_s=6 * HOUR, light=0.25, max_drains=8, targets=16,
                 samples=24, seed=0, planner=None, defrag=False,
                 spot=0.0, evict=True):
    """Replay arrivals and departures; see the module docstring.

    ``defrag``: a task of ``LARGE`` GPUs or more that fits no node asks
    the move planner for live migrations that make it fit (the same
    model only: vGPU types must match), and is placed if it finds some.
    ``spot``: the share of GPU tasks that are spot (or their names);
    ``evict``: whether on-demand tasks that fit nowhere evict spot ones.
    """
    if isinstance(policy, str):
        policy = policies_mod.make(policy)
    if not 0 < light <= 1 or period_s <= 0:
        raise exceptions.InvalidRequest('light must be in (0, 1] and '
                                        'period_s positive')
    gpu_tasks = [i for i in range(len(tasks)) if tasks.num_gpu[i]]
    is_spot = _spot_tasks(tasks, gpu_tasks, spot, seed)
    cluster = DepartingCluster(nodes)
    policy.setup(cluster, trace_mod.typical_tasks(tasks),
                 trace_mod.typical_tasks(tasks, with_memory=True))
    fleet = _Fleet(nodes)
    index = {name: i for i, name in enumerate(nodes.names)}
    planner = planner or moves.MovePlanner(
        max_destinations=4, compatible=lambda server, name: (
            nodes.models[index[name]] == nodes.models[index[server.host]]))
    rng = np.random.default_rng(seed)
    ngpu = nodes.gpus.astype(np.int64)
    running = np.zeros(len(nodes), np.int64)
    where = {}  # task -> (node, gpus)
    events = sorted([(float(created[i]), 1, i) for i in gpu_tasks] +
                    [(float(deleted[i]), 0, i) for i in gpu_tasks
                     if math.isfinite(deleted[i])])
    # Measured while tasks arrive; after the last one the cluster only
    # empties, which says nothing about a policy.
    end = max((e[0] for e in events if e[1]), default=0.0)
    start = events[0][0] if events else 0.0
    marks = list(np.linspace(start, end, samples)) if samples else []
    result = PowerResult(policy.name, consolidate, len(nodes),
                         int(ngpu.sum()), 0, 0, 0.0, [], defrag=defrag,
                         spot_share=len(is_spot) / max(len(gpu_tasks), 1),
                         evict=evict and bool(is_spot))
    started = {}  # task -> arrival, for the GPU-hours served
    cache = {}
    idle_gpus = int(ngpu.sum())
    now = start
    next_round = start + period_s
    wall = time.perf_counter()

    def advance(t):
        nonlocal now
        result.idle_gpu_hours += idle_gpus * (t - now) / HOUR
        now = t

    def occupy(node, delta):
        nonlocal idle_gpus
        before = running[node]
        running[node] += delta
        if before == 0 and running[node] > 0:
            idle_gpus -= int(ngpu[node])
        elif before > 0 and running[node] == 0:
            idle_gpus += int(ngpu[node])

    for t, arrive, i in events:
        if t > end:
            break
        while marks and marks[0] <= t:
            advance(marks.pop(0))
            result.samples.append((round(float(now) / HOUR, 2),
                                   int((running == 0).sum())))
        while consolidate and next_round <= t:
            advance(next_round)
            _consolidate(cluster, fleet, planner, where, running, occupy,
                         index, nodes, tasks, light, max_drains, targets,
                         result)
            next_round += period_s
        advance(t)
        cpu, mem = int(tasks.cpu[i]), int(tasks.memory[i])
        num, milli = int(tasks.num_gpu[i]), int(tasks.milli[i])
        if not arrive:
            if i in where:
                node, gpus = where.pop(i)
                cluster.release(node, cpu, mem, gpus, milli)
                fleet.remove(i)
                occupy(node, -1)
                _served(result, tasks, i, started.pop(i), t, i in is_spot)
            continue
        access = _access(cluster, tasks.spec[i], cache)
        mask = cluster.feasible(cpu, mem, num, milli, access)
        if not mask.any():
            if i in is_spot:
                result.spot_refused += 1
            elif result.evict and _evict_for(
                    cluster, fleet, planner, where, occupy, index, nodes,
                    tasks, i, access, result, started, t, is_spot):
                result.by_eviction += 1
                result.placed += 1
                started[i] = t
                continue
            elif defrag and num >= LARGE and _defrag(
                    cluster, fleet, planner, where, occupy, index, nodes,
                    tasks, i, result):
                result.defragmented += 1
                result.placed += 1
                started[i] = t
                continue
            else:
                result.od_refused += 1
                result.od_refused_spot_left += bool(is_spot) and bool(
                    _evictable(cluster, fleet, planner, index, nodes,
                               tasks, i, access, is_spot))
            result.refused += 1
            result.large_refused += num >= LARGE
            continue
        node, gpus = policy.choose(cluster, (cpu, mem, num, milli), mask,
                                   rng)
        cluster.allocate(node, cpu, mem, gpus, milli)
        fleet.place(i, nodes.names[node], gpus, cpu, mem, milli,
                    movable=num == 1, spot=i in is_spot)
        where[i] = (node, tuple(gpus))
        occupy(node, 1)
        result.placed += 1
        result.spot_placed += i in is_spot
        started[i] = t
    for i, since in started.items():  # still running at the last arrival
        _served(result, tasks, i, since, end, i in is_spot)
    while marks:  # only the end mark can be left
        advance(max(marks.pop(0), now))
        result.samples.append((round(float(now) / HOUR, 2),
                               int((running == 0).sum())))
    result.seconds = time.perf_counter() - wall
    return result


def _model(catalog, name):
    """The catalog's model (its memory counts what a migration moves),
    or a generic one for the trace's undisclosed models (G1, G2, G3).
    """
    try:
        return catalog.model(name)
    except exceptions.GpuError:
        return catalog_mod.GpuModel.generic(name)


def _spot_tasks(tasks, gpu_tasks, spot, seed):
    """Indices of the spot tasks: a seeded share, or the names given."""
    if isinstance(spot, (int, float)):
        if not 0 <= spot <= 1:
            raise exceptions.InvalidRequest(
                'spot must be a share in [0, 1], got %r' % (spot,))
        if not gpu_tasks:
            return set()
        # Its own generator, so that the policy's draws do not depend
        # on it.
        return set(np.random.default_rng([seed, 1]).choice(
            gpu_tasks, int(round(spot * len(gpu_tasks))),
            replace=False).tolist())
    names = set(spot)
    found = {i for i in gpu_tasks if tasks.names[i] in names}
    unknown = names - {tasks.names[i] for i in found}
    if unknown:
        raise exceptions.InvalidRequest(
            'spot tasks %s are not GPU tasks of the list'
            % ', '.join(sorted(unknown)))
    return found


def _served(result, tasks, i, since, until, spot):
    hours = (int(tasks.num_gpu[i]) * int(tasks.milli[i]) / host_mod.MILLI
             * max(until - since, 0.0) / HOUR)
    if spot:
        result.spot_gpu_hours += hours
    else:
        result.od_gpu_hours += hours


def _eligible(cluster, nodes, access, num):
    """Mask of the nodes of the task's models with ``num`` GPUs or more."""
    return access[cluster.model] & (nodes.gpus >= num)


def _evictable(cluster, fleet, planner, index, nodes, tasks, i, access,
               is_spot):
    """Hosts where evicting every spot task makes room for task ``i``.

    {name: its spot servers, none movable}; the evictions a plan there
    needs are at most that many (the planner may need fewer).
    """
    ok = _eligible(cluster, nodes, access, int(tasks.num_gpu[i]))
    spot = {}
    for task, s in fleet.servers.items():
        if task in is_spot and ok[index[s.host]]:
            spot.setdefault(s.host, []).append(
                dataclasses.replace(s, movable=False))
    req = _request(tasks, i)
    room = {}
    for name, mine in spot.items():
        host = fleet.hosts[name]
        for s in mine:
            host.free(s.placement)
        try:
            if planner.engine.rank(host, req):
                room[name] = mine
        finally:
            for s in reversed(mine):
                host.allocate(s.placement)
    return room


def _evict_for(cluster, fleet, planner, where, occupy, index, nodes, tasks,
               i, access, result, started, now, is_spot):
    """Evict spot tasks so that on-demand task ``i`` fits; True if placed.

    The planner sees the spot servers only, none movable: its plan is
    the reclaimer's eviction-only plan, the fewest evictions on one host.
    """
    room = _evictable(cluster, fleet, planner, index, nodes, tasks, i,
                      access, is_spot)
    if not room:
        return False
    # Hosts worth freeing: those with the fewest spot servers to go
    # (few, for speed). Eviction needs no destination, so the planner
    # needs no other host.
    names = sorted(room, key=lambda n: (len(room[n]), index[n]))
    names = names[:DEFRAG_TARGETS]
    plan = planner.plan({n: fleet.hosts[n] for n in names},
                        [s for n in names for s in room[n]],
                        _request(tasks, i))
    if plan is None or not plan.moves:
        return False
    for move in plan.moves:
        task = int(move.server.id)
        _served(result, tasks, task, started.pop(task), now, True)
        result.evicted.append(tasks.names[task])
    _carry_out(cluster, fleet, where, occupy, index, tasks, i, plan, result)
    return True


def _request(tasks, i):
    return request_mod.GpuRequest(
        host_mod.SHARE, count=int(tasks.num_gpu[i]),
        milli=int(tasks.milli[i]), cpu_milli=int(tasks.cpu[i]),
        memory_mib=int(tasks.memory[i]), models=tasks.spec[i])


def _access(cluster, spec, cache):
    acc = cache.get(spec)
    if acc is None:
        acc = cache[spec] = np.array(
            [spec is None or m in spec for m in cluster.model_names])
    return acc


def _apply_move(cluster, fleet, where, occupy, index, tasks, move, result):
    """Carry one planner move out on the cluster and the fleet."""
    task = int(move.server.id)
    cpu, mem = int(tasks.cpu[task]), int(tasks.memory[task])
    milli = int(tasks.milli[task])
    old, gpus = where.pop(task)
    cluster.release(old, cpu, mem, gpus, milli)
    server = fleet.remove(task)
    occupy(old, -1)
    if move.action == moves.EVICT:
        result.evictions += 1
        return
    new = index[move.destination.host]
    new_gpus = tuple(s.gpu for s in move.destination.slots)
    cluster.allocate(new, cpu, mem, new_gpus, milli)
    fleet.hosts[move.destination.host].allocate(move.destination)
    fleet.servers[task] = dataclasses.replace(server,
                                              placement=move.destination)
    where[task] = (new, new_gpus)
    occupy(new, 1)
    result.migrations += 1
    result.memory_moved_gib += move.memory_mib / 1024.0


def _defrag(cluster, fleet, planner, where, occupy, index, nodes, tasks, i,
            result):
    """Make room for refused task ``i`` by moves; True if placed."""
    num = int(tasks.num_gpu[i])
    req = _request(tasks, i)
    # Hosts worth freeing: the task's models, enough GPUs, the most free
    # GPU capacity first (few, for speed).
    left = cluster.left.sum(1)
    fits = [n for n in np.argsort(-left, kind='stable')
            if nodes.gpus[n] >= num and (tasks.spec[i] is None
                                         or nodes.models[n] in tasks.spec[i])]
    targets = {nodes.names[n] for n in fits[:DEFRAG_TARGETS]}
    # Live migration only: evicting spot servers is the reclaimer's
    # business (``_evict_for``), not defragmentation's.
    servers = [dataclasses.replace(s, spot=False) if s.spot else s
               for s in fleet.servers.values()]
    plan = planner.plan(fleet.hosts, servers, req, targets=targets)
    if plan is None or not plan.moves:
        return False
    _carry_out(cluster, fleet, where, occupy, index, tasks, i, plan, result)
    return True


def _carry_out(cluster, fleet, where, occupy, index, tasks, i, plan,
               result):
    """Apply ``plan``'s moves, then place task ``i`` where it says."""
    cpu, mem = int(tasks.cpu[i]), int(tasks.memory[i])
    num, milli = int(tasks.num_gpu[i]), int(tasks.milli[i])
    for move in plan.moves:
        _apply_move(cluster, fleet, where, occupy, index, tasks, move,
                    result)
    node = index[plan.host]
    gpus = tuple(s.gpu for s in plan.placement.slots)
    cluster.allocate(node, cpu, mem, gpus, milli)
    fleet.place(i, plan.host, gpus, cpu, mem, milli, movable=num == 1)
    where[i] = (node, gpus)
    occupy(node, 1)


def _consolidate(cluster, fleet, planner, where, running, occupy, index,
                 nodes, tasks, light, max_drains, targets, result):
    """Drain up to ``max_drains`` lightly used hosts onto busy ones."""
    capacity = nodes.gpus * host_mod.MILLI
    used = capacity - cluster.left.sum(1)
    active = running > 0
    share = np.where(capacity > 0, used / np.maximum(capacity, 1), 1.0)
    light_hosts = [int(n) for n in np.argsort(share, kind='stable')
                   if active[n] and share[n] <= light]
    drained = set()
    for node in light_hosts[:max_drains]:
        name = nodes.names[node]
        mine = [s for s in fleet.servers.values() if s.host == name]
        if not mine or any(not s.movable for s in mine):
            continue
        # Destinations: busy hosts that stay on, fullest first (few, for
        # speed), of the same GPU model (the vGPU types must match).
        biggest = max(s.placement.slots[0].detail for s in mine)
        room = cluster.left.max(1)
        cands = [int(n) for n in np.argsort(-share, kind='stable')
                 if active[n] and n != node and nodes.names[n] not in drained
                 and room[n] >= biggest and share[n] > light
                 and nodes.models[n] == nodes.models[node]]
        allowed = {nodes.names[n] for n in cands[:targets]}
        if not allowed:
            continue
        plan = planner.drain(fleet.hosts, mine, name, targets=allowed)
        if plan is None:
            continue
        for move in plan.moves:
            _apply_move(cluster, fleet, where, occupy, index, tasks, move,
                        result)
        drained.add(name)
        result.drains += 1
