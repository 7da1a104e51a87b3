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

import logging

from nova.scheduler import filters
from nova.scheduler import utils as scheduler_utils
from oslo_config import cfg
from oslo_log import log as oslo_logging

from nova_gpu.scheduler import flavor
from nova_gpu.scheduler import listener
from nova_gpu.scheduler import view as view_mod

CONF = cfg.CONF
LOG = oslo_logging.getLogger(__name__)

# At most this many per-host reasons go into the NoValidHost log line.
MAX_REASONS = 20
# Candidate orders memoised per ranking (one per distinct candidate list,
# in GPU indices, that Placement returned for hosts in that state).
MAX_ORDERS = 64


class GpuFilter(filters.CandidateFilterMixin, filters.BaseHostFilter):
    """Keep hosts (and candidates) whose GPUs can serve the flavor."""

    RUN_ON_REBUILD = False
    run_filter_once_per_request = False

    def __init__(self, view=None):
        self._view = view
        self._last_request = None
        # Nova builds filters inside SchedulerManager.__init__: tie the
        # report listener to that service's start and stop.
        listener.bind_to_scheduler_service()

    @property
    def view(self):
        if self._view is None:
            self._view = view_mod.get_view()
        return self._view

    def filter_all(self, filter_obj_list, spec_obj):
        if scheduler_utils.request_is_rebuild(spec_obj):
            # The instance keeps the GPUs it has.
            yield from filter_obj_list
            return
        spec = flavor.from_request_spec(spec_obj)
        if spec is None:
            yield from filter_obj_list
            return
        view = self.view
        view.note_request(spec)
        request = self._request(spec_obj, spec)
        reasons, passed = [], 0
        for host_state in filter_obj_list:
            why = self._check(host_state, request)
            if why is None:
                passed += 1
                yield host_state
            else:
                LOG.debug('GpuFilter: %s refused: %s', host_state.nodename,
                          why)
                reasons.append('%s: %s' % (host_state.nodename, why))
        if reasons and not passed:
            LOG.info('GpuFilter: no host can serve the GPU request of '
                     'instance %s (flavor %s): %s%s',
                     getattr(spec_obj, 'instance_uuid', None),
                     spec_obj.flavor.name, '; '.join(reasons[:MAX_REASONS]),
                     '; ...' if len(reasons) > MAX_REASONS else '')

    def host_passes(self, host_state, spec_obj):
        spec = flavor.from_request_spec(spec_obj)
        return spec is None or self._check(
            host_state, self._request(spec_obj, spec)) is None

    def _request(self, spec_obj, spec):
        # One weak reference per pass: every host's decision shares it, so
        # the weighers and the next pass of a multi-create can tell it.
        last = self._last_request
        if (last is not None and last.spec_ref() is spec_obj
                and last.spec is spec and last.instance_uuid
                == getattr(spec_obj, 'instance_uuid', None)):
            return last
        self._last_request = self.view.request(spec_obj, spec)
        return self._last_request

    # -- one host -----------------------------------------------------------

    def _check(self, host_state, request):
        """None if ``host_state`` passes, else the reason it does not.

        Whatever goes wrong with one host (a report the parser let
        through that the engine still cannot rank, a bug) refuses that
        host with the reason and leaves every other host, and every other
        request, as they were.
        """
        try:
            return self._check_host(host_state, request)
        except Exception as e:
            why = 'GPU view of this host is unusable: %s: %s' % (
                type(e).__name__, e)
            contained(self.view.get(host_state.nodename),
                      host_state.nodename, 'GpuFilter', why)
            return why

    def _check_host(self, host_state, request):
        spec = request.spec
        if spec.problem:
            return spec.problem
        view = self.view
        entry = view.get(host_state.nodename)
        if entry is None:
            if spec.explicit:
                return 'no GPU report from this host yet'
            return None  # stock vGPU flavor on an unknown host: as Nova
        view.catch_claim(entry, request, host_state.num_instances)
        ranking = view.ranking(entry, spec, _cells(host_state, spec),
                               request.token)
        if not ranking.items:
            view.decide(entry, request, host_state.num_instances, None)
            return ranking.why
        best = ranking.items[0]
        if host_state.allocation_candidates:
            best = self._order_candidates(host_state, entry, spec, ranking)
            if best is False:
                return ('Placement offered GPU providers that cannot serve '
                        'the request: %s' % (ranking.why or
                                             'profile, model or topology'))
        view.decide(entry, request, host_state.num_instances, best)
        return None

    def _order_candidates(self, host_state, entry, spec, ranking):
        """Prune and sort candidates; return the Ranked of candidate 0.

        Returns None when candidate 0 could not be mapped to GPUs (its
        providers are not resolved yet: it is kept, after the others) and
        False when no candidate is left.
        """
        candidates = host_state.allocation_candidates
        rc = spec.resource_class
        # In GPU indices, so that hosts in the same state share the memo.
        gpu_sets = [_gpus_of(entry, c, rc) for c in candidates]
        signature = tuple(gpu_sets)
        known = ranking.orders.get(signature)
        if known is None:
            known = self._order(entry, spec, ranking, gpu_sets)
            if len(ranking.orders) < MAX_ORDERS:
                ranking.orders[signature] = known
        order, best = known
        if LOG.isEnabledFor(logging.DEBUG):
            # Nova's mixin logs each candidate's fate at DEBUG.
            keep = {id(candidates[i]) for i in order}
            self.filter_candidates(host_state, lambda c: id(c) in keep)
        host_state.allocation_candidates = [candidates[i] for i in order]
        return best if order else False

    def _order(self, entry, spec, ranking, gpu_sets):
        """(indices of the candidates kept, best first; Ranked of the
        first, or None if its GPUs are unknown).
        """
        keyed = []
        for i, gpus in enumerate(gpu_sets):
            if gpus is None:
                keyed.append((_UNKNOWN, i, None))
                continue
            ranked = self.view.evaluate(entry, spec, ranking, gpus)
            if ranked is not None:
                keyed.append((ranked.key, i, ranked))
        keyed.sort(key=_first_two)
        return (tuple(i for _key, i, _r in keyed),
                keyed[0][2] if keyed else None)


def _first_two(item):
    return item[0], item[1]


# Sorts after every known sort key.
_UNKNOWN = (float('inf'),)


def contained(entry, nodename, who, why):
    """Log a contained per-host error at WARNING, once per report."""
    seen = entry.failures if entry is not None else _NO_REPORT_FAILURES
    key = (who, why)
    if key in seen:
        return
    if len(seen) > 100:
        seen.clear()
    seen.add(key)
    LOG.warning('%s contained an error on host %s (GPU report generation '
                '%s), the host is refused or weighed neutral: %s', who,
                nodename, entry.generation if entry is not None else '-',
                why)


# Failures on hosts without a report (bounded; logged once each).
_NO_REPORT_FAILURES = set()


def _gpu_classes(entry, rc):
    """Resource classes that make an allocation a GPU allocation."""
    return entry.gpu_classes | {
        rc, 'VGPU', 'PGPU', CONF.gpu_scheduler.vgpu_resource_class,
        CONF.gpu_scheduler.whole_gpu_resource_class}


def _gpus_of(entry, candidate, rc):
    """Sorted GPU indices a candidate allocates on, or None if unknown.

    Any provider a report listed counts (PF or VF VGPU providers, PCI in
    Placement pools and devices); an allocation of a GPU resource class
    (VGPU, PGPU, or a class a report listed for a GPU provider of this
    host) on a provider the view cannot name makes the set unknown.
    """
    allocations = candidate['allocations']
    rps = tuple(allocations)
    try:
        return entry.rp_sets[rps]
    except KeyError:
        pass
    gpus = []
    uuids = entry.uuids
    classes = None
    for rp_uuid in rps:
        index = uuids.get(rp_uuid)
        if index is not None:
            gpus.append(index)
            continue
        if classes is None:
            classes = _gpu_classes(entry, rc)
        if not classes.isdisjoint(allocations[rp_uuid]['resources']):
            gpus = None  # a GPU provider this view cannot name yet
            break
    found = tuple(sorted(gpus)) if gpus is not None else None
    entry.rp_sets[rps] = found
    return found


def _cells(host_state, spec):
    """NUMA cell usage from Nova's HostState, when affinity matters."""
    if spec.alternatives[0].numa_affinity == 'none':
        return None
    topo = host_state.numa_topology
    if not topo:
        return None
    # Nova replaces the object whenever the usage changes: memoise on it.
    entry_cells = _CELLS.get(id(topo))
    if entry_cells is not None and entry_cells[0] is topo:
        return entry_cells[1]
    result = []
    for cell in topo.cells:
        cpus = cell.pcpuset or cell.cpuset
        result.append((cell.id, len(cpus) * 1000,
                       len(cell.pinned_cpus or ()) * 1000
                       if cell.pcpuset else cell.cpu_usage * 1000,
                       cell.memory, cell.memory_usage))
    result = tuple(result)
    if len(_CELLS) > 100000:
        _CELLS.clear()
    _CELLS[id(topo)] = (topo, result)
    return result


# id(HostState.numa_topology) -> (that object, its cells as plain tuples)
_CELLS = {}
