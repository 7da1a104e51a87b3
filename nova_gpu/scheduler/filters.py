"""GpuFilter: drops hosts and allocation candidates that cannot serve the
GPU request, and orders the rest so that candidate 0, the one Nova claims,
is the best physical GPU set.

Enable it as an operator would, in nova.conf::

    [filter_scheduler]
    available_filters = nova.scheduler.filters.all_filters
    available_filters = nova_gpu.scheduler.filters.GpuFilter
    enabled_filters = ...,PciPassthroughFilter,GpuFilter

Put it after every other filter that prunes allocation candidates, so that
the order it leaves is the order Nova claims in.
"""

import collections
import datetime
import logging
import operator
import weakref

from nova.scheduler import filters
from nova.scheduler import utils as scheduler_utils
from oslo_config import cfg
from oslo_log import log as oslo_logging

from nova_gpu.scheduler import gpu_spec
from nova_gpu.scheduler import hosts as hosts_mod
from nova_gpu.scheduler import notifier as notifications
from nova_gpu.scheduler import view as view_mod

CONF = cfg.CONF
LOG = oslo_logging.getLogger(__name__)

# At most this many per-host reasons go into the NoValidHost log line.
MAX_REASONS = 20
# HostState attribute this plugin sets: its decision (read by the
# weighers; it also keeps the NUMA cell usage read from the HostState).
DECISION = 'nova_gpu_decision'
# The decisions of each request's current pass, by RequestSpec (a
# ``_Pass``): read by GpuWeigher (``decisions_of``) and when Nova answers
# NoValidHost (``claims_lost``). Per request, not on the HostState:
# another request may filter the same HostState while Nova weighs or
# claims for this one.
_PASSES = weakref.WeakKeyDictionary()
# The decisions that chose GPU sets, by RequestSpec, then instance UUID,
# then nodename: every pass of a request (one per instance of a
# multi-create), read when Nova has placed them (``notify_placements``).
_CHOICES = weakref.WeakKeyDictionary()
# Whether this process warned that GpuFilter runs without nova-gpu's
# scheduler service (no GPU reports).
_WARNED_UNBOUND = []


class GpuFilter(filters.CandidateFilterMixin, filters.BaseHostFilter):
    """Keep hosts (and candidates) whose GPUs can serve the flavor."""

    RUN_ON_REBUILD = False
    run_filter_once_per_request = False

    def __init__(self, view=None):
        # Nova builds filters inside SchedulerManager.__init__; when
        # nova-gpu-scheduler's service starts (``manager``), it gives this
        # filter the service's view (``view.of_service``) and starts the
        # report listener feeding it.
        self._view = view
        self._last_request = None

    @property
    def view(self):
        if self._view is None:
            # Not (yet) in a started nova-gpu-scheduler service (tools,
            # or Nova's own nova-scheduler): a view of its own, which the
            # service adopts if it starts later.
            if not _WARNED_UNBOUND:
                _WARNED_UNBOUND.append(True)
                LOG.warning(
                    'GpuFilter runs outside a started nova-gpu-scheduler '
                    'service: it receives no GPU reports, so GPU flavors '
                    'find no host and stock vGPU flavors are scheduled as '
                    'Nova does. Run nova-gpu-scheduler in place of '
                    'nova-scheduler (same arguments and configuration).')
            self._view = view_mod.GpuView(
                resolver=hosts_mod.PlacementResolver())
        return self._view

    def filter_all(self, filter_obj_list, spec_obj):
        if scheduler_utils.request_is_rebuild(spec_obj):
            # The instance keeps the GPUs it has.
            yield from filter_obj_list
            return
        spec = gpu_spec.from_request_spec(spec_obj)
        if spec is None:
            yield from filter_obj_list
            return
        self.view.note_request(spec)
        request = self._request(spec_obj, spec)
        debug = LOG.isEnabledFor(logging.DEBUG)
        reasons, passed = [], 0
        refusals = collections.Counter()
        chosen = {}
        record = _Pass(request.instance_uuid, chosen)
        _PASSES[spec_obj] = record
        _CHOICES.setdefault(spec_obj, {})[request.instance_uuid] = chosen
        hosts, decisions = record.hosts, record.decisions
        check = self._check
        view = self.view
        for host_state in filter_obj_list:
            why = check(host_state, request, debug, chosen, view, decisions)
            if why is None:
                passed += 1
                hosts.append(host_state)
                yield host_state
            else:
                LOG.debug('GpuFilter: %s refused: %s', host_state.nodename,
                          why)
                reasons.append('%s: %s' % (host_state.nodename, why))
                refusals[notifications.reason_of(why)] += 1
        if refusals:
            # Nova exhausts this generator, so this runs once per pass:
            # refusals by reason for nova-gpu-exporter (never raises).
            notifications.refused(
                getattr(spec_obj, 'instance_uuid', None), refusals, passed,
                request=spec_obj.flavor.name)
        if reasons and not passed:
            LOG.info('GpuFilter: no host can serve the GPU request of '
                     'instance %s (flavor %s): %s%s',
                     getattr(spec_obj, 'instance_uuid', None),
                     spec_obj.flavor.name, '; '.join(reasons[:MAX_REASONS]),
                     '; ...' if len(reasons) > MAX_REASONS else '')

    def host_passes(self, host_state, spec_obj):
        spec = gpu_spec.from_request_spec(spec_obj)
        return spec is None or self._check(
            host_state, self._request(spec_obj, spec),
            LOG.isEnabledFor(logging.DEBUG)) is None

    def _request(self, spec_obj, spec):
        # One weak reference per pass: every host's decision shares it, so
        # the weighers and the next pass of a multi-create can tell it.
        last = self._last_request
        if (last is not None and last.spec_ref() is spec_obj
                and last.spec is spec and last.instance_uuid
                == getattr(spec_obj, 'instance_uuid', None)):
            return last
        request = self.view.request(spec_obj, spec)
        request.numa_settled = numa_settled()
        self._last_request = request
        return request

    def _check(self, host_state, request, debug=False, chosen=None,
               view=None, decisions=None):
        """None if ``host_state`` passes, else the reason it does not.

        One question to the view, one Decision back, left on the
        HostState for the weighers (and in ``chosen``, by nodename, when
        it stands for a GPU set among Placement's candidates: see
        ``_PASSES``). ``decisions``: a list
        the Decision is appended to when the host passes. Whatever goes
        wrong with one host (a report the parser let through that the
        engine still cannot rank, a bug) refuses that host with the reason
        and leaves every other host, and every other request, as they
        were.
        """
        # Consumed: a pass that fails below must not count its claim
        # twice.
        previous = getattr(host_state, DECISION, None)
        if previous is not None:
            setattr(host_state, DECISION, None)
        if view is None:
            view = self.view
        try:
            candidates = host_state.allocation_candidates
            if type(candidates) is not list:
                # Not the list Nova sets: a plain list, made here where an
                # error refuses this host only.
                candidates = list(candidates or ())
            numa = _numa_usage(host_state, request.spec, previous,
                               request.numa_settled)
            decision = view.decide(
                request, host_state.nodename, host_state.num_instances,
                numa[1], candidates, previous)
        except Exception as e:
            why = 'GPU view of this host is unusable: %s: %s' % (
                type(e).__name__, e)
            contained(view.get(host_state.nodename),
                      host_state.nodename, 'GpuFilter', why)
            return why
        decision.numa = numa
        setattr(host_state, DECISION, decision)
        order = decision.order
        if order is not None:
            if debug:
                # Nova's mixin logs each candidate's fate at DEBUG.
                keep = {id(candidates[i]) for i in order}
                self.filter_candidates(host_state, lambda c: id(c) in keep)
            host_state.allocation_candidates = list(
                map(candidates.__getitem__, order))
            if chosen is not None and decision.ranked is not None \
                    and decision.why is None:
                chosen[host_state.nodename] = decision
        if decisions is not None and decision.why is None:
            decisions.append(decision)
        return decision.why


class _Pass:
    """One pass of GpuFilter for one instance (``_PASSES``): the hosts
    that passed and their decisions, in the order Nova got them, and the
    decisions that chose a GPU set among Placement's candidates, by
    nodename.
    """

    __slots__ = ('instance_uuid', 'chosen', 'hosts', 'decisions')

    def __init__(self, instance_uuid, chosen):
        self.instance_uuid = instance_uuid
        self.chosen = chosen
        self.hosts = []
        self.decisions = []


def decisions_of(host_states, spec_obj):
    """The Decisions of ``spec_obj``'s current pass for ``host_states``,
    in their order, when they are the hosts that pass let through, in the
    order it did (Nova weighs the filtered hosts in the order the filters
    left them); else None (``decision_of`` host by host).

    Taken from the pass, not from each HostState: nothing is read from
    the hosts but their identity, and a concurrent request filtering the
    same HostStates meanwhile does not hide this request's decisions.
    """
    found = _PASSES.get(spec_obj)
    if found is None:
        return None
    hosts = found.hosts
    if len(hosts) != len(host_states) or not all(
            map(operator.is_, hosts, host_states)):
        return None
    return found.decisions


def claims_lost(spec_obj):
    """Whether Nova's last pass for ``spec_obj`` had a host it could claim
    on: one this filter let through whose allocation candidates Nova read
    and found usable (or a host the filter left to Nova).

    Asked when Nova answered NoValidHost (``listener``): Nova tries
    candidate 0 of every host the filters passed, in weighed order, until
    a claim holds, so such a host means every claim it tried failed.
    Placement refuses a claim when another scheduler took the device
    since it offered it (a conflict), not because no host can serve. A
    pass that let no host through, or one whose hosts Placement offered
    nothing usable, was a refusal. Never raises.
    """
    try:
        found = _PASSES.get(spec_obj)
        if found is None:
            return False
        for decision in found.decisions:
            if decision.why is None and (decision.order is None
                                         or len(decision.order)):
                return True
        return False
    except Exception as e:
        LOG.warning('GpuFilter could not tell whether the claims of %s '
                    'were lost: %s', getattr(spec_obj, 'instance_uuid',
                                             None), e)
        return False


def forget_pass(spec_obj):
    """Drop what this filter kept of ``spec_obj``'s last pass (a new
    attempt to schedule it starts).
    """
    _PASSES.pop(spec_obj, None)


def decision_of(host_state, spec_obj):
    """The Ranked GpuFilter chose on ``host_state`` for ``spec_obj``, or
    None (another request's decision, or none).
    """
    decision = getattr(host_state, DECISION, None)
    if decision is None or decision.spec_ref() is not spec_obj:
        return None
    return decision.ranked


def notify_placements(spec_obj, instance_uuids, selections):
    """Send ``gpu.placement.decided`` for each instance Nova placed:
    ``selections`` is what ``SchedulerManager.select_destinations``
    returned for ``spec_obj`` (per instance, in ``instance_uuids`` order,
    a list of Selection objects, the chosen host first, or a dict with
    ``host`` and ``nodename`` for an old conductor). Nova claimed there
    the host's candidate 0, the candidate this filter put first. Never
    raises; returns how many were sent.
    """
    try:
        choices = _CHOICES.pop(spec_obj, None)
        if not choices or not selections:
            return 0
        uuids = list(instance_uuids or ()) or [
            getattr(spec_obj, 'instance_uuid', None)]
        sent = 0
        for uuid, selected in zip(uuids, selections):
            if isinstance(selected, list):
                selected = selected[0] if selected else None
            if selected is None:
                continue
            if isinstance(selected, dict):
                host, node = selected.get('host'), selected.get('nodename')
            else:
                host, node = selected.service_host, selected.nodename
            sent += notify_placed(choices, uuid, host, node,
                                  getattr(spec_obj, 'flavor', None))
        return sent
    except Exception as e:  # a notification never breaks scheduling
        LOG.warning('GPU placement notifications of instances %s not '
                    'sent: %s', instance_uuids, e)
        return 0


def notify_placed(choices, instance_uuid, host, nodename, flavor_obj=None):
    """Send ``gpu.placement.decided`` for ``instance_uuid``, which Nova
    placed on ``host`` (node ``nodename``), with the GPU set the filter
    chose there for it (``choices``: by instance UUID, then nodename).

    Nothing is sent when this filter made no choice there (not a GPU
    request, no candidates from Placement, a rebuild). True if sent.
    """
    decision = (choices.get(instance_uuid) or {}).get(nodename)
    if decision is None:
        return False
    if decision.why is not None:
        return False
    ranked = decision.ranked
    # The host Nova chose (the compute service host the agent reports
    # as), not ranked.choice.placement.host: hosts in the same state
    # share one ranking, which names one of them.
    return notifications.placed(
        host, ranked.gpus, instance_uuid=instance_uuid,
        slots=ranked.choice.placement.slots,
        request=getattr(flavor_obj, 'name', None),
        fragmentation_delta=ranked.choice.frag_delta)


def contained(entry, nodename, who, why):
    """Log a contained per-host error at WARNING, once per report."""
    if not hosts_mod.first_failure(entry, nodename, who, why):
        return
    LOG.warning('%s contained an error on host %s (GPU report generation '
                '%s), the host is refused or weighed neutral: %s', who,
                nodename, entry.generation if entry is not None else '-',
                why)


_NO_NUMA = (None, None, None)
# How old a compute node's last update must be before the cell usage read
# with it stands for every later copy of the same update. The database
# keeps ``updated_at`` to the second (MySQL's DATETIME), so two updates in
# one second can carry the same stamp; an update older than this, by the
# scheduler's clock, cannot be followed by another with its stamp, as long
# as the clocks of the scheduler and conductor hosts agree to within it.
NUMA_SETTLE = datetime.timedelta(seconds=5)


def numa_settled(now=None):
    """The newest compute-node update whose stamp names its content (see
    ``NUMA_SETTLE``), by the scheduler's clock ``now`` (UTC).
    """
    return (now or datetime.datetime.now(datetime.timezone.utc)) - NUMA_SETTLE


def _numa_usage(host_state, spec, previous=None, settled=None):
    """``(numa_topology, cells, stamp)``: Nova's NUMA topology object of
    the host (None when ``stamp`` names it), its cell usage (``_cells``)
    and the update it was read from, or ``(None, None, None)`` when
    affinity does not matter.

    The usage ``previous`` (the Decision of the last pass on this
    HostState) holds is still true when the HostState has the same
    object, or a new one of the same compute-node update. Nova gives a
    HostState a new object whenever the scheduler consumes from it, and
    also before every request, deserialised again from the compute node's
    JSON (``HostState._update_from_compute_node`` skips only a HostState
    newer than the compute node): the same usage, a new object, the same
    ``HostState.updated``. That stamp names the content only once it is
    older than ``settled`` (``numa_settled``; None: never), so only then
    is it kept (``stamp``). Kept on the Decision, not on the HostState,
    so that a pass touches the HostState as little as it can; and passed
    on as it is, so that a request on unchanged hosts allocates nothing
    here (what a pass allocates per host, Python's garbage collector
    pays for again at 10,000 hosts).
    """
    if spec.alternatives[0].numa_affinity == 'none':
        return _NO_NUMA
    topo = host_state.numa_topology
    if topo is None:
        return _NO_NUMA
    if previous is not None:
        known = previous.numa
        if known is not None:
            stamp = known[2]
            if stamp is not None:
                if host_state.updated == stamp:
                    return known
            elif known[0] is topo:
                return known
    stamp = _stamp(host_state, settled)
    # A usage named by its update holds no object: nor keeps one alive.
    holder = topo if stamp is None else None
    cells = topo.cells
    if not cells:
        return (holder, None, stamp)
    return (holder, tuple(map(_cell_usage, cells)), stamp)


def _stamp(host_state, settled):
    """``host_state.updated`` if it is not newer than ``settled``, else
    None (also when either is unset, or one has a time zone and the other
    none: such stamps are not compared).
    """
    updated = getattr(host_state, 'updated', None)
    if updated is None or settled is None:
        return None
    try:
        return updated if updated <= settled else None
    except TypeError:
        return None


def numa_cells(host_state, spec):
    """NUMA cell usage from Nova's HostState, when affinity matters:
    ``((id, cpu_milli, cpu_used, memory_mib, memory_used), ...)``.
    """
    return _numa_usage(host_state, spec)[1]


def _cell_usage(cell):
    """``(id, cpu_milli, cpu_used, memory_mib, memory_used)`` of a Nova
    NUMACell: CPUs dedicated ones (pinned) when the cell has any, else
    shared ones (their usage). Public fields only (their properties).
    """
    pcpus = cell.pcpuset
    if pcpus:
        return (cell.id, len(pcpus) * 1000,
                len(cell.pinned_cpus or ()) * 1000,
                cell.memory, cell.memory_usage)
    return (cell.id, len(cell.cpuset) * 1000, cell.cpu_usage * 1000,
            cell.memory, cell.memory_usage)
