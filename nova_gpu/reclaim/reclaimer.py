"""What the reclaimer does when on-demand GPU capacity runs short.

Two triggers, as in the design (``doc/source/economics.rst``):

* an on-demand request was refused for capacity (Nova's versioned
  ``compute_task.build_instances.error`` notification with NoValidHost):
  ``Reclaimer.for_request`` plans the moves that make it fit;
* free capacity fell below the operator's floor (``floor`` requests of
  the ``reference`` shape must fit): ``Reclaimer.for_headroom`` plans
  moves until they do.

Plans come from the one move planner (``core.moves``). Only servers of
preemptible flavors (``Server.spot``) are ever evicted; a spot server
that can live-migrate is moved rather than evicted, and on-demand
servers are only ever live-migrated, never stopped. ``steps`` turns a
plan into the actions to carry out: live migrations first, then a
notification to each evicted server's owner, then, after the grace
period, the eviction (shelve-offload, which frees the GPU and keeps the
server, or delete, per ``action``).
"""

import dataclasses
import typing

from nova_gpu.core import exceptions
from nova_gpu.core import moves

SHELVE_OFFLOAD = 'shelve_offload'
DELETE = 'delete'
ACTIONS = (SHELVE_OFFLOAD, DELETE)
NOTIFY = 'notify'
LIVE_MIGRATE = 'live_migrate'


class Step(typing.NamedTuple):
    at_s: float  # seconds after the decision
    action: str  # LIVE_MIGRATE, NOTIFY, SHELVE_OFFLOAD or DELETE
    server: str
    destination: str = None  # LIVE_MIGRATE: the host
    why: str = ''  # the plan's line for this move


@dataclasses.dataclass(frozen=True)
class ReclaimDecision:
    trigger: str  # 'request' or 'headroom'
    plans: tuple  # moves.Plan, in the order they were made
    steps: tuple  # Step, in the order to carry them out

    @property
    def evictions(self):
        return sum(p.evictions for p in self.plans)

    def explain(self):
        return [line for p in self.plans for line in p.explain()]


class Reclaimer:
    """Plans reclaims; see the module docstring."""

    def __init__(self, planner=None, action=SHELVE_OFFLOAD, grace_s=300.0,
                 floor=0, reference=None, max_plans=16):
        if action not in ACTIONS:
            raise exceptions.InvalidRequest(
                'eviction action must be one of %s, got %r'
                % (', '.join(ACTIONS), action))
        if grace_s < 0 or floor < 0 or max_plans < 1:
            raise exceptions.InvalidRequest(
                'grace_s and floor must be >= 0 and max_plans >= 1')
        if floor and reference is None:
            raise exceptions.InvalidRequest(
                'a headroom floor needs the reference request it counts')
        self.planner = planner or moves.MovePlanner()
        self.action = action
        self.grace_s = grace_s
        self.floor = floor
        self.reference = reference
        self.max_plans = max_plans

    def for_request(self, hosts, servers, req):
        """The decision that gets refused ``req`` served, or None."""
        plan = self.planner.plan(hosts, _candidates(servers), req)
        if plan is None:
            return None
        return ReclaimDecision('request', (plan,), tuple(self.steps(plan)))

    def headroom(self, hosts):
        """How many ``reference`` requests fit now (up to ``floor``)."""
        return _count_fits(self.planner.engine, _by_name(hosts),
                           self.reference, self.floor)

    def for_headroom(self, hosts, servers):
        """Plans until ``floor`` reference requests fit, or None.

        Each plan is applied to ``hosts`` while the next one is made (its
        request placement holds the room made), then all are undone: the
        hosts are left as they were. None when nothing is needed or the
        floor cannot be reached by moving spot and movable servers.
        """
        if not self.floor:
            return None
        hosts = _by_name(hosts)
        pool = _candidates(servers)
        plans = []
        try:
            while len(plans) < self.max_plans:
                # The room each plan made is held by its placement.
                need = self.floor - len(plans)
                if _count_fits(self.planner.engine, hosts, self.reference,
                               need) >= need:
                    break
                plan = self.planner.plan(hosts, pool, self.reference)
                if plan is None or not plan.moves:
                    return None
                plan.apply(hosts)
                plans.append(plan)
                moved = {m.server.id: m for m in plan.moves}
                pool = [_moved(s, moved[s.id]) if s.id in moved else s
                        for s in pool
                        if s.id not in moved
                        or moved[s.id].action == moves.MIGRATE]
            else:
                return None
        finally:
            for plan in reversed(plans):
                _undo(plan, hosts)
        if not plans:
            return None
        steps = [s for p in plans for s in self.steps(p)]
        return ReclaimDecision('headroom', tuple(plans), tuple(steps))

    def steps(self, plan):
        """Migrations now, owners told now, evictions after the grace."""
        out = [Step(0.0, LIVE_MIGRATE, m.server.id, m.destination.host,
                    m.explain())
               for m in plan.moves if m.action == moves.MIGRATE]
        evicted = [m for m in plan.moves if m.action == moves.EVICT]
        out += [Step(0.0, NOTIFY, m.server.id, None, m.explain())
                for m in evicted]
        out += [Step(float(self.grace_s), self.action, m.server.id, None,
                     m.explain()) for m in evicted]
        return out


def _candidates(servers):
    """Spot servers may be evicted or moved, others only moved: the
    planner's own rule (``moves.Server``). Listed for clarity: nothing
    else is ever offered to it.
    """
    return [s for s in servers if s.spot or s.movable]


def _moved(server, move):
    return dataclasses.replace(server, placement=move.destination)


def _undo(plan, hosts):
    if plan.placement is not None:
        hosts[plan.host].free(plan.placement)
    for move in reversed(plan.moves):
        if move.action == moves.MIGRATE:
            hosts[move.destination.host].free(move.destination)
        hosts[move.server.host].allocate(move.server.placement)


def _count_fits(engine, hosts, req, limit):
    """How many copies of ``req`` fit at once (greedy), up to ``limit``."""
    taken = []
    try:
        while len(taken) < limit:
            best = None
            for name in sorted(hosts):
                ranked = engine.rank(hosts[name], req)
                if ranked and (best is None or ranked[0].cost < best.cost):
                    best = ranked[0]
            if best is None:
                break
            hosts[best.placement.host].allocate(best.placement)
            taken.append(best.placement)
        return len(taken)
    finally:
        for placement in reversed(taken):
            hosts[placement.host].free(placement)


def _by_name(hosts):
    return hosts if isinstance(hosts, dict) else {h.name: h for h in hosts}
