"""The placement engine: feasible device choices, the best one, host score.

Filter and score are separate steps, as in Nova and the Kubernetes
scheduler framework: ``choices`` says what is possible, ``rank`` orders it.
"""

import dataclasses

from nova_gpu.core import exceptions
from nova_gpu.core import fragmentation
from nova_gpu.core import host as host_mod
from nova_gpu.core import topology


@dataclasses.dataclass(frozen=True)
class Weights:
    """Relative weight of each part of a choice's cost (lower is better)."""

    fragmentation: float = 1.0
    topology: float = 0.25
    numa: float = 0.5


@dataclasses.dataclass(frozen=True)
class Choice:
    placement: host_mod.Placement
    frag_delta: float  # growth of expected fragmentation, in GPUs
    topology: float  # topology.penalty of the GPU set
    numa: float  # 1.0 when NUMA affinity was preferred but missed
    cost: float


class PlacementEngine:
    """Shared by the scheduler filter and weighers, the agent and the sim."""

    def __init__(self, demand=None, weights=None):
        self.demand = demand or fragmentation.Demand(())
        self.weights = weights or Weights()

    # -- filter -----------------------------------------------------------

    def choices(self, host, req):
        """Every feasible placement worth considering, unordered."""
        return [c[0] for c in self._candidates(host, req)]

    def why_not(self, host, req):
        """A sentence saying why ``req`` has no placement on ``host``."""
        if req.cpu_milli > host.cpu_free:
            return 'needs %d CPU milli, %d free' % (req.cpu_milli,
                                                    host.cpu_free)
        if req.memory_mib > host.memory_free:
            return 'needs %d MiB memory, %d free' % (req.memory_mib,
                                                     host.memory_free)
        allowed = [g for g in host.gpus if req.models is None
                   or fragmentation._model_allowed(g.model, req.models)]
        if not allowed:
            return 'no GPU of model %s' % ', '.join(sorted(req.models))
        what = req.profile or req.kind
        fitting = [g for g in allowed if fragmentation.unit_slots(g, req)]
        if len(fitting) < req.count:
            return ('%d of %d GPUs can take a %s device, %d needed'
                    % (len(fitting), len(host.gpus), what, req.count))
        if req.topology != 'any':
            return ('no %d GPUs satisfy topology=%s'
                    % (req.count, req.topology))
        return 'no NUMA node can hold the GPUs with the CPU and memory'

    # -- score ------------------------------------------------------------

    def rank(self, host, req):
        """Feasible choices, best (lowest cost) first."""
        candidates = self._candidates(host, req)
        if not candidates:
            return []
        base = _FragState(host, self.demand)
        w = self.weights
        result = []
        for placement, gpus, numa_miss in candidates:
            delta = base.delta(placement, req) / host_mod.MILLI
            topo = topology.penalty(gpus)
            cost = (w.fragmentation * delta + w.topology * topo
                    + w.numa * numa_miss)
            result.append(Choice(placement, delta, topo, numa_miss, cost))
        result.sort(key=lambda c: (c.cost, c.placement.gpus,
                                   [s.detail for s in c.placement.slots
                                    if s.kind == host_mod.MIG]))
        return result

    def best(self, host, req):
        ranked = self.rank(host, req)
        if not ranked:
            raise exceptions.NoFit(host.name, self.why_not(host, req))
        return ranked[0]

    # -- internals --------------------------------------------------------

    def _candidates(self, host, req):
        if req.cpu_milli > host.cpu_free or req.memory_mib > host.memory_free:
            return []
        options = {}
        for gpu in host.gpus:
            if (req.models is not None and
                    not fragmentation._model_allowed(gpu.model, req.models)):
                continue
            slots = fragmentation.unit_slots(gpu, req)
            if slots:
                options[gpu.index] = slots
        if len(options) < req.count:
            return []
        # Best-packed GPUs first: the least free capacity left over.
        ordered = sorted((host.gpus[i] for i in options),
                         key=lambda g: (g.free_milli, g.index))
        result = []
        for gpus in topology.candidate_sets(ordered, req.count):
            if not topology.satisfies(gpus, req.topology):
                continue
            numa_node, numa_miss = self._numa(host, gpus, req)
            if numa_miss is None:
                continue
            # Each GPU of the set may offer several slots (MIG starts);
            # one device per GPU.
            for slots in _slot_product([options[g.index] for g in gpus]):
                result.append((host_mod.Placement(
                    host.name, slots, numa_node, req.cpu_milli,
                    req.memory_mib), gpus, numa_miss))
        return result

    @staticmethod
    def _numa(host, gpus, req):
        """(cell to charge, miss penalty), or (None, None) if refused."""
        if req.numa_affinity == 'none' or not host.cells:
            return None, 0.0
        nodes = {g.numa_node for g in gpus}
        if len(nodes) == 1:
            cell = host.cells.get(next(iter(nodes)))
            if cell and cell.fits(req.cpu_milli, req.memory_mib):
                return cell.id, 0.0
        if req.numa_affinity == 'require':
            return None, None
        return None, 1.0


def _slot_product(options):
    if len(options) == 1:
        return [(s,) for s in options[0]]
    # Multi-GPU: keep it small, the first slot of each GPU suffices
    # except for the MIG start choice, which only matters per GPU.
    return [tuple(o[0] for o in options)]


class _FragState:
    """Expected fragmentation of a host, updated incrementally per choice."""

    def __init__(self, host, demand):
        self.host = host
        self.items = [(i.request, i.weight) for i in demand.items]
        self.frees = [g.free_milli for g in host.gpus]
        self.fits = [[req is not None and fragmentation.unit_fits(g, req)
                      for g in host.gpus] for req, _ in self.items]
        self.counts = [sum(row) for row in self.fits]
        self.lost = [sum(f for f, ok in zip(self.frees, row) if not ok)
                     for row in self.fits]
        self.total_free = sum(self.frees)
        self.value = self._value(self.frees, self.counts, self.lost,
                                 self.total_free, 0, 0)

    def _value(self, frees, counts, lost, total_free, cpu, mem):
        host = self.host
        cpu_free = host.cpu_free - cpu
        mem_free = host.memory_free - mem
        result = 0.0
        for (req, weight), count, lost_m in zip(self.items, counts, lost):
            if (req is None or count < req.count or req.cpu_milli > cpu_free
                    or req.memory_mib > mem_free):
                result += weight * total_free
            else:
                result += weight * lost_m
        return result

    def delta(self, placement, req):
        if not self.items:
            return 0.0
        host = self.host
        touched = placement.gpus
        for slot in placement.slots:
            host.gpus[slot.gpu].take(slot)
        try:
            counts = list(self.counts)
            lost = list(self.lost)
            total_free = self.total_free
            for gi in touched:
                gpu = host.gpus[gi]
                new_free = gpu.free_milli
                total_free += new_free - self.frees[gi]
                for m, (mreq, _w) in enumerate(self.items):
                    was = self.fits[m][gi]
                    now = (mreq is not None
                           and fragmentation.unit_fits(gpu, mreq))
                    counts[m] += now - was
                    lost[m] += ((0 if now else new_free)
                                - (0 if was else self.frees[gi]))
        finally:
            for slot in reversed(placement.slots):
                host.gpus[slot.gpu].give_back(slot)
        after = self._value(None, counts, lost, total_free,
                            placement.cpu_milli, placement.memory_mib)
        return after - self.value
