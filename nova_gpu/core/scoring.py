"""How nova-gpu ranks the feasible placements of one request.

The cost of a placement (lower is better) has these parts:

1. The growth of the host's expected fragmentation
   (``fragmentation.host_fragmentation``, FGD's measure: free GPU capacity
   that typical requests cannot use, counting CPU and memory), plus
   ``sliver`` times the growth of *dead remainder* on the GPU a share
   goes to (free capacity left above 0 and below ``dead_below`` milli,
   which the common shares cannot use; FGD's one-step measure counts a
   large remainder as lost to whole-GPU requests although later shares
   fill it, and so prefers cutting a GPU down to a dead sliver), in steps
   of ``quantum`` GPUs. Placements closer than a step are equal, and
   equal placements go to the first host in the scheduler's order: a
   first-fit that keeps load on few hosts and whole hosts free. Replays
   of the Alibaba trace lose about five points of allocation when exact
   deltas let every placement scatter to whichever host is marginally
   best.
2. ``strand`` steps per GPU stranded: free GPUs beyond what the host's
   free CPU and memory can feed, at the demand's mean CPU and memory per
   GPU (``StrandModel``). Without it, CPU-heavy work fills hosts whose
   GPUs then stay idle.
3. ``reserve`` steps per GPU taken, times the GPU model's *reserve*:
   the share of typical demand that can only run on a few models, spread
   over those models (``ModelReserve``). Work that could run anywhere
   then leaves those models to the requests that need them.
4. ``tight`` per free milli of the GPU chosen before the placement:
   among equal choices, the tightest GPU (best fit).

``placement_cost`` is plain arithmetic (``//``, ``abs``), so it takes
scalars (the scheduler engine, one host at a time) or numpy arrays (the
simulator, every candidate at once) alike; ``host_placement_cost`` applies
it to a core ``Host``.
"""

import dataclasses
import typing

from nova_gpu.core import fragmentation
from nova_gpu.core import host as host_mod


@dataclasses.dataclass(frozen=True)
class CostWeights:
    quantum: float = 0.1  # GPUs of fragmentation per cost step
    strand: float = 3.0  # cost steps per stranded GPU
    tight: float = 1e-6  # cost steps per free milli on the chosen GPU
    reserve: float = 3.0  # cost steps per GPU of a fully reserved model
    sliver: float = 4.0  # weight of dead remainder against fragmentation
    dead_below: int = 220  # milli: remainders the common shares cannot use


DEFAULT_WEIGHTS = CostWeights()


@dataclasses.dataclass(frozen=True)
class StrandModel:
    """Mean CPU (milli) and memory (MiB) that one GPU of demand brings."""

    cpu_per_gpu: float
    mem_per_gpu: float

    @classmethod
    def from_typical(cls, items):
        """From (cpu_milli, memory_mib, gpu_milli, weight) tuples."""
        gpus = sum(w * g for _c, _m, g, w in items if g) / host_mod.MILLI
        if not gpus:
            return cls(float('inf'), float('inf'))
        cpu = sum(w * c for c, _m, g, w in items if g) / gpus
        mem = sum(w * m for _c, m, g, w in items if g) / gpus
        return cls(cpu or float('inf'), mem or float('inf'))

    @classmethod
    def from_demand(cls, demand):
        """From a ``fragmentation.Demand`` of share/whole requests."""
        return cls.from_typical(
            [(i.request.cpu_milli, i.request.memory_mib,
              i.request.gpu_milli, i.weight)
             for i in demand.items if i.request is not None])

    def stranded(self, gpu_free, cpu_free, mem_free):
        """GPUs (of ``gpu_free`` milli) the free CPU and memory cannot feed."""
        gpus = gpu_free / host_mod.MILLI
        by_cpu = gpus - cpu_free / self.cpu_per_gpu
        by_mem = gpus - mem_free / self.mem_per_gpu
        worst = (by_cpu + by_mem + abs(by_cpu - by_mem)) / 2
        return (worst + abs(worst)) / 2


class ModelReserve:
    """How much a GPU model is needed by requests that only it can serve.

    Each typical request restricted to a set of models spreads its GPU
    demand evenly over the models of that set in the cluster. A model's
    reserve is the restricted demand it receives as a share of all GPU
    demand, divided by its share of the cluster's GPUs: about 1 when the
    restricted requests alone would fill it, near 0 when it is plentiful.
    """

    def __init__(self, restricted, capacity):
        """``restricted``: (models or None, weight x GPU milli) per typical
        request; ``capacity``: {model name: GPUs in the cluster}.
        """
        total = sum(w for _m, w in restricted)
        gpus = sum(capacity.values())
        self.values = dict.fromkeys(capacity, 0.0)
        if not total or not gpus:
            return
        for models, weight in restricted:
            if models is None:
                continue
            here = [m for m in capacity if m in models]
            for name in here:
                self.values[name] += weight / len(here) / total
        for name, count in capacity.items():
            self.values[name] = (self.values[name] / (count / gpus)
                                 if count else 0.0)

    def of(self, model_name):
        return self.values.get(model_name, 0.0)


def dead_remainder(weights, free):
    """Free milli on one GPU that the common shares cannot use."""
    return (free > 0) * (free < weights.dead_below) * free


def placement_cost(weights, strand_model, frag_delta, gpu_free_before,
                   gpu_free_after, cpu_before, cpu_after, mem_before,
                   mem_after, unit_free=0, reserve=0.0, unit_free_after=None):
    """Cost of one placement on one host; lower is better.

    ``frag_delta``: growth of the host's expected fragmentation (milli);
    GPU free capacity (milli), CPU (milli) and memory (MiB) free on the
    host before and after; ``unit_free``: free milli of the GPU a share
    goes to, before it does, and ``unit_free_after`` after it does (None
    for placements of whole GPUs or none); ``reserve``: the
    ``ModelReserve`` of the host's GPU model.
    """
    if unit_free_after is not None and weights.sliver:
        frag_delta = frag_delta + weights.sliver * (
            dead_remainder(weights, unit_free_after)
            - dead_remainder(weights, unit_free))
    # The nudge keeps deltas computed in different orders (incrementally in
    # the simulator, by difference here) on the same side of a step.
    cost = (frag_delta + 1e-6) // (weights.quantum * host_mod.MILLI)
    if weights.strand:
        cost = cost + weights.strand * (
            strand_model.stranded(gpu_free_after, cpu_after, mem_after)
            - strand_model.stranded(gpu_free_before, cpu_before,
                                    mem_before))
    if weights.reserve:
        cost = cost + weights.reserve * reserve * (
            gpu_free_before - gpu_free_after) / host_mod.MILLI
    return cost + weights.tight * unit_free


class Effect(typing.NamedTuple):
    """What one placement does to a host, as ``placement_cost`` reads it."""

    frag_delta: float
    gpu_free_before: int
    gpu_free_after: int
    unit_free: int
    unit_free_after: typing.Optional[int]


def placement_effect(host, placement, demand, before=None):
    """Measure ``placement`` on ``host`` (a core Host) without keeping it.

    ``before`` is the host's fragmentation now, when the caller has it.
    """
    if before is None:
        before = fragmentation.host_fragmentation(host, demand)
    gpu_before = sum(g.free_milli for g in host.gpus)
    unit_free, unit_free_after, unit = 0, None, None
    if (len(placement.slots) == 1
            and placement.slots[0].kind != host_mod.WHOLE):
        unit = host.gpus[placement.slots[0].gpu]
        unit_free = unit.free_milli
    host.allocate(placement)
    try:
        if unit is not None:
            unit_free_after = unit.free_milli
        after = fragmentation.host_fragmentation(host, demand)
        gpu_after = sum(g.free_milli for g in host.gpus)
    finally:
        host.free(placement)
    return Effect(after - before, gpu_before, gpu_after, unit_free,
                  unit_free_after)


def host_placement_cost(host, placement, demand, strand_model,
                        weights=DEFAULT_WEIGHTS, reserve=None):
    """``placement_cost`` of ``placement`` on ``host`` (a core Host).

    ``reserve`` is a ``ModelReserve`` (None: no model is reserved).
    """
    effect = placement_effect(host, placement, demand)
    model_reserve = 0.0
    if reserve is not None and host.gpus:
        model_reserve = reserve.of(host.gpus[0].model.name)
    return placement_cost(
        weights, strand_model, effect.frag_delta, effect.gpu_free_before,
        effect.gpu_free_after, host.cpu_free,
        host.cpu_free - placement.cpu_milli, host.memory_free,
        host.memory_free - placement.memory_mib, effect.unit_free,
        model_reserve, effect.unit_free_after)
