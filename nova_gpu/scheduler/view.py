"""The GPU view of one nova-scheduler service, and its one question.

A ``GpuView`` belongs to a scheduler service (``of_service``): each
``SchedulerManager`` has its own, fed by its own report listener, so two
schedulers in one process (or in two) each keep a full, independent view.
It puts three small parts together:

- ``hosts``: the compute hosts from the agents' reports, their provider
  UUIDs and the claims this scheduler counted (``scheduler.hosts``);
- ``demand``: the windowed demand the fragmentation measure uses
  (``scheduler.demand``);
- ``rankings``: memoised rankings of hosts' GPU sets (``scheduler.ranking``).

GpuFilter asks one question per host, ``decide``, and gets one
``HostDecision``, which it leaves on Nova's ``HostState`` for the weighers,
as Nova's own filters leave their per-host results there. A scheduling
request makes no network call: reports and provider UUIDs are learnt when
a report arrives. Where several candidates are equally good, the one put
first (the one Nova claims) is the request's own draw (``GpuView._draw``),
so that several schedulers, and concurrent requests, seldom claim the
same device.
"""

import contextlib
import random
import threading
import time
import weakref

from oslo_log import log as logging

from nova_gpu.core import engine as engine_mod
from nova_gpu.core import host as host_mod
from nova_gpu.scheduler import demand_window as demand_mod
from nova_gpu.scheduler import gpu_spec
from nova_gpu.scheduler import hosts as hosts_mod
from nova_gpu.scheduler import nic_pairs
from nova_gpu.scheduler import ranking as ranking_mod

LOG = logging.getLogger(__name__)

# Attribute of a SchedulerManager holding its GpuView.
_ATTR = '_nova_gpu_view'
_SERVICE_LOCK = threading.Lock()
# Seconds a one-device provider this scheduler put first among equally
# good ones counts as taken for the next requests' draws (``GpuView.
# _draw``): about the time from a decision to Nova's claim, after which
# Placement no longer offers a provider that was claimed.
PUT_FIRST_TTL = 2.0
# Providers remembered so at most; all are forgotten when there are more.
MAX_PUT_FIRST = 4096


class Request:
    """One instance's scheduling pass, as the filter sees it."""

    __slots__ = ('spec', 'spec_ref', 'instance_uuid', 'token', 'multi',
                 'rankings', 'classes', 'numa_settled')

    def __init__(self, spec_obj, spec, token):
        self.spec = spec
        self.spec_ref = weakref.ref(spec_obj)
        self.instance_uuid = getattr(spec_obj, 'instance_uuid', None)
        self.token = token
        # A multi-create: Nova claims candidate 0 of the chosen host for
        # each instance from one list of candidates (``HostDecision.claimed``).
        self.multi = _num_instances(spec_obj) > 1
        # Rankings found during this pass, by memo key: most hosts share
        # their state with others (``GpuView.ranking``).
        self.rankings = {}
        # The resource classes of a GPU allocation (``HostEntry.gpu_sets``).
        self.classes = hosts_mod.request_classes(spec.resource_class)
        # Set by the filter (``filters.numa_settled``): compute-node
        # updates older than this name the NUMA usage read with them.
        self.numa_settled = None


def _num_instances(spec_obj):
    """RequestSpec.num_instances, 1 when unset (an unset field of a Nova
    object raises on reading, not AttributeError).
    """
    is_set = getattr(spec_obj, 'obj_attr_is_set', None)
    if is_set is not None and not is_set('num_instances'):
        return 1
    num = getattr(spec_obj, 'num_instances', 1)
    return num if isinstance(num, int) else 1


class HostDecision:
    """What the view decided on one host for one request.

    ``why`` is None when the host passes, else the reason it does not;
    ``order`` the indices of the allocation candidates kept, best first
    (None: leave them as they are); ``ranked`` the GPU set candidate 0
    stands for (read by the weighers), or None.

    In a multi-create, ``claimed`` names the one-device providers
    (``HostEntry.claimed``) of candidate 0, which Nova claims if it picks
    this host, and ``full`` those the request's earlier instances filled
    on this host: Nova offers every instance the same candidates, and
    Placement refuses a claim on a full provider.
    """

    __slots__ = ('request', 'spec_ref', 'instance_uuid', 'num_instances',
                 'ranked', 'why', 'order', 'entry', 'claimed', 'full',
                 'numa')

    def __init__(self, request, num_instances, ranked=None, why=None,
                 order=None, entry=None, claimed=None, full=None):
        self.request = request
        self.spec_ref = request.spec_ref
        self.instance_uuid = request.instance_uuid
        self.num_instances = num_instances
        self.ranked = ranked
        self.why = why
        self.order = order
        self.entry = entry
        self.claimed = claimed
        self.full = full
        # (Nova's NUMATopology, its cell usage) the filter read (kept for
        # the next pass on the same HostState: ``filters._numa_usage``).
        self.numa = None


class GpuView:
    """Every host's GPUs as one scheduler service sees them.

    Thread-safe: nova-scheduler may run several requests at once, and the
    engine briefly mutates a host while it scores a choice.
    """

    def __init__(self, catalog=None, resolver=None, clock=time.monotonic,
                 engine_weights=None, draw=random.random):
        self.catalog = catalog or gpu_spec.default_catalog()
        self.clock = clock
        # A random number in [0, 1) per decision among equally good
        # candidates (``core.engine.tie_break``): per request, host and
        # scheduler service, not one order that every scheduler shares.
        self.draw = draw
        # One-device provider UUID -> until when a request of this
        # scheduler that may still be claiming put it first (``_draw``).
        self._put_first = {}
        self._lock = threading.RLock()
        self.hosts = hosts_mod.Hosts(self.catalog, resolver, clock,
                                     self._lock)
        self._entries = self.hosts.by_name
        self.demand = demand_mod.DemandWindow(self.catalog, clock,
                                              engine_weights)
        self.rankings = ranking_mod.Rankings()

    # -- hosts ----------------------------------------------------------------

    @property
    def resolver(self):
        return self.hosts.resolver

    @resolver.setter
    def resolver(self, resolver):
        self.hosts.resolver = resolver

    def ingest(self, report):
        """See ``hosts.Hosts.ingest``."""
        return self.hosts.ingest(report)

    def get(self, nodename):
        return self.hosts.get(nodename)

    def remove(self, nodename):
        self.hosts.remove(nodename)

    def __len__(self):
        return len(self.hosts)

    def set_provider_uuids(self, nodename, uuids_by_name):
        """Record provider UUIDs learnt elsewhere (tests, tools)."""
        self.hosts.set_provider_uuids(nodename, uuids_by_name)

    def claim(self, entry, placement):
        """Count ``placement`` on ``entry`` until its next report."""
        self.hosts.claim(entry, placement)

    # -- demand ---------------------------------------------------------------

    def note_request(self, spec):
        """Count a request into the demand the fragmentation measure uses."""
        with self._lock:
            self.demand.note(spec)
            publication = self.demand.due_publication()
        if publication is not None:
            # Outside the lock: a send may wait on the broker, other
            # scheduling threads must not.
            publication()

    @property
    def demand_version(self):
        return self.demand.version

    # -- the one question -----------------------------------------------------

    def request(self, spec_obj, spec):
        """Per-pass state shared by every host of one filter run."""
        return Request(spec_obj, spec, self.rankings.name(spec.key))

    def decide(self, request, nodename, num_instances, cells=None,
               candidates=None, previous=None):
        """The HostDecision on host ``nodename`` for ``request``.

        ``cells`` is the NUMA cell usage from Nova's HostState (``((id,
        cpu_milli, cpu_used, memory_mib, memory_used), ...)``, for NUMA
        affinity), ``candidates`` its allocation candidates, ``previous``
        the HostDecision left on it by the last pass: when that pass was the
        previous instance of the same multi-create and Nova claimed on
        this host since (its ``num_instances`` grew), the claim is counted
        first, and candidates using a provider it filled are dropped.
        """
        spec = request.spec
        if spec.problem:
            return HostDecision(request, num_instances, why=spec.problem)
        entry = self._entries.get(nodename)
        if entry is None:
            return HostDecision(request, num_instances, why=(
                'no GPU report from this host yet' if spec.explicit
                else None))  # stock vGPU flavor on an unknown host: as Nova
        if not entry.matched:
            # Nova asks about this host: it is a compute node, held.
            self.hosts.match(entry)
        full = None
        if (previous is not None and previous.spec_ref is request.spec_ref
                and previous.instance_uuid != request.instance_uuid):
            full = previous.full
            if (previous.ranked is not None
                    and num_instances > previous.num_instances):
                # Nova claimed candidate 0 of this host for the previous
                # instance, which is the set the view put first.
                self.hosts.claim(entry, previous.ranked.choice.placement)
                if previous.claimed:
                    full = (full or frozenset()) | previous.claimed
        if entry.pending:
            self.hosts.expire(entry)
        key = (entry.state_key or entry.key(self.rankings.name),
               request.token, self.demand.version, cells)
        last = entry.last_ranking
        if last is not None and last[0] == key:
            ranking = last[1]
        else:
            # Hosts in the same state as one seen earlier in this pass.
            ranking = request.rankings.get(key)
            if ranking is None:
                ranking = self.ranking(entry, spec, cells, request.token,
                                       request.rankings, key)
            entry.last_ranking = (key, ranking)
        if not ranking.items:
            return HostDecision(request, num_instances,
                                why=_with_left_out(entry, ranking.why),
                                entry=entry, full=full)
        if not candidates:
            return HostDecision(request, num_instances, ranking.items[0],
                                entry=entry, full=full)
        return self._ordered(request, num_instances, entry, ranking,
                             candidates, full)

    def cut(self, request, nodename, cells, candidates, keep):
        """The indices, in Placement's order, of the candidates of host
        ``nodename`` that ``decide`` could put first: its best ``keep`` in
        its order; where more than ``keep`` are as good as the best (a
        request draws among those), ``keep`` of them from where this
        request's draw falls. None to keep them all
        (``GpuCandidateCutFilter``).

        Asks nothing ``decide`` does not, changes nothing: no claim is
        counted, no draw made, no host matched. None where ``decide`` would
        refuse the host (its reason is GpuFilter's to give) or where fewer
        would be kept than offered anyway.
        """
        spec = request.spec
        if spec.problem or len(candidates) <= keep:
            return None
        entry = self._entries.get(nodename)
        if entry is None or not entry.matched or entry.pending:
            # Not known yet, or claims of this scheduler to count first:
            # decide's to handle.
            return None
        ranking = self.ranking(entry, spec, cells, request.token,
                               request.rankings)
        if not ranking.items:
            return None
        offered = hosts_mod.candidates_key(candidates)
        gpu_sets = nic_pairs.paired(entry, spec, candidates, entry.gpu_sets(
            candidates, request.classes, offered))
        order, _best, ties = ranking_mod.order(
            ranking, gpu_sets,
            lambda gpus: self.evaluate(entry, spec, ranking, gpus))
        if len(ties) > keep:
            # Equally good ones, more than kept: ``keep`` of them in a row
            # from where this request's draw falls (``core.engine.
            # tie_break``, the rule decide's draw follows), so that
            # GpuFilter's draw among those is as uniform over all of them
            # as it was, and concurrent requests still spread.
            start = engine_mod.tie_break(len(ties), self.draw())
            kept = [order[(start + k) % len(ties)] for k in range(keep)]
        else:
            kept = order[:keep]
        if not kept or len(kept) == len(candidates):
            return None
        return sorted(kept)

    def _ordered(self, request, num_instances, entry, ranking, candidates,
                 full):
        """The HostDecision on ``entry`` given its ``ranking`` and Placement's
        ``candidates``: those that can serve, best first, and first among
        the equally good ones the one this request draws
        (``core.engine.tie_break``).
        """
        spec = request.spec
        offered = hosts_mod.candidates_key(candidates)
        last = entry.last_order
        if last is not None and last[0] is ranking and last[1] == offered:
            # The candidates this host had last time, on the same ranking.
            order, best, ties = known = last[2]
            gpu_sets = None
        else:
            # In GPU indices, so that hosts in the same state share the
            # memo.
            gpu_sets = nic_pairs.paired(entry, spec, candidates,
                                        entry.gpu_sets(candidates,
                                                       request.classes,
                                                       offered))
            known = ranking.orders.get(gpu_sets)
            if known is None:
                known = ranking_mod.order(
                    ranking, gpu_sets,
                    lambda gpus: self.evaluate(entry, spec, ranking, gpus))
            order, best, ties = known
            entry.last_order = (ranking, offered, known)
        if not order:
            return HostDecision(
                request, num_instances, order=order, entry=entry, full=full,
                why=self._none_serves(entry, ranking, candidates, request,
                                      offered, gpu_sets))
        if full:
            if gpu_sets is None:
                gpu_sets = nic_pairs.paired(
                    entry, spec, candidates, entry.gpu_sets(
                        candidates, request.classes, offered))
            order, best, ties = self._without_full(
                entry, spec, ranking, candidates, gpu_sets, order, best,
                ties, full)
            if not order:
                return HostDecision(
                    request, num_instances, order=order, entry=entry,
                    full=full, why='every GPU provider Placement offered '
                    'is full with the earlier instances of this request')
        if len(ties) > 1:
            # Equally good candidates: this request's own pick among
            # them, so that concurrent schedulers (and requests) seldom
            # claim the same device. Nova claims candidate 0 only.
            pick = self._draw(entry, candidates, order, len(ties))
            if pick:
                order = ((order[pick],) + order[:pick]
                         + order[pick + 1:])
                best = ties[pick]
        claimed = (entry.claimed(candidates[order[0]]) if request.multi
                   else None)
        return HostDecision(request, num_instances, best, order=order,
                            entry=entry, claimed=claimed, full=full)

    def _draw(self, entry, candidates, order, count):
        """Which of the ``count`` equally good candidates first in
        ``order`` this request takes (an index into ``order``).

        Drawn (``core.engine.tie_break``) among those that no other
        request of this scheduler put first in the last
        ``PUT_FIRST_TTL`` seconds, when some are left: concurrent requests
        of one scheduler then take distinct devices, as long as there are
        enough. Only one-device providers (a VF, a whole GPU) are
        remembered: two claims on one of them cannot both hold. Other
        schedulers' requests are spread by their own draws.
        """
        draw = self.draw()
        pick = engine_mod.tie_break(count, draw)
        units = entry.unit_uuids
        if not units:
            return pick
        put_first = self._put_first
        now = self.clock()
        if put_first and self._taken(units, candidates[order[pick]], now):
            # Rare (concurrent requests on this host): the ones not taken.
            free = [k for k in range(count) if not self._taken(
                units, candidates[order[k]], now)]
            if free:
                # The same draw, among those: as uniform.
                pick = free[engine_mod.tie_break(len(free), draw)]
        if len(put_first) >= MAX_PUT_FIRST:
            # A soft preference: forgotten at once rather than pruned one
            # by one on every request's hosts.
            put_first.clear()
        until = now + PUT_FIRST_TTL
        for uuid in units.intersection(
                candidates[order[pick]]['allocations']):
            put_first[uuid] = until
        return pick

    def _taken(self, units, candidate, now):
        """Whether a request of this scheduler put one of ``candidate``'s
        one-device providers first lately.
        """
        get = self._put_first.get
        return any(get(uuid, 0) > now
                   for uuid in units.intersection(candidate['allocations']))

    @staticmethod
    def _none_serves(entry, ranking, candidates, request, offered,
                     gpu_sets):
        """Why none of the candidates Placement offered can serve."""
        if nic_pairs.scope_of(request.spec) is not None:
            # gpu:rdma: the reported state pairs some GPU set (a ranking),
            # Placement's candidates none.
            return nic_pairs.why_none(entry, request.spec)
        if entry.lost_uuids:
            if gpu_sets is None:
                gpu_sets = entry.gpu_sets(candidates, request.classes,
                                          offered)
            if all(gpus == hosts_mod.LOST for gpus in gpu_sets):
                return ('Placement offered only providers of GPUs this '
                        'host\'s agent cannot read (%s)' % '; '.join(
                            '%s: %s' % (g.address, g.reason)
                            for g in entry.left_out))
        return ('Placement offered GPU providers that cannot serve the '
                'request: %s' % (ranking.why or 'profile, model or topology'))

    def _without_full(self, entry, spec, ranking, candidates, gpu_sets,
                      order, best, ties, full):
        """``(order, best, ties)`` less the candidates that allocate on a
        provider in ``full``: Placement would refuse their claim.
        """
        kept = tuple(i for i in order
                     if full.isdisjoint(candidates[i]['allocations']))
        if kept == order:
            return order, best, ties
        ties = ranking_mod.leading_ties(
            None if gpu_sets[i] is None
            else self.evaluate(entry, spec, ranking, gpu_sets[i])
            for i in kept)
        return kept, (ties[0] if ties else None), ties

    # -- rankings -------------------------------------------------------------

    def ranking(self, entry, spec, cells=None, token=None, memo=None,
                key=None):
        """Feasible GPU sets on ``entry`` for ``spec``, best first.

        ``memo``: a dict for one filter pass (``Request.rankings``), in
        front of the shared cache: hosts in the same state find their
        ranking there with one C-level lookup. ``key``: the memo key, when
        the caller (``decide``) built it already.
        """
        rankings = self.rankings
        if key is None:
            if entry.pending:
                self.hosts.expire(entry)
            key = (entry.state_key or entry.key(rankings.name),
                   rankings.name(spec.key) if token is None else token,
                   self.demand.version, cells)
            last = entry.last_ranking
            if last is not None and last[0] == key:
                return last[1]
        found = None if memo is None else memo.get(key)
        if found is None:
            found = rankings.get(key)
            if found is None:
                with self._lock, _numa(entry, cells):
                    found = ranking_mod.rank(self.demand.engine, entry,
                                             spec)
                    found.cells = cells
                    rankings.put(key, found)
            if memo is not None:
                memo[key] = found
        entry.last_ranking = (key, found)
        return found

    def evaluate(self, entry, spec, ranking, gpus):
        """Ranked for GPU set ``gpus`` (sorted indices), None if it cannot
        serve ``spec``; memoised in ``ranking``.
        """
        try:
            return ranking.by_gpus[gpus]
        except KeyError:
            pass
        with self._lock, _numa(entry, ranking.cells):
            found = ranking_mod.evaluate(self.demand.engine, entry, spec,
                                         gpus, ranking)
            ranking.by_gpus[gpus] = found
        return found


@contextlib.contextmanager
def _numa(entry, cells):
    """Score ``entry`` with the NUMA cell usage Nova's HostState has.

    A host that shares its reported state with others gets it back as it
    was; a host with its own state (claims) keeps Nova's usage, which its
    claims are then checked against. The caller holds the view's lock.
    """
    host = entry.host
    saved = host.cells
    if cells:
        host.cells = {cid: host_mod.NumaCell(cid, cpu, mem, cpu_used,
                                             mem_used)
                      for cid, cpu, cpu_used, mem, mem_used in cells}
    try:
        yield host
    finally:
        if not entry.own_host:
            host.cells = saved


# -- ownership: one view per scheduler service ------------------------------

def of_service(manager, filters=()):
    """The GpuView of a SchedulerManager, created on first use.

    ``filters`` (the service's GpuFilter objects) are given that view; a
    filter that already made one of its own (used before the service
    started) hands it over, so that nothing it learnt is lost.
    """
    with _SERVICE_LOCK:
        view = getattr(manager, _ATTR, None)
        if view is None:
            view = next((f._view for f in filters if f._view is not None),
                        None)
            if view is None:
                view = GpuView(resolver=hosts_mod.PlacementResolver())
            setattr(manager, _ATTR, view)
    for gpu_filter in filters:
        gpu_filter._view = view
    return view


def _with_left_out(entry, why):
    """``why`` plus the GPUs the host's agent left out of its report (NVML
    cannot read them), which the host's GPU count does not show. Added
    here, per host: hosts in the same state share their rankings.
    """
    if not entry.left_out:
        return why
    return '%s; left out, its agent cannot read them: %s' % (
        why, '; '.join('%s (%s)' % (g.address, g.reason)
                       for g in entry.left_out))
