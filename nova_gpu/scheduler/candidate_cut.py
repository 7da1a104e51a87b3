"""GpuCandidateCutFilter: fewer candidates for Nova's costly PCI checks.

Nova's ``NUMATopologyFilter`` and ``PciPassthroughFilter`` check every
allocation candidate of every host for a request with PCI devices (whole
GPUs, vendor-VFIO vGPUs): ``PciDeviceStats.support_requests`` deep-copies
the host's PCI pools for each, milliseconds per candidate, most of what
such a request costs (doc/source/benchmarks.rst). Nova then claims only
candidate 0 of a host, the one GpuFilter (last) puts first. This filter,
placed before those two, keeps on each host only the candidates GpuFilter
could put first: its best ``[gpu_scheduler] pci_candidates_per_host`` in
its own order (where more are as good as the best, that many of those,
from where the request's draw falls: GpuFilter then draws among them as
uniformly as among all), and drops nothing else::

    enabled_filters = ...,GpuCandidateCutFilter,NUMATopologyFilter,
                      PciPassthroughFilter,GpuFilter

It refuses no host: GpuFilter still decides, with its reasons, on what
Nova's filters left. Placements are the same as without it whenever one
of the kept candidates passes Nova's PCI check, which holds while
nova-compute's PCI tracker agrees with Placement (the PCI in Placement
design: Placement's inventory is made from the tracker's pools). The
functional test ``test_candidate_cut`` boots a sequence with and without
it and compares every placement.

Left as they come: requests without PCI devices (Nova checks their
candidates cheaply), multi-create requests (each instance's pass counts
the earlier ones' claims, which ``decide`` does), rebuilds, and any host
the view cannot answer for.
"""

from nova.scheduler import filters
from nova.scheduler import utils as scheduler_utils
from oslo_config import cfg
from oslo_log import log as logging

from nova_gpu.scheduler import filters as gpu_filters
from nova_gpu.scheduler import gpu_spec

CONF = cfg.CONF
LOG = logging.getLogger(__name__)


def asks_pci(spec_obj):
    """Whether the request asks PCI devices (Nova's per-candidate checks)."""
    requests = getattr(spec_obj, 'pci_requests', None)
    return bool(requests and requests.requests)


class GpuCandidateCutFilter(filters.BaseHostFilter):
    """Keep the allocation candidates GpuFilter could put first."""

    RUN_ON_REBUILD = False
    run_filter_once_per_request = False

    def __init__(self, view=None):
        # The service's view, given when nova-gpu-scheduler starts
        # (``listener.service_started``), as to GpuFilter.
        self._view = view

    def filter_all(self, filter_obj_list, spec_obj):
        keep = CONF.gpu_scheduler.pci_candidates_per_host
        view = self._view
        spec = None
        try:
            if (keep and view is not None and asks_pci(spec_obj)
                    and (getattr(spec_obj, 'num_instances', 1) or 1) == 1
                    and not scheduler_utils.request_is_rebuild(spec_obj)):
                spec = gpu_spec.from_request_spec(spec_obj)
        except Exception as e:
            # GpuFilter reads the request again and says what is wrong.
            LOG.debug('GpuCandidateCutFilter left the request as it was: '
                      '%s: %s', type(e).__name__, e)
            spec = None
        if spec is None:
            yield from filter_obj_list
            return
        request = view.request(spec_obj, spec)
        for host_state in filter_obj_list:
            self._cut(view, request, host_state, keep)
            yield host_state

    def host_passes(self, host_state, spec_obj):
        return True  # filter_all does the work; no host is refused

    @staticmethod
    def _cut(view, request, host_state, keep):
        try:
            candidates = host_state.allocation_candidates
            if not candidates or len(candidates) <= keep:
                return
            candidates = list(candidates)
            cells = gpu_filters.numa_cells(host_state, request.spec)
            kept = view.cut(request, host_state.nodename, cells, candidates,
                            keep)
            if kept is not None:
                host_state.allocation_candidates = [candidates[i]
                                                    for i in kept]
        except Exception as e:
            # The host keeps its candidates: GpuFilter decides on them.
            LOG.debug('GpuCandidateCutFilter left %s as it was: %s: %s',
                      host_state.nodename, type(e).__name__, e)
