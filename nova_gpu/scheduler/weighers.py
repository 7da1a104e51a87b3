"""Weighers ranking hosts by the GPU choice GpuFilter made on each.

Enable them next to Nova's own::

    [filter_scheduler]
    weight_classes = nova.scheduler.weights.all_weighers
    weight_classes = nova_gpu.scheduler.weighers.GpuFragmentationWeigher
    weight_classes = nova_gpu.scheduler.weighers.GpuTopologyWeigher

Multipliers are ``[gpu_scheduler] fragmentation_weight_multiplier`` and
``topology_weight_multiplier``, overridable per aggregate with the metadata
keys ``gpu_fragmentation_weight_multiplier`` and
``gpu_topology_weight_multiplier``, as for Nova's weighers. They need
GpuFilter enabled: it leaves its choice for each host in the view.
"""

from nova.scheduler import utils
from nova.scheduler import weights
from oslo_config import cfg

from nova_gpu.scheduler import filters
from nova_gpu.scheduler import listener
from nova_gpu.scheduler import view as view_mod

CONF = cfg.CONF

# Best fit among equal fragmentation: each free milli-GPU left on the
# chosen GPUs costs this much, far below any fragmentation step.
BEST_FIT = 1e-6


class _GpuWeigher(weights.BaseHostWeigher):
    option = None

    def __init__(self, view=None):
        self._view = view
        self._multiplier = getattr(CONF.gpu_scheduler, self.option)
        listener.bind_to_scheduler_service()

    @property
    def view(self):
        if self._view is None:
            self._view = view_mod.get_view()
        return self._view

    def weight_multiplier(self, host_state):
        if not host_state.aggregates:
            return self._multiplier
        return utils.get_weight_multiplier(
            host_state, 'gpu_' + self.option, self._multiplier)

    def _weigh_object(self, host_state, weight_properties):
        # One host's bad state weighs it neutral; it never fails the
        # request for every host.
        try:
            ranked = self.view.decision(host_state.nodename,
                                        weight_properties)
            if ranked is None:
                return 0.0
            return float(self._weight(ranked))
        except Exception as e:
            filters.contained(self.view.get(host_state.nodename),
                              host_state.nodename, type(self).__name__,
                              '%s: %s' % (type(e).__name__, e))
            return 0.0


class GpuFragmentationWeigher(_GpuWeigher):
    """Prefer hosts where the request grows GPU fragmentation least."""

    option = 'fragmentation_weight_multiplier'

    def _weight(self, ranked):
        return -(ranked.choice.frag_delta + BEST_FIT * ranked.free_milli)


class GpuTopologyWeigher(_GpuWeigher):
    """Prefer hosts whose GPU set is best connected and NUMA-local."""

    option = 'topology_weight_multiplier'

    def _weight(self, ranked):
        return -(ranked.choice.topology + ranked.choice.numa)
