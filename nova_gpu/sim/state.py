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
        cnt = ok.sum(1)
        lost = (left[:, :, None] * ~ok).sum(1)
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
        self.changes += 1
        self.changed[node] = self.changes
        row = self.left[node:node + 1]
        self.ranked[node] = -np.sort(-row[0])
        total = self.total[node:node + 1]
        total[0] = row.sum()
        for entry in self.demands.values():
            demand, cnt, lost, frag = entry
            c, lo = self._counters(row, demand.thresholds)
            cnt[node] = c[0]
            lost[node] = lo[0]
            frag[node] = frag_of(demand, self.model[node:node + 1],
                                 self.cpu[node:node + 1],
                                 self.mem[node:node + 1], total, c, lo)[0]

    # -- queries ----------------------------------------------------------

    def feasible(self, cpu, mem, num, milli, access):
        """Boolean mask of nodes that can take the task now."""
        ok = (self.cpu >= cpu) & (self.mem >= mem)
        if num:
            ok &= access[self.model]
            ok &= self.enough_gpus(num, milli)
        return ok

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
    return (f * demand.weight).sum(1)


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
