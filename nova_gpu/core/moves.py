"""Make room by moving servers: the one move planner of nova-gpu.

When a request fits no host now, capacity may still be there, held by
servers that can go: spot (preemptible) servers may be evicted, movable
servers (live-migratable vGPU guests) may be live-migrated to another host
that offers the same vGPU type. ``MovePlanner.plan`` chooses the moves
that make the request fit one host:

1. the fewest moves (servers touched),
2. then the fewest evictions (a spot server that can be live-migrated is
   migrated rather than evicted),
3. then the least GPU memory moved (what a live migration copies),
4. then the least growth of expected fragmentation (the FGD measure,
   ``fragmentation.host_fragmentation``) over the hosts touched, the
   request placed.

Only the host that takes the request is freed: a request lives on one
host, so moves elsewhere cannot help it, and chains of migrations (move A
so that B fits where A was) are not considered. The planner never moves
a server that is neither spot nor movable, never places a migrated
server on the host being freed, and asks ``compatible(server, host)``
(the driver rule, ``nova_gpu.core.drivers``) before choosing a
destination. ``MovePlanner.drain`` plans the live migration of every
server off one host (consolidation, so the host can be powered down).

Planning works on the hosts given (``host.Host``) through their public
``allocate``/``free`` only, undoing every trial; ``Plan.apply`` then
carries a plan out on them. Everything here is OpenStack-free: the
reclaimer, the defragmenter and the simulator share it.
"""

import dataclasses
import itertools
import typing

from nova_gpu.core import engine as engine_mod
from nova_gpu.core import exceptions
from nova_gpu.core import fragmentation
from nova_gpu.core import host as host_mod
from nova_gpu.core import request as request_mod

EVICT = 'evict'
MIGRATE = 'migrate'


@dataclasses.dataclass(frozen=True)
class Server:
    """A running server as the planner sees it.

    ``spot``: its flavor is preemptible, so it may be evicted.
    ``movable``: it may be live-migrated (its vGPU type must also be
    offered on the destination; whole-GPU passthrough and bare MIG
    instances never migrate, see ``migration_request``).
    ``driver_branch``: the guest's NVIDIA driver branch, if known, for
    the ``compatible`` rule.
    """

    id: str
    placement: host_mod.Assignment
    spot: bool = False
    movable: bool = False
    driver_branch: str = None

    @property
    def host(self):
        return self.placement.host


class Move(typing.NamedTuple):
    action: str  # EVICT or MIGRATE
    server: Server
    destination: host_mod.Assignment = None  # MIGRATE only
    memory_mib: int = 0  # GPU memory the server holds

    def explain(self):
        """One line saying what this move does and why it is allowed."""
        src = '%s GPU %s' % (self.server.host, _gpus(self.server.placement))
        what = '%s, %d MiB GPU memory' % (_devices(self.server.placement),
                                          self.memory_mib)
        if self.action == EVICT:
            return 'evict spot server %s from %s (%s freed)' % (
                self.server.id, src, what)
        return 'live-migrate server %s from %s to %s GPU %s (%s moved)' % (
            self.server.id, src, self.destination.host,
            _gpus(self.destination), what)


@dataclasses.dataclass(frozen=True)
class Plan:
    """Moves that make ``request`` fit ``host`` at ``placement``."""

    request: request_mod.GpuRequest
    host: str
    placement: host_mod.Assignment
    moves: tuple
    fragmentation_delta: float  # milli-GPUs, over the hosts touched

    @property
    def evictions(self):
        return sum(1 for m in self.moves if m.action == EVICT)

    @property
    def migrations(self):
        return sum(1 for m in self.moves if m.action == MIGRATE)

    @property
    def memory_moved_mib(self):
        return sum(m.memory_mib for m in self.moves if m.action == MIGRATE)

    def cost(self):
        """Lexicographic: servers touched, evictions, memory moved, frag."""
        return (len(self.moves), self.evictions, self.memory_moved_mib,
                round(self.fragmentation_delta, 6))

    def explain(self):
        """One line per move, then the request's placement."""
        lines = ['%d. %s' % (n, m.explain())
                 for n, m in enumerate(self.moves, 1)]
        if self.request is not None:
            lines.append('then place %s on %s GPU %s (fragmentation %+.0f '
                         'milli-GPU)' % (_describe(self.request), self.host,
                                         _gpus(self.placement),
                                         self.fragmentation_delta))
        return lines

    def apply(self, hosts):
        """Carry the plan out on ``hosts`` (name -> Host), in order.

        Migrations come before evictions (see ``MovePlanner``), so a
        caller that stops on the first failure has evicted nobody in
        vain. The request's placement is applied last when present.
        """
        hosts = _by_name(hosts)
        for move in self.moves:
            hosts[move.server.host].free(move.server.placement)
            if move.action == MIGRATE:
                hosts[move.destination.host].allocate(move.destination)
        if self.placement is not None:
            hosts[self.host].allocate(self.placement)


def migration_request(server):
    """The request a destination must serve to take ``server`` live.

    Nova live-migrates a vGPU guest when the destination offers the same
    vGPU type; a share (the simulator's container-style GPU share) moves
    as a share. Whole-GPU passthrough and bare MIG instances (PCI devices
    of the host) do not live-migrate: None. Mixed devices: None.
    """
    placement = server.placement
    slots = placement.slots
    details = set()
    for slot in slots:
        if slot.kind == host_mod.VGPU:
            details.add((host_mod.VGPU, slot.detail))
        elif slot.kind == host_mod.MIG and slot.detail[2] is not None:
            details.add((host_mod.VGPU, slot.detail[2]))
        elif slot.kind == host_mod.SHARE and len(slots) == 1:
            details.add((host_mod.SHARE, slot.detail))
        else:
            return None
    if len(details) != 1:
        return None
    kind, detail = details.pop()
    if kind == host_mod.SHARE:
        return request_mod.GpuRequest(
            kind, milli=detail, cpu_milli=placement.cpu_milli,
            memory_mib=placement.memory_mib)
    return request_mod.GpuRequest(
        kind, detail, count=len(slots), cpu_milli=placement.cpu_milli,
        memory_mib=placement.memory_mib)


def gpu_memory_mib(server, host):
    """GPU memory ``server`` holds on ``host`` (what a migration copies)."""
    total = 0
    for slot in server.placement.slots:
        model = host.gpus[slot.gpu].model
        if slot.kind == host_mod.WHOLE:
            total += model.framebuffer_mib
        elif slot.kind == host_mod.SHARE:
            total += model.framebuffer_mib * slot.detail // host_mod.MILLI
        elif slot.kind == host_mod.VGPU:
            total += model.vgpu_profile(slot.detail).framebuffer_mib
        else:
            total += model.mig_profile(slot.detail[0]).framebuffer_mib
    return total


def _always(server, host_name):
    return True


class MovePlanner:
    """Plans evictions and live migrations; see the module docstring.

    ``max_moves`` bounds the servers one plan touches; ``max_candidates``
    the servers of one host considered (the largest GPU holders first);
    ``max_destinations`` the destinations tried per migrated server.
    ``compatible(server, host_name)`` says whether ``server`` may run on
    ``host_name`` (e.g. ``drivers.compatibility_rule``).
    """

    def __init__(self, engine=None, max_moves=4, max_candidates=12,
                 max_destinations=8, compatible=None):
        if max_moves < 0 or max_candidates < 1 or max_destinations < 1:
            raise exceptions.InvalidRequest(
                'max_moves must be >= 0, max_candidates and '
                'max_destinations >= 1')
        self.engine = engine or engine_mod.PlacementEngine()
        self.demand = self.engine.demand
        self.max_moves = max_moves
        self.max_candidates = max_candidates
        self.max_destinations = max_destinations
        self.compatible = compatible or _always

    # -- public -----------------------------------------------------------

    def plan(self, hosts, servers, req, targets=None):
        """The best ``Plan`` that makes ``req`` fit, or None.

        ``hosts``: Host objects (or name -> Host); ``servers``: every
        ``Server`` running on them. A request that fits now gets a plan
        without moves. ``targets`` (names), when given, are the only
        hosts that may be freed for ``req`` (a large cloud's caller
        narrows the search); migrated servers may still go to any host.
        The hosts are left as they were.
        """
        hosts = _by_name(hosts)
        now = self._fit_now(hosts, req)
        if now is not None:
            return now
        by_host = self._displaceable(hosts, servers)
        if targets is not None:
            targets = set(targets)
            by_host = {n: c for n, c in by_host.items() if n in targets}
        # Hosts where even every displaceable server gone leaves no room
        # are out; the rest are tried with 1, 2, ... moves.
        hopeful = {name: cands for name, cands in by_host.items()
                   if self._fits_without(hosts, name, cands, req)}
        base = {}  # host name -> fragmentation before any move
        for count in range(1, self.max_moves + 1):
            best = None
            for name in sorted(hopeful):
                cands = hopeful[name]
                for subset in itertools.combinations(cands, count):
                    plan = self._plan_subset(hosts, name, subset, req, base)
                    if plan is not None and (best is None or
                                             plan.cost() < best.cost()):
                        best = plan
            if best is not None:
                return best
        return None

    def drain(self, hosts, servers, name, targets=None):
        """Live-migrate every server off host ``name``: a ``Plan`` or None.

        ``targets`` (names) limits the destinations (e.g. hosts that stay
        powered on); any server that cannot move makes the answer None.
        """
        hosts = _by_name(hosts)
        if name not in hosts:
            raise exceptions.InvalidRequest('unknown host %r' % (name,))
        mine = [s for s in servers if s.host == name]
        if any(not s.movable or migration_request(s) is None for s in mine):
            return None
        allowed = set(hosts if targets is None else targets) - {name}
        host = hosts[name]
        # Biggest first: they are the hardest to place.
        mine.sort(key=lambda s: (-gpu_memory_mib(s, host), s.id))
        base = {name: self._frag(hosts[name])}
        for s in mine:
            host.free(s.placement)
        try:
            moves = self._destinations(hosts, mine, allowed,
                                       budget=[8 * len(mine) + 8])
            if moves is None:
                return None
            try:
                delta = self._delta(hosts, base, name,
                                    [m.destination for m in moves])
            finally:
                for m in moves:
                    hosts[m.destination.host].free(m.destination)
        finally:
            for s in reversed(mine):
                host.allocate(s.placement)
        moves = [m._replace(memory_mib=gpu_memory_mib(m.server, host))
                 for m in moves]
        return Plan(None, name, None, tuple(moves), delta)

    # -- internals --------------------------------------------------------

    def _frag(self, host):
        return fragmentation.host_fragmentation(host, self.demand)

    def _fit_now(self, hosts, req):
        best = None
        for name in sorted(hosts):
            ranked = self.engine.rank(hosts[name], req)
            if ranked and (best is None or ranked[0].cost < best.cost):
                best = ranked[0]
        if best is None:
            return None
        return Plan(req, best.placement.host, best.placement, (),
                    best.frag_delta * host_mod.MILLI)

    def _displaceable(self, hosts, servers):
        by_host = {}
        for s in servers:
            if s.host not in hosts:
                raise exceptions.InvalidRequest(
                    'server %s is on unknown host %r' % (s.id, s.host))
            if s.spot or (s.movable and migration_request(s) is not None):
                by_host.setdefault(s.host, []).append(s)
        for name, cands in by_host.items():
            host = hosts[name]
            cands.sort(key=lambda s: (-gpu_memory_mib(s, host), s.id))
            del cands[self.max_candidates:]
        return by_host

    def _fits_without(self, hosts, name, cands, req):
        host = hosts[name]
        for s in cands:
            host.free(s.placement)
        try:
            return bool(fragmentation.host_fits(host, req)
                        and self.engine.rank(host, req))
        finally:
            for s in reversed(cands):
                host.allocate(s.placement)

    def _plan_subset(self, hosts, name, subset, req, base):
        """Best plan freeing exactly ``subset`` on ``name``, or None."""
        host = hosts[name]
        if name not in base:
            base[name] = self._frag(host)
        for s in subset:
            host.free(s.placement)
        try:
            # host_fits is the cheap necessary test; rank the exact one.
            ranked = (fragmentation.host_fits(host, req)
                      and self.engine.rank(host, req))
            if not ranked:
                return None
            placement = ranked[0].placement
            best = None
            for actions in self._action_choices(subset):
                plan = self._try_actions(hosts, name, subset, actions,
                                         placement, req, base)
                if plan is not None and (best is None
                                         or plan.cost() < best.cost()):
                    best = plan
            return best
        finally:
            for s in reversed(subset):
                host.allocate(s.placement)

    @staticmethod
    def _action_choices(subset):
        options = []
        for s in subset:
            can_move = s.movable and migration_request(s) is not None
            opts = ([MIGRATE] if can_move else []) + ([EVICT] if s.spot
                                                      else [])
            options.append(opts)
        return itertools.product(*options)

    def _try_actions(self, hosts, name, subset, actions, placement, req,
                     base):
        """Subset freed on ``name``; find destinations, cost the plan."""
        host = hosts[name]
        movers = [s for s, a in zip(subset, actions) if a == MIGRATE]
        allowed = set(hosts) - {name}
        moves = self._destinations(hosts, movers, allowed,
                                   budget=[8 * len(movers) + 8])
        if moves is None:
            return None
        try:
            host.allocate(placement)
            try:
                delta = self._delta(hosts, base, name,
                                    [m.destination for m in moves])
            finally:
                host.free(placement)
        finally:
            for m in moves:
                hosts[m.destination.host].free(m.destination)
        evicted = [Move(EVICT, s, None, gpu_memory_mib(s, host))
                   for s, a in zip(subset, actions) if a == EVICT]
        moves = [m._replace(memory_mib=gpu_memory_mib(m.server, host))
                 for m in moves]
        return Plan(req, name, placement, tuple(moves + evicted), delta)

    def _delta(self, hosts, base, name, placed):
        """Fragmentation growth over ``name`` and the hosts of ``placed``.

        ``placed`` are the migrated servers' placements, applied now;
        ``base`` caches each host's fragmentation before any move (the
        caller put ``name``'s there before freeing it).
        """
        touched = {name} | {p.host for p in placed}
        for dest in touched - {name}:
            if dest not in base:
                mine = [p for p in placed if p.host == dest]
                for p in mine:
                    hosts[dest].free(p)
                try:
                    base[dest] = self._frag(hosts[dest])
                finally:
                    for p in mine:
                        hosts[dest].allocate(p)
        return sum(self._frag(hosts[h]) - base[h] for h in touched)

    def _destinations(self, hosts, movers, allowed, budget):
        """Destinations for every mover (applied on return), or None.

        Depth-first over each mover's best destinations (engine cost,
        lowest first), within ``budget`` trials. On success the movers
        are left allocated at their destinations; the caller frees them.
        """
        if not movers:
            return []
        server, rest = movers[0], movers[1:]
        mreq = migration_request(server)
        options = []
        for dest in sorted(allowed):
            dhost = hosts[dest]
            if (not fragmentation.host_fits(dhost, mreq)
                    or not self.compatible(server, dest)):
                continue
            ranked = self.engine.rank(dhost, mreq)
            if ranked:
                options.append((ranked[0].cost, dest, ranked[0].placement))
        options.sort(key=lambda o: (o[0], o[1]))
        for _cost, dest, placement in options[:self.max_destinations]:
            if budget[0] <= 0:
                return None
            budget[0] -= 1
            hosts[dest].allocate(placement)
            found = self._destinations(hosts, rest, allowed, budget)
            if found is not None:
                return [Move(MIGRATE, server, placement)] + found
            hosts[dest].free(placement)
        return None


def _by_name(hosts):
    if isinstance(hosts, dict):
        return hosts
    return {h.name: h for h in hosts}


def _gpus(placement):
    return ','.join(str(g) for g in placement.gpus) or '-'


def _devices(placement):
    slots = placement.slots
    if not slots:
        return 'no GPU'
    slot = slots[0]
    if slot.kind == host_mod.VGPU:
        what = 'vGPU %s' % slot.detail
    elif slot.kind == host_mod.MIG:
        what = ('vGPU %s' % slot.detail[2] if slot.detail[2]
                else 'MIG %s' % slot.detail[0])
    elif slot.kind == host_mod.SHARE:
        what = '%d milli GPU share' % slot.detail
    else:
        what = 'whole GPU'
    return '%s x%d' % (what, len(slots))


def _describe(req):
    if req.kind == host_mod.SHARE:
        return '%d milli GPU share' % req.milli
    what = req.profile or req.kind
    return '%dx %s' % (req.count, what)
