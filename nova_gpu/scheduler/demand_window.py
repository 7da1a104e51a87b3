"""The windowed demand: what requests this scheduler has seen lately.

The fragmentation measure (``core.fragmentation``) weighs free GPU
capacity by the typical requests that could still use it. In nova-scheduler
those are the last ``[gpu_scheduler] demand_window`` requests (the most
frequent ``DEMAND_ITEMS`` of them), plus the operator's
``typical_requests`` and, always, a whole GPU. The distribution, and the
placement engine built on it, is rebuilt at most every
``demand_refresh_interval`` seconds, so that memoised rankings stay valid
between rebuilds (``version`` names the current one).

Each rebuilt distribution is also published (``gpu.demand.updated``, the
contract in ``core.notification``) for the agents' layout planners, at
most every ``[gpu_scheduler] demand_publish_interval`` seconds: a rebuild
inside that time is sent with the first request after it ends. The
published demand leaves out the whole-GPU share, which no request made.
"""

import collections
import dataclasses

from oslo_config import cfg

from nova_gpu.core import engine as engine_mod
from nova_gpu.core import exceptions
from nova_gpu.core import fragmentation
from nova_gpu.core import host as host_mod
from nova_gpu.core import notification
from nova_gpu.core import request as request_mod
from nova_gpu.scheduler import gpu_spec
from nova_gpu.scheduler import notifier as notifications

CONF = cfg.CONF

# Distinct observed requests the demand keeps (the most frequent).
DEMAND_ITEMS = 16
# A whole GPU is always part of the demand, at this share: an empty GPU is
# worth keeping empty for whoever needs all of one.
WHOLE_GPU_SHARE = 0.5


class DemandWindow:
    """Recent requests -> the engine that scores against them.

    Not thread-safe on its own: the caller holds its lock around
    ``note`` (the view does).
    """

    def __init__(self, catalog, clock, engine_weights=None):
        self.clock = clock
        self.engine_weights = engine_weights
        self.recent = collections.deque()
        self.counts = collections.Counter()
        self.rebuilt = clock()
        self.seen = False
        self.typical = typical_requests(catalog)
        self.engine = engine_mod.PlacementEngine(
            self.distribution(), engine_weights,
            rdma_scope=CONF.gpu_scheduler.rdma_locality)
        self.version = 0
        self.published = None      # clock() of the last publication
        self.published_version = None

    def note(self, spec):
        """Count a request; rebuild the engine when it is time."""
        if not spec.alternatives:
            return
        req = plain(spec.alternatives[0])
        window = CONF.gpu_scheduler.demand_window
        self.recent.append(req)
        self.counts[req] += 1
        while len(self.recent) > window:
            old = self.recent.popleft()
            self.counts[old] -= 1
            if not self.counts[old]:
                del self.counts[old]
        if (not self.seen or self.clock() - self.rebuilt
                >= CONF.gpu_scheduler.demand_refresh_interval):
            self.rebuild()

    def rebuild(self):
        self.rebuilt = self.clock()
        self.seen = bool(self.counts)
        self.engine = engine_mod.PlacementEngine(
            self.distribution(), self.engine_weights,
            rdma_scope=CONF.gpu_scheduler.rdma_locality)
        self.version += 1

    def due_publication(self):
        """The publication due now (a callable that sends it), or None.

        Due when the distribution is new and the interval has passed; it
        is counted as published once returned. The caller sends it outside
        any lock it holds: a send may wait on the broker.
        """
        interval = CONF.gpu_scheduler.demand_publish_interval
        if not interval or self.published_version == self.version:
            return None
        now = self.clock()
        if self.published is not None and now - self.published < interval:
            return None
        self.published, self.published_version = now, self.version
        # Without the whole-GPU share: it keeps empty GPUs valuable to the
        # fragmentation measure, but nobody asked for it, and a planner
        # carving to it would set GPUs aside for passthrough.
        items = notification.demand_to_items(self.distribution(whole=False))
        version, requests = self.version, sum(self.counts.values())
        # Never raises (``notifications`` logs and drops a failed send).
        return lambda: notifications.demand_updated(
            items, version=version, requests=requests)

    def distribution(self, whole=True):
        """The demand (``core.fragmentation.Demand``) as it stands.

        ``whole``: with the share of a whole GPU (``WHOLE_GPU_SHARE``).
        """
        # The most frequent requests: each one more costs every scoring.
        items = [fragmentation.DemandItem(req, n)
                 for req, n in self.counts.most_common(DEMAND_ITEMS)]
        seen = sum(self.counts.values()) or 1
        for req in self.typical:
            items.append(fragmentation.DemandItem(
                req, max(seen, 1) / len(self.typical)))
        total = sum(i.weight for i in items) or 1
        if not whole:
            return fragmentation.Demand(items)
        items.append(fragmentation.DemandItem(
            request_mod.GpuRequest(host_mod.WHOLE),
            total * WHOLE_GPU_SHARE / (1 - WHOLE_GPU_SHARE)))
        return fragmentation.Demand(items)


def plain(req):
    """The device part of a request, for the demand distribution."""
    return dataclasses.replace(req, cpu_milli=0, memory_mib=0,
                               numa_affinity='none')


def typical_requests(catalog):
    """``[gpu_scheduler] typical_requests`` as device requests."""
    result = []
    for line in CONF.gpu_scheduler.typical_requests:
        specs = dict(part.strip().split('=', 1) for part in line.split(';')
                     if '=' in part)
        try:
            spec = gpu_spec.parse(specs, catalog)
        except exceptions.InvalidRequest as e:
            raise exceptions.InvalidRequest(
                '[gpu_scheduler] typical_requests: %r: %s' % (line, e)
            ) from e
        if spec is None or not spec.alternatives:
            raise exceptions.InvalidRequest(
                '[gpu_scheduler] typical_requests: %r asks for no GPU'
                % line)
        result.append(plain(spec.alternatives[0]))
    return result
