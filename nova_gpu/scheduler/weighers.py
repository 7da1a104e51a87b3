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
GpuFilter enabled: it leaves its decision on each host's HostState
(``filters.decision_of``), where Nova keeps per-host results.
"""

from nova.scheduler import utils
from nova.scheduler import weights
from oslo_config import cfg

from nova_gpu.scheduler import filters
from nova_gpu.scheduler import listener

CONF = cfg.CONF

# Best fit among equal fragmentation: each free milli-GPU left on the
# chosen GPUs costs this much, far below any fragmentation step.
BEST_FIT = 1e-6
# Weights are rounded to this many decimals, far below BEST_FIT: Nova
# normalises weights min-max across hosts, so a float-noise difference
# (2e-16 between two equal choices) would become the full weight and
# decide between hosts in identical states.
DIGITS = 9


class _GpuWeigher(weights.BaseHostWeigher):
    option = None

    def __init__(self):
        self._multiplier = getattr(CONF.gpu_scheduler, self.option)
        listener.bind_to_scheduler_service()

    def weight_multiplier(self, host_state):
        if not host_state.aggregates:
            return self._multiplier
        return utils.get_weight_multiplier(
            host_state, 'gpu_' + self.option, self._multiplier)

    def weigh_objects(self, weighed_obj_list, weight_properties):
        """Weigh every host in one loop (Nova's default calls
        ``_weigh_object`` per host): the filter's decision for this
        request, read from each HostState.
        """
        weigh = self._weigh_object
        return [weigh(w.obj, weight_properties) for w in weighed_obj_list]

    def _weigh_object(self, host_state, weight_properties):
        # One host's bad state weighs it neutral; it never fails the
        # request for every host.
        try:
            ranked = filters.decision_of(host_state, weight_properties)
            if ranked is None:
                return 0.0
            return round(float(self._weight(ranked)), DIGITS)
        except Exception as e:
            decision = getattr(host_state, filters.DECISION, None)
            filters.contained(getattr(decision, 'entry', None),
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
