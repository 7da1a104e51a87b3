"""The modelled cluster's allocation state, as numpy arrays.

One row per node: free CPU, free memory and the free milli of each GPU
(at most 8; absent GPUs read 0). Beside it, per typical-task threshold
``u`` (a distinct per-GPU share of the demand), how many GPUs can take
``u`` and how much free capacity sits on GPUs that cannot: from these the
expected fragmentation of a node, or of a node after a candidate
placement, is a handful of vector operations (``frag``). This is the same
measure as ``nova_gpu.core.fragmentation.host_fragmentation`` (a unit test
checks both on random states), computed for many nodes at once: the
simulator's named fast path of the core's rule, for share and whole-GPU
tasks (the vGPU and MIG modes, ``nova_modes``, use the core itself).
"""

import bisect
import itertools

import numpy as np

from nova_gpu.core import exceptions
from nova_gpu.core import host as host_mod

MAX_GPUS = 8


class DemandArrays:
    """The demand (``core.fragmentation.Demand``) as arrays.

    Typical tasks for the vectorised fast path of the same measure;
    ``memory`` False ignores memory (FGD).
    """

    def __init__(self, typical, models, memory=True):
        self.items = list(typical)
        self.cpu = np.array([t.cpu for t in typical], np.int64)
        self.mem = np.array([t.memory if memory else 0 for t in typical],
                            np.int64)
        self.num = np.array([t.num_gpu for t in typical], np.int64)
        self.gpu = np.array([t.milli > 0 for t in typical])
        self.weight = np.array([t.weight for t in typical], np.float64)
        thresholds = sorted({t.milli for t in typical if t.milli} |
                            {host_mod.MILLI})
        self.thresholds = np.array(thresholds, np.int64)
        self.uidx = np.array([thresholds.index(t.milli) if t.milli else 0
                              for t in typical], np.int64)
        # access[model_index, m]: may typical task m use this model?
        self.access = np.array(
            [[t.spec is None or model in t.spec for t in typical]
             for model in models], dtype=bool).reshape(len(models),
                                                       len(typical))
        # What ``frag_of`` asks per node, the constant parts once.
        self.usable = self.access & self.gpu[None, :]
        self.sized = bool(self.mem.any())
        # The same for ``frag_one``, as Python numbers: per model index,
        # per typical task (in order) its weight, whether the model serves
        # it, CPU, memory (None when not ``sized``), GPU count and
        # threshold index.
        self.threshold_list = thresholds
        self.per_model = [
            [(float(self.weight[m]), bool(row[m]), int(self.cpu[m]),
              int(self.mem[m]) if self.sized else None, int(self.num[m]),
              int(self.uidx[m])) for m in range(len(typical))]
            for row in self.usable]


class Cluster:
    """Allocation state of the modelled cluster."""

    def __init__(self, nodes, demand=None):
        self.nodes = nodes
        n = len(nodes)
        self.model_names = sorted(set(nodes.models))
        self.model = np.array([self.model_names.index(m)
                               for m in nodes.models], np.int64)
        self.ngpu = nodes.gpus.copy()
        self.cpu = nodes.cpu.copy()
        self.mem = nodes.memory.copy()
        self.left = np.zeros((n, MAX_GPUS), np.int64)
        for i, count in enumerate(nodes.gpus):
            self.left[i, :count] = host_mod.MILLI
        self.capacity = nodes.total_gpu_milli
        self.used = 0
        # Per node, the count of state changes when it last changed: the
        # policies keep per-node results until their node changes.
        self.changes = 0
        self.changed = np.zeros(n, np.int64)
        self.demands = {}
        self.recount()
        if demand is not None:
            self.track(demand)

    def recount(self):
        """Derive the per-node summaries from ``left``, ``cpu``, ``mem``.

        ``allocate`` keeps them; call this after writing the state arrays
        directly (tests building random states do).
        """
        # Free milli per GPU, largest first: ``ranked[:, k - 1] >= milli``
        # says k GPUs can take ``milli`` (a sum over a row of 8 for every
        # node costs ten times more, on every task).
        self.ranked = -np.sort(-self.left, 1)
        self.total = self.left.sum(1)
        self.changes += 1
        self.changed[:] = self.changes
        for entry in self.demands.values():
            demand = entry[0]
            cnt, lost = self._counters(self.left, demand.thresholds)
            entry[1:] = [cnt, lost, frag_of(demand, self.model, self.cpu,
                                            self.mem, self.total, cnt,
                                            lost)]

    def track(self, demand):
        """Keep per-threshold counters and node fragmentation for demand."""
        key = id(demand)
        if key not in self.demands:
            cnt, lost = self._counters(self.left, demand.thresholds)
            frag = frag_of(demand, self.model, self.cpu, self.mem,
                           self.total, cnt, lost)
            self.demands[key] = [demand, cnt, lost, frag]
        return self.demands[key]

    @staticmethod
    def _counters(left, thresholds):
        ok = left[:, :, None] >= thresholds[None, None, :]
        # ``np.add.reduce``: ``ndarray.sum`` without its Python wrapper
        # (these run on every placement).
        cnt = np.add.reduce(ok, 1)
        lost = np.add.reduce(left[:, :, None] * ~ok, 1)
        return cnt, lost

    # -- state changes ----------------------------------------------------

    def allocate(self, node, cpu, mem, gpus, milli):
        """Charge a task to ``node``: ``milli`` on each GPU of ``gpus``."""
        if cpu > self.cpu[node] or mem > self.mem[node]:
            raise exceptions.AllocationError(
                '%s: not enough CPU or memory' % self.nodes.names[node])
        for g in gpus:
            if not 0 <= g < self.ngpu[node] or self.left[node, g] < milli:
                raise exceptions.AllocationError(
                    '%s: GPU %d cannot take %d milli'
                    % (self.nodes.names[node], g, milli))
        self.cpu[node] -= cpu
        self.mem[node] -= mem
        for g in gpus:
            self.left[node, g] -= milli
        self.used += milli * len(gpus)
        self._refresh(node)

    def _refresh(self, node):
        # One node: Python numbers (``counters_one``, ``frag_one``) cost a
        # fifth of numpy's per-call overhead on rows of 8 and 12.
        self.changes += 1
        self.changed[node] = self.changes
        row = self.left[node].tolist()
        self.ranked[node] = sorted(row, reverse=True)
        total = sum(row)
        self.total[node] = total
        model, cpu, mem = (int(self.model[node]), int(self.cpu[node]),
                           int(self.mem[node]))
        for entry in self.demands.values():
            demand, cnt, lost, frag = entry
            c, lo = counters_one(row, demand.threshold_list)
            cnt[node] = c
            lost[node] = lo
            frag[node] = frag_one(demand, model, cpu, mem, total, c, lo)

    # -- queries ----------------------------------------------------------

    def feasible(self, cpu, mem, num, milli, access):
        """Boolean mask of nodes that can take the task now."""
        ok = (self.cpu >= cpu) & (self.mem >= mem)
        if num:
            ok &= access[self.model]
            ok &= self.enough_gpus(num, milli)
        return ok

    def fits(self, node, cpu, mem, num, milli, access):
        """Can ``node`` take the task now?

        ``feasible`` for one node; ``access`` None: no model rule.
        """
        if cpu > self.cpu[node] or mem > self.mem[node]:
            return False
        return not num or bool(num <= MAX_GPUS
                               and (access is None
                                    or access[self.model[node]])
                               and self.ranked[node, num - 1] >= milli)

    def enough_gpus(self, num, milli, nodes=slice(None)):
        """Per node (of ``nodes``): ``num`` GPUs have ``milli`` free."""
        if num > MAX_GPUS:
            return np.zeros(len(self.ranked[nodes]), bool)
        return self.ranked[nodes, num - 1] >= milli


def frag_of(demand, model, cpu, mem, total, cnt, lost):
    """Expected fragmentation (milli) of K node states, vectorised.

    For each typical task m: if it fits the state (model allowed, CPU and
    memory free, enough GPUs with its share free), the free capacity on
    GPUs it cannot use is fragment; otherwise all free capacity is.
    """
    ok = demand.usable[model]
    ok &= cpu[:, None] >= demand.cpu
    if demand.sized:
        ok &= mem[:, None] >= demand.mem
    uidx = demand.uidx
    ok &= cnt[:, uidx] >= demand.num
    f = np.where(ok, lost[:, uidx], total[:, None])
    # Row by row (numpy sums each contiguous row alike), not ``@``: a
    # matrix product may round a row differently with the rows around it,
    # and a node's value must not depend on which nodes are scored with it
    # (``policies.BestPerNode`` keeps it while the node is unchanged).
    return np.add.reduce(f * demand.weight, 1)


def counters_one(row, thresholds):
    """``Cluster._counters`` of one node's free GPU milli (Python lists):
    per threshold, the GPUs that can take it and the milli on the others.
    """
    ascending = sorted(row)
    below = list(itertools.accumulate(ascending, initial=0))
    cnt, lost = [], []
    for u in thresholds:
        k = bisect.bisect_left(ascending, u)  # GPUs with less than u free
        cnt.append(len(ascending) - k)
        lost.append(below[k])
    return cnt, lost


def frag_one(demand, model, cpu, mem, total, cnt, lost):
    """``frag_of`` of one node state, in Python numbers.

    The same terms in the same order, summed as numpy sums a row
    (``pairwise_sum``), so the value is ``frag_of``'s to the last bit: a
    fragmentation change computed from both must be exactly 0 when the
    state did not change (FGD's integer score turns -1e-13 into a point).
    """
    terms = []
    for weight, usable, need_cpu, need_mem, num, u in demand.per_model[model]:
        if (usable and cpu >= need_cpu and cnt[u] >= num
                and (need_mem is None or mem >= need_mem)):
            terms.append(lost[u] * weight)
        else:
            terms.append(total * weight)
    return pairwise_sum(terms)


def pairwise_sum(values):
    """Sum of floats in numpy's order for a contiguous row (its
    ``pairwise_sum``: eight running sums, combined pairwise, then the rest;
    halves above 128 values). A unit test holds it to ``np.add.reduce``.
    """
    n = len(values)
    if n < 8:
        result = 0.0
        for v in values:
            result += v
        return result
    if n > _PAIRWISE_BLOCK:
        half = n // 2
        half -= half % 8
        return pairwise_sum(values[:half]) + pairwise_sum(values[half:])
    r = values[:8]
    end = n - n % 8
    for i in range(8, end, 8):
        for j in range(8):
            r[j] += values[i + j]
    result = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]))
    for i in range(end, n):
        result += values[i]
    return result


_PAIRWISE_BLOCK = 128


def first_of_value(left):
    """Mask of GPUs that are the first on their node with their free value.

    Placing a share on either of two GPUs with the same free capacity
    yields the same node state, so only the first needs scoring.
    """
    same = left[:, :, None] == left[:, None, :]
    same &= _EARLIER
    return ~same.any(2)


# _EARLIER[0, i, j]: GPU j comes before GPU i.
_EARLIER = np.tril(np.ones((MAX_GPUS, MAX_GPUS), bool), -1)[None]
