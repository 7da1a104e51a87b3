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

from nova.scheduler import filters
from nova.scheduler import utils as scheduler_utils
from oslo_log import log as logging

from nova_gpu.scheduler import flavor
from nova_gpu.scheduler import view as view_mod

LOG = logging.getLogger(__name__)

# At most this many per-host reasons go into the NoValidHost log line.
MAX_REASONS = 20


class GpuFilter(filters.CandidateFilterMixin, filters.BaseHostFilter):
    """Keep hosts (and candidates) whose GPUs can serve the flavor."""

    RUN_ON_REBUILD = False
    run_filter_once_per_request = False

    def __init__(self, view=None):
        self._view = view

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
        self.view.note_request(spec)
        reasons, passed = [], 0
        for host_state in filter_obj_list:
            why = self._check(host_state, spec_obj, spec)
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
        return spec is None or self._check(host_state, spec_obj,
                                           spec) is None

    # -- one host -----------------------------------------------------------

    def _check(self, host_state, spec_obj, spec):
        """None if ``host_state`` passes, else the reason it does not."""
        if spec.problem:
            return spec.problem
        view = self.view
        entry = view.get(host_state.nodename)
        if entry is None:
            if spec.explicit:
                return 'no GPU report from this host yet'
            return None  # stock vGPU flavor on an unknown host: as Nova
        view.catch_claim(entry, spec_obj, host_state.num_instances)
        ranking = view.ranking(entry, spec, _cells(host_state, spec))
        if not ranking.items:
            view.decide(entry, spec_obj, host_state.num_instances, None)
            return ranking.why
        best = ranking.items[0]
        if host_state.allocation_candidates:
            best = self._order_candidates(host_state, entry, spec, ranking)
            if best is False:
                return ('Placement offered GPU providers that cannot serve '
                        'the request: %s' % (ranking.why or
                                             'profile, model or topology'))
        view.decide(entry, spec_obj, host_state.num_instances, best)
        return None

    def _order_candidates(self, host_state, entry, spec, ranking):
        """Prune and sort candidates; return the Ranked of candidate 0.

        Returns None when candidate 0 could not be mapped to GPUs (its
        providers are not resolved yet) and False when no candidate is
        left.
        """
        rc = spec.resource_class
        unranked = len(ranking.items)
        ranks = {}

        def keep(candidate):
            gpus = _gpus_of(entry, candidate, rc)
            if gpus is None:
                ranks[id(candidate)] = unranked + 1  # unknown: keep, last
                return True
            pos = ranking.position.get(gpus)
            if pos is None:
                if not view_feasible(gpus):
                    return False
                pos = unranked
            ranks[id(candidate)] = pos
            return True

        def view_feasible(gpus):
            return bool(gpus) and self.view.feasible(entry, spec, gpus)

        kept = self.filter_candidates(host_state, keep)
        if not kept:
            return False
        kept.sort(key=lambda c: ranks[id(c)])
        first = ranks[id(kept[0])]
        return ranking.items[first] if first < unranked else None


def _gpus_of(entry, candidate, rc):
    """Sorted GPU indices a candidate allocates ``rc`` on, or None."""
    gpus = []
    uuids = entry.uuids
    for rp_uuid, alloc in candidate['allocations'].items():
        if rc in alloc['resources']:
            index = uuids.get(rp_uuid)
            if index is None:
                return None
            gpus.append(index)
    return tuple(sorted(gpus))


def _cells(host_state, spec):
    """NUMA cell usage from Nova's HostState, when affinity matters."""
    if spec.alternatives[0].numa_affinity == 'none':
        return None
    topo = host_state.numa_topology
    if not topo:
        return None
    result = []
    for cell in topo.cells:
        cpus = cell.pcpuset or cell.cpuset
        result.append((cell.id, len(cpus) * 1000,
                       len(cell.pinned_cpus or ()) * 1000
                       if cell.pcpuset else cell.cpu_usage * 1000,
                       cell.memory, cell.memory_usage))
    return tuple(result)
