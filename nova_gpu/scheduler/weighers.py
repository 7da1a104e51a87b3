"""Weighers ranking hosts by the GPU choice GpuFilter made on each.

Enable them next to Nova's own::

    [filter_scheduler]
    weight_classes = nova.scheduler.weights.all_weighers
    weight_classes = nova_gpu.scheduler.weighers.GpuFragmentationWeigher
    weight_classes = nova_gpu.scheduler.weighers.GpuTopologyWeigher

or, for the same weights at the per-host cost of one weigher in Nova's
weighing loop, ``GpuWeigher`` alone in place of both (large clouds).

Multipliers are ``[gpu_scheduler] fragmentation_weight_multiplier`` and
``topology_weight_multiplier``, overridable per aggregate with the metadata
keys ``gpu_fragmentation_weight_multiplier`` and
``gpu_topology_weight_multiplier``, as for Nova's weighers. They need
GpuFilter enabled: it leaves its decision on each host's HostState
(``filters.decision_of``), where Nova keeps per-host results.
"""

import itertools
import operator

from nova.scheduler import utils
from nova.scheduler import weights
from nova import weights as base_weights
from oslo_config import cfg

from nova_gpu.scheduler import filters

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


_OBJ = operator.attrgetter('obj')
_RANKED = operator.attrgetter('ranked')
_AGGREGATES = operator.attrgetter('aggregates')
_NEUTRAL = (0.0, 0.0)


class GpuWeigher(weights.BaseHostWeigher):
    """Both GPU measures in one weigher: the weights
    GpuFragmentationWeigher and GpuTopologyWeigher would add together.

    Nova normalises each weigher's weights across the hosts (min-max) and
    adds ``multiplier * weight`` per host; this weigher does exactly that
    for both measures itself, with the same multipliers (options and
    aggregate keys), and hands Nova the sum, which Nova then takes as it
    is (``minval`` 0, ``maxval`` 1, multiplier 1). Enable it instead of
    the other two, never with them: Nova's loop costs every weigher
    several microseconds per host (it formats a log entry per host even
    with DEBUG off), so one weigher instead of two halves that part.
    """

    minval = 0.0
    maxval = 1.0

    def __init__(self):
        self._parts = (GpuFragmentationWeigher(), GpuTopologyWeigher())

    def weight_multiplier(self, host_state):
        # The multipliers are applied per measure in weigh_objects.
        return 1.0

    def weigh_objects(self, weighed_obj_list, weight_properties):
        hosts = list(map(_OBJ, weighed_obj_list))
        # Hosts in the same state share one Ranked: each weighed once.
        memo = {}
        decisions = filters.decisions_of(hosts, weight_properties)
        if decisions is not None:
            pairs = list(map(self._pair_of, map(_RANKED, decisions),
                             itertools.repeat(memo), hosts))
        else:
            pairs = [self._pair(host, weight_properties, memo)
                     for host in hosts]
        aggregates = any(map(_AGGREGATES, hosts))
        total = None
        for part, raw in zip(self._parts, zip(*pairs)):
            norm = base_weights.normalize(raw, minval=part.minval,
                                          maxval=part.maxval)
            if aggregates:
                scores = list(map(operator.mul, map(
                    part.weight_multiplier, hosts), norm))
            else:
                multiplier = part._multiplier
                scores = [multiplier * weight for weight in norm]
            total = scores if total is None else list(
                map(operator.add, total, scores))
        return total

    def _pair(self, host_state, spec_obj, memo):
        """(fragmentation, topology) raw weights of one host, as the two
        weighers give them (neutral for a host whose state is bad).
        """
        try:
            return self._pair_of(filters.decision_of(host_state, spec_obj),
                                 memo, host_state)
        except Exception as e:
            self._contained(host_state, e)
            return _NEUTRAL

    def _pair_of(self, ranked, memo, host_state):
        """``_pair`` of the Ranked the filter chose (None: neutral)."""
        if ranked is None:
            return _NEUTRAL
        found = memo.get(id(ranked))
        if found is None:
            try:
                found = tuple(round(float(part._weight(ranked)), DIGITS)
                              for part in self._parts)
            except Exception as e:
                self._contained(host_state, e)
                found = _NEUTRAL
            memo[id(ranked)] = found
        return found

    def _contained(self, host_state, error):
        entry = getattr(getattr(host_state, filters.DECISION, None),
                        'entry', None)
        filters.contained(entry, host_state.nodename, type(self).__name__,
                          '%s: %s' % (type(error).__name__, error))

    def _weigh_object(self, host_state, weight_properties):
        # Nova's abstract per-host method; weigh_objects does it all.
        raise NotImplementedError('GpuWeigher weighs in weigh_objects')
