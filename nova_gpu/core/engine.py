"""The placement engine: feasible device choices, the best one, host score.

Filter and score are separate steps, as in Nova and the Kubernetes
scheduler framework: ``choices`` says what is possible, ``rank`` orders it.
"""

import dataclasses
import typing

from nova_gpu.core import exceptions
from nova_gpu.core import fragmentation
from nova_gpu.core import host as host_mod
from nova_gpu.core import mixed_size
from nova_gpu.core import partitions
from nova_gpu.core import rdma
from nova_gpu.core import scoring
from nova_gpu.core import topology


@dataclasses.dataclass(frozen=True)
class Weights:
    """Relative weight of each part of a choice's cost (lower is better)."""

    fragmentation: float = 1.0
    topology: float = 0.25
    numa: float = 0.5


class Choice(typing.NamedTuple):
    placement: host_mod.Assignment
    frag_delta: float  # growth of expected fragmentation, in GPUs
    topology: float  # topology.penalty of the GPU set
    numa: float  # 1.0 when NUMA affinity was preferred but missed
    cost: float


class PlacementEngine:
    """Shared by the scheduler filter and weighers, the agent and the sim."""

    MEMO_LIMIT = 200000

    def __init__(self, demand=None, weights=None, scoring_weights=None,
                 rdma_scope=rdma.DEFAULT_SCOPE):
        self.demand = demand or fragmentation.Demand(())
        # Where GPU-NIC pairs are counted for requests that ask none
        # (``[gpu_scheduler] rdma_locality``): a plain request keeps the
        # pairs an RDMA request would need free where it can.
        self.rdma_scope = rdma_scope
        self.weights = weights or Weights()
        self.strand = scoring.StrandModel.from_demand(self.demand)
        weights = scoring_weights or scoring.DEFAULT_WEIGHTS
        if self.strand.cpu_per_gpu == self.strand.mem_per_gpu == float('inf'):
            # Typical requests bring no CPU or memory: nothing can strand,
            # and skipping the term saves its arithmetic on every choice.
            weights = dataclasses.replace(weights, strand=0.0)
        self.scoring_weights = weights
        self._memo = {}
        self._index = _DemandIndex(self.demand)

    # -- filter -----------------------------------------------------------

    def choices(self, host, req):
        """Every feasible placement worth considering."""
        return [c.placement for c in self.rank(host, req)]

    def why_not(self, host, req):
        """A sentence saying why ``req`` has no placement on ``host``."""
        if req.cpu_milli > host.cpu_free:
            return 'needs %d CPU milli, %d free' % (req.cpu_milli,
                                                    host.cpu_free)
        if req.memory_mib > host.memory_free:
            return 'needs %d MiB memory, %d free' % (req.memory_mib,
                                                     host.memory_free)
        if not host.gpus:
            # A host whose report lists none (all lost, or not yet bound).
            return 'no GPUs reported'
        allowed = [g for g in host.gpus if g.serves_model(req.models)]
        if not allowed:
            return 'no GPU of model %s' % ', '.join(sorted(req.models))
        what = req.profile or req.kind
        fitting = [g for g in allowed if fragmentation.unit_slots(g, req)]
        if len(fitting) < req.count:
            held = ['%s: %s' % (g.address or g.index, g.quarantine)
                    for g in allowed if g.quarantine is not None]
            return ('%d of %d GPUs can take a %s device, %d needed%s%s'
                    % (len(fitting), len(host.gpus), what, req.count,
                       '; quarantined: ' + '; '.join(held) if held else '',
                       _mixed_size_why(allowed, fitting, req)))
        if partitions.applies(host, req):
            return partitions.why_not(host, req.count)
        if rdma.applies(host, req):
            return rdma.why_not(host, req.count, req.rdma,
                                [g.index for g in fitting])
        if req.topology != 'any':
            return ('no %d GPUs satisfy topology=%s'
                    % (req.count, req.topology))
        return 'no NUMA node can hold the GPUs with the CPU and memory'

    # -- score ------------------------------------------------------------

    def rank(self, host, req):
        """Feasible choices, best (lowest cost) first."""
        keys = [g.fit_key() for g in host.gpus]
        options = self._offers(host, req, keys)
        if options is None:
            return []
        # Best-packed GPUs first: the least free capacity left over.
        ordered = sorted((host.gpus[i] for i in options),
                         key=lambda g: (g.free_milli, g.index))
        base = None
        result = []
        # Single-device choices on GPUs in the same state cost the same:
        # compute each distinct one once.
        seen = {}
        bound = partitions.applies(host, req)
        # On a Shared NVSwitch host two GPUs in one state still differ:
        # the partitions each breaks (no sharing of single choices).
        # Beside a NIC, two GPUs in one state differ too: the GPU-NIC
        # pairs each breaks.
        paired = host.pcie is not None and bool(host.pcie.nics)
        single = req.count == 1 and not bound and not paired
        if bound:
            sets = [tuple(host.gpus[i] for i in indices)
                    for indices in partitions.candidate_sets(
                        host, req.count, frozenset(options))]
        elif req.rdma is not None:
            # Only GPUs with a free NIC VF beside them, and one set that
            # fits the VFs there (core.rdma).
            usable, greedy = rdma.candidate_gpus(host, ordered, req.count,
                                                 req.rdma)
            sets = topology.candidate_sets(usable, req.count)
            if greedy is not None:
                sets.append(greedy)
        else:
            sets = topology.candidate_sets(ordered, req.count)
        for gpus in sets:
            # One device: every slot of a GPU shares the GPU's state key.
            gpu_key = keys[gpus[0].index] if single else None
            for placement, numa_miss in self._placements(host, req, gpus,
                                                         options):
                if base is None:
                    base = self._base(host, keys)
                result.append(self._choice(base, placement, gpus, numa_miss,
                                           seen, gpu_key, req))
        # Stable: among equal costs, the generation order (best-packed GPU,
        # then lowest index and start slice) decides.
        result.sort(key=_cost)
        return result

    def evaluate(self, host, req, gpu_indices):
        """The best choice on exactly the GPUs ``gpu_indices``, or None.

        For GPU sets decided elsewhere (the allocation candidates Placement
        offers); scored exactly as ``rank`` scores its own choices.
        """
        return self.evaluator(host, req)(gpu_indices)

    def evaluator(self, host, req):
        """``evaluate`` for many GPU sets of ``host`` in its current state:
        ``evaluator(host, req)(gpu_indices, on=None)``. The per-GPU work
        (fit keys, offers, the fragmentation base) is done once; ``on``
        names another host in the same state to place on (its NUMA cells
        and name), default ``host``. Valid while that state lasts.
        """
        keys = [g.fit_key() for g in host.gpus]
        options = self._offers(host, req, keys)
        base = []

        def evaluate(gpu_indices, on=None):
            if (options is None or len(gpu_indices) != req.count
                    or any(i not in options for i in gpu_indices)):
                return None
            target = on or host
            gpus = tuple(host.gpus[i] for i in gpu_indices)
            best = None
            for placement, numa_miss in self._placements(target, req, gpus,
                                                         options):
                if not base:
                    base.append(self._base(host, keys))
                choice = self._choice(base[0], placement, gpus, numa_miss,
                                      {}, None, req)
                if best is None or choice.cost < best.cost:
                    best = choice
            return best
        return evaluate

    def best(self, host, req):
        ranked = self.rank(host, req)
        if not ranked:
            raise exceptions.NoFit(host.name, self.why_not(host, req))
        return ranked[0]

    # -- internals --------------------------------------------------------

    def _base(self, host, keys):
        if len(self._memo) > self.MEMO_LIMIT:
            self._memo.clear()
        return _FragState(host, self._index, self._memo, keys)

    def _choice(self, base, placement, gpus, numa_miss, seen, gpu_key=None,
                req=None):
        """Cost a placement: the core scoring function, plus topology.

        Single-device placements on GPUs in the same state (``gpu_key``)
        cost the same; ``seen`` remembers them.
        """
        slots = placement.slots
        key = None
        if gpu_key is not None:
            slot = slots[0]
            key = (gpu_key, slot.kind, slot.detail, placement.numa_node)
            found = seen.get(key)
            if found is not None:
                return Choice(placement, *found)
        delta, free_after = base.delta(placement)
        host = base.host
        unit_free = 0
        unit_free_after = None
        if len(slots) == 1 and slots[0].kind != host_mod.WHOLE:
            gpu = host.gpus[slots[0].gpu]
            unit_free = gpu.free_milli
            if slots[0].kind == host_mod.SHARE:
                # Dead remainders are a share concept: a vGPU or MIG
                # remainder is judged by what typical profiles still fit.
                unit_free_after = base.profile(gpu, slots[0])[0]
        steps = scoring.placement_cost(
            self.scoring_weights, self.strand, delta, base.total_free,
            free_after, host.cpu_free, host.cpu_free - placement.cpu_milli,
            host.memory_free, host.memory_free - placement.memory_mib,
            unit_free, unit_free_after=unit_free_after)
        topo = topology.penalty(gpus)
        if host.partitions is not None and slots[0].kind == host_mod.WHOLE:
            # The fewer larger partitions a choice breaks, the better.
            free = frozenset(g.index for g in host.gpus
                             if g.fits_whole() and g.quarantine is None)
            topo += partitions.LOST_LARGER * partitions.lost_larger(
                host, placement.gpus, free)
        if host.pcie is not None and host.pcie.nics:
            # The fewer GPU-NIC pairs a choice breaks, the better.
            asked = req is not None and req.rdma is not None
            topo += rdma.LOST_PAIR * rdma.lost_pairs(
                host, req.rdma if asked else self.rdma_scope,
                [g.index for g in host.gpus
                 if g.fits_whole() and g.quarantine is None],
                placement.gpus, asked)
        w = self.weights
        cost = (w.fragmentation * steps * self.scoring_weights.quantum
                + w.topology * topo + w.numa * numa_miss)
        found = (delta / host_mod.MILLI, topo, numa_miss, cost)
        if key is not None:
            seen[key] = found
        return Choice(placement, *found)

    def _offers(self, host, req, keys):
        """GPU index -> slots it offers for one device of ``req``.

        None when the host cannot serve ``req`` at all.
        """
        if req.cpu_milli > host.cpu_free or req.memory_mib > host.memory_free:
            return None
        options = {}
        memo = self._memo
        for gpu, gpu_key in zip(host.gpus, keys):
            # What a GPU offers depends only on its state: memoised.
            key = (gpu_key, req)
            offers = memo.get(key)
            if offers is None:
                offers = memo[key] = tuple(
                    (s.kind, s.detail)
                    for s in fragmentation.unit_slots(gpu, req)
                    if gpu.serves_model(req.models))
            if offers:
                index = gpu.index
                options[index] = [host_mod.Slot(index, kind, detail)
                                  for kind, detail in offers]
        if len(options) < req.count:
            return None
        return options

    def _placements(self, host, req, gpus, options):
        """(placement, NUMA miss) for the GPU set ``gpus``, if allowed."""
        if not topology.satisfies(gpus, req.topology):
            return
        if partitions.applies(host, req) and not partitions.feasible(
                host, [g.index for g in gpus]):
            return
        if rdma.applies(host, req) and not rdma.pairable(
                host, [g.index for g in gpus], req.rdma):
            return
        numa_node, numa_miss = numa_fit(host, gpus, req)
        if numa_miss is None:
            return
        # Each GPU of the set may offer several slots (MIG starts);
        # one device per GPU.
        for slots in _slot_product([options[g.index] for g in gpus]):
            yield (host_mod.Assignment(host.name, slots, numa_node,
                                       req.cpu_milli, req.memory_mib),
                   numa_miss)


def _mixed_size_why(allowed, fitting, req):
    """Why the mixed-size GPUs that hold vGPUs refuse a vGPU ask, or ''."""
    if req.kind != host_mod.VGPU or not req.profile:
        return ''
    why = []
    for gpu in allowed:
        profile = gpu.model.vgpu_profiles.get(req.profile)
        if (gpu.mixed_size and gpu.vgpus and gpu not in fitting
                and profile is not None and not profile.mig_backed
                and gpu.quarantine is None):
            why.append('GPU %s: %s' % (gpu.address or gpu.index,
                                       mixed_size.why_not(
                                           gpu.model, gpu.vgpu_counts(),
                                           profile)))
    return '; ' + '; '.join(why) if why else ''


def numa_fit(host, gpus, req):
    """(NUMA cell to charge, miss penalty) of ``gpus``; (None, None) if
    ``req`` requires NUMA affinity that these GPUs cannot give.
    """
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


# Costs are compared to this many decimals: choices whose costs differ
# only in float noise (the same choice computed along two paths) are
# equally good.
COST_DIGITS = 9


def equally_good(a, b):
    """Whether the choices ``a`` and ``b`` cost the same, noise aside.

    The cost already makes near-equal choices equal where the policy sees
    no difference (fragmentation in steps of ``CostWeights.quantum``) and
    keeps apart what it prefers (best fit, ``CostWeights.tight``: a GPU
    with less free capacity left costs less), so equal costs are exactly
    the choices the policy cannot tell apart: devices of one GPU, GPUs in
    the same state, hosts in the same state.
    """
    return round(a.cost, COST_DIGITS) == round(b.cost, COST_DIGITS)


def tie_break(count, draw):
    """Which of ``count`` equally good choices to take (an index).

    ``draw`` is a random number in [0, 1) drawn for this decision alone
    (one request, one host, one scheduler). Taking the first every time
    sends every scheduler service, and every request they schedule at
    once, to the same device: all but one of their claims then fail
    (Nova claims candidate 0 of a host, and Placement refuses a device
    taken since). A draw per decision spreads them evenly, at no cost to
    the policy, which has no preference among them.
    """
    if count <= 1:
        return 0
    return min(count - 1, int(draw * count))


def _cost(choice):
    return choice.cost


def _slot_product(options):
    if len(options) == 1:
        return [(s,) for s in options[0]]
    # Multi-GPU: keep it small, the first slot of each GPU suffices
    # except for the MIG start choice, which only matters per GPU.
    return [tuple(o[0] for o in options)]


class _WeightTable(dict):
    """Sum of demand weights over a bit mask of typical requests.

    Bit ``m`` of a mask stands for typical request ``m``. Few distinct masks
    occur, so each sum is computed once and then looked up.
    """

    def __init__(self, weights):
        super().__init__()
        self.weights = weights

    def __missing__(self, mask):
        total = 0.0
        m = 0
        rest = mask
        while rest:
            if rest & 1:
                total += self.weights[m]
            rest >>= 1
            m += 1
        self[mask] = total
        return total


class _DemandIndex:
    """A demand distribution compiled for fast fragmentation arithmetic."""

    def __init__(self, demand):
        self.items = [i.request for i in demand.items]
        self.checkers = [fragmentation.fit_checker(r) if r else None
                         for r in self.items]
        self.weigh = _WeightTable([i.weight for i in demand.items])
        self.all = (1 << len(self.items)) - 1
        # Requests that need several GPUs: a GPU count decides them.
        self.multi = [(1 << m, r.count) for m, r in enumerate(self.items)
                      if r is not None and r.count > 1]
        # Those of whole GPUs: on a Shared NVSwitch host a free partition
        # of their size decides them (core.partitions).
        self.whole_multi = frozenset(
            1 << m for m, r in enumerate(self.items)
            if r is not None and r.count > 1 and r.kind == host_mod.WHOLE)
        # Requests with CPU or memory: the host's free CPU/memory decides.
        self.sized = [(1 << m, r.cpu_milli, r.memory_mib)
                      for m, r in enumerate(self.items)
                      if r is not None and (r.cpu_milli or r.memory_mib)]

    def fit_mask(self, gpu):
        mask = 0
        for m, check in enumerate(self.checkers):
            if check is not None and check(gpu):
                mask |= 1 << m
        return mask


class _FragState:
    """Expected fragmentation of a host, updated incrementally per choice.

    The engine's named fast path of ``fragmentation.host_fragmentation``
    (the rule): the same measure, from the same fit rule
    (``fragmentation.fit_checker``), kept per GPU so that a choice only
    recomputes the GPUs it touches. A property test
    (``nova_gpu/tests/unit/core/test_fragmentation.py``) holds the two equal on
    random hosts, demands and choices.

    Per GPU, what matters is its free capacity and which typical requests
    still fit it (a bit mask); both depend only on ``Gpu.fit_key()`` and
    the slot taken, so they are memoised in ``memo``, shared across hosts.
    With ``NF`` the mask of typical requests the host as a whole can still
    serve, the fragmentation is::

        sum_g free_g * W(NF & ~fits_g) + total_free * W(~NF)
    """

    def __init__(self, host, index, memo, keys):
        self.host = host
        self.index = index
        self.memo = memo
        self.per_gpu = [self.profile(g, None, k)
                        for g, k in zip(host.gpus, keys)]
        self.total_free = sum(free for free, _fits in self.per_gpu)
        self.value = self._value(self.per_gpu, 0, 0)

    def profile(self, gpu, slot=None, gpu_key=None):
        """``(free, fit mask)`` of ``gpu`` (after taking ``slot``)."""
        key = (gpu_key or gpu.fit_key(), slot and (slot.kind, slot.detail))
        found = self.memo.get(key)
        if found is None:
            if slot is not None:
                gpu.take(slot)
            try:
                found = (gpu.free_milli, self.index.fit_mask(gpu))
            finally:
                if slot is not None:
                    gpu.give_back(slot)
            self.memo[key] = found
        return found

    def _value(self, per_gpu, cpu, mem):
        index = self.index
        any_fit = 0
        total_free = 0
        for free, fits in per_gpu:
            any_fit |= fits
            total_free += free
        if not total_free:
            return 0.0
        node_fit = any_fit
        table = self.host.partitions
        for bit, count in index.multi:
            if table is not None and bit in index.whole_multi:
                if node_fit & bit and not partitions.some_partition_fits(
                        self.host, count, frozenset(
                            i for i, (_free, fits) in enumerate(per_gpu)
                            if fits & bit)):
                    node_fit &= ~bit
                continue
            if node_fit & bit:
                n = 0
                for _free, fits in per_gpu:
                    if fits & bit:
                        n += 1
                if n < count:
                    node_fit &= ~bit
        if index.sized:
            cpu_free = self.host.cpu_free - cpu
            mem_free = self.host.memory_free - mem
            for bit, need_cpu, need_mem in index.sized:
                if need_cpu > cpu_free or need_mem > mem_free:
                    node_fit &= ~bit
        weigh = index.weigh
        value = total_free * weigh[index.all & ~node_fit]
        for free, fits in per_gpu:
            if free:
                value += free * weigh[node_fit & ~fits]
        return value

    def delta(self, placement):
        """(growth of fragmentation, total free GPU milli) after
        ``placement``.
        """
        gpus = self.host.gpus
        per_gpu = list(self.per_gpu)
        free_after = self.total_free
        for slot in placement.slots:
            old_free = per_gpu[slot.gpu][0]
            per_gpu[slot.gpu] = self.profile(gpus[slot.gpu], slot)
            free_after += per_gpu[slot.gpu][0] - old_free
        if not self.index.items:
            return 0.0, free_after
        return (self._value(per_gpu, placement.cpu_milli,
                            placement.memory_mib) - self.value, free_after)
