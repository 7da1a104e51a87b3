"""How nova-gpu ranks the feasible placements of one request.

The cost of a placement (lower is better) is, in GPUs:

* the growth of the host's expected fragmentation
  (``fragmentation.host_fragmentation``: free GPU capacity that typical
  requests cannot use, CPU and memory included, so that GPUs left on a
  host without CPU or memory for them count as lost), plus
* ``pack`` times the free GPU capacity the host keeps (best fit: fill
  hosts already in use before opening fresh ones), plus
* ``strand`` times the GPUs that would be left free while the host's CPU
  or memory runs low: free GPUs times the smaller of the CPU and memory
  shares still free, subtracted, so hosts whose GPUs are gone take the
  CPU-heavy work.

``placement_cost`` is plain arithmetic, so it takes scalars (the scheduler
engine, one host at a time) or numpy arrays (the simulator, every
candidate at once) alike.
"""

import dataclasses

from nova_gpu.core import fragmentation
from nova_gpu.core import host as host_mod


@dataclasses.dataclass(frozen=True)
class CostWeights:
    fragmentation: float = 1.0
    pack: float = 0.05
    strand: float = 0.0


DEFAULT_WEIGHTS = CostWeights()


def placement_cost(weights, frag_delta, gpu_free_after, cpu_free_after,
                   cpu_total, mem_free_after, mem_total):
    """Cost of a placement; milli quantities in, GPUs out.

    ``frag_delta``: growth of expected fragmentation (milli);
    ``gpu_free_after``: the host's free GPU milli after the placement;
    CPU and memory: free after the placement, and the host's totals.
    """
    cost = weights.fragmentation * frag_delta / host_mod.MILLI
    if weights.pack:
        cost = cost + weights.pack * gpu_free_after / host_mod.MILLI
    if weights.strand:
        cpu_share = cpu_free_after / cpu_total
        mem_share = mem_free_after / mem_total
        low = cpu_share * (cpu_share < mem_share) + mem_share * (
            cpu_share >= mem_share)
        cost = cost + weights.strand * (gpu_free_after / host_mod.MILLI) * (
            1.0 - low)
    return cost


def host_placement_cost(host, placement, demand, weights=DEFAULT_WEIGHTS):
    """``placement_cost`` of ``placement`` on ``host`` (a core Host)."""
    before = fragmentation.host_fragmentation(host, demand)
    host.allocate(placement)
    try:
        after = fragmentation.host_fragmentation(host, demand)
        gpu_free = sum(g.free_milli for g in host.gpus)
        cpu_free, mem_free = host.cpu_free, host.memory_free
    finally:
        host.free(placement)
    return placement_cost(weights, after - before, gpu_free, cpu_free,
                          max(host.cpu_milli, 1), mem_free,
                          max(host.memory_mib, 1))
