"""The same demand, in the shapes Nova really offers: vGPU and MIG.

The trace's nodes keep their CPU, memory and GPU count, but their GPUs
become catalog models (8-GPU nodes: H100-80GB, others: A100-80GB). Each
GPU-sharing task asks for the smallest catalog profile whose framebuffer
covers its share of the card (rounded up):

* ``vgpu``: a time-sliced vGPU type; the card's rule that one GPU hosts
  one type at a time (``time_sliced_mixing`` false) applies.
* ``mig``: every GPU is in MIG mode; a share becomes the smallest GPU
  instance profile with enough memory slices, a whole GPU a 7g instance,
  and NVIDIA's placement rules (start slices, compute slices) apply.

Whole-GPU tasks stay whole GPUs (passthrough) in ``vgpu`` mode. Placement
runs on the core objects (``host.Host``, ``engine.PlacementEngine``'s
choices, ``fragmentation.host_fragmentation``), so every rule is the one
the scheduler and the agent enforce. This is slower than the share-only
replay, so a sample of the nodes is modelled (``--node-stride``) with the
workload tuned to that sample's capacity.
"""

import math

import numpy as np

from nova_gpu.core import catalog as catalog_mod
from nova_gpu.core import engine as engine_mod
from nova_gpu.core import exceptions
from nova_gpu.core import fragmentation
from nova_gpu.core import host as host_mod
from nova_gpu.core import request as request_mod
from nova_gpu.core import scoring
from nova_gpu.sim import trace as trace_mod

MODES = ('vgpu', 'mig')
POLICIES = ('fgd', 'nova', 'ours')
BIG_NODE_MODEL = 'H100-80GB'
SMALL_NODE_MODEL = 'A100-80GB'


def node_model(gpus):
    return BIG_NODE_MODEL if gpus >= 8 else SMALL_NODE_MODEL


def vgpu_profile(model, milli):
    """Smallest time-sliced vGPU type covering ``milli`` of the card."""
    need = milli * model.framebuffer_mib / host_mod.MILLI
    fits = [p for p in model.vgpu_profiles.values()
            if not p.mig_backed and p.framebuffer_mib >= need]
    if not fits:
        raise exceptions.InvalidRequest('%s has no vGPU type of %d MiB'
                                        % (model.name, need))
    return min(fits, key=lambda p: (p.framebuffer_mib, p.name)).name


def mig_profile(model, milli):
    """Smallest MIG profile whose memory slices cover ``milli``."""
    spec = model.mig
    need = math.ceil(milli * spec.memory_slices / host_mod.MILLI)
    fits = [p for p in spec.profiles.values()
            if p.memory_slices >= need and not p.name.endswith('+me')]
    return min(fits, key=lambda p: (p.memory_slices, p.compute_slices,
                                    p.name)).name


def to_request(model, mode, cpu, mem, num, milli):
    """The GpuRequest a trace task becomes on ``model``; None: CPU only."""
    if not num:
        return None
    if mode == 'mig':
        name = mig_profile(model, milli)
        return request_mod.GpuRequest(host_mod.MIG, profile=name, count=num,
                                      cpu_milli=cpu, memory_mib=mem)
    if milli >= host_mod.MILLI:
        return request_mod.GpuRequest(host_mod.WHOLE, count=num,
                                      cpu_milli=cpu, memory_mib=mem)
    return request_mod.GpuRequest(host_mod.VGPU,
                                  profile=vgpu_profile(model, milli),
                                  cpu_milli=cpu, memory_mib=mem)


def build_hosts(nodes, mode, catalog):
    hosts = []
    for i in range(len(nodes)):
        model = catalog.model(node_model(int(nodes.gpus[i])))
        gpus = [host_mod.Gpu(g, model, mig_enabled=(mode == 'mig'))
                for g in range(int(nodes.gpus[i]))]
        hosts.append(host_mod.Host(nodes.names[i], gpus,
                                   int(nodes.cpu[i]), int(nodes.memory[i])))
    return hosts


def demands(typical, mode, catalog, memory):
    """Per model, the typical tasks as core requests."""
    out = {}
    for name in (BIG_NODE_MODEL, SMALL_NODE_MODEL):
        model = catalog.model(name)
        items = [fragmentation.DemandItem(
            to_request(model, mode, t.cpu, t.memory if memory else 0,
                       t.num_gpu, t.milli), t.weight) for t in typical]
        out[name] = fragmentation.Demand(items)
    return out


class Replay:
    """One policy over one workload on core hosts."""

    def __init__(self, nodes, mode, policy, typical_fgd, typical_mem,
                 catalog=None, weights=None):
        if mode not in MODES:
            raise exceptions.InvalidRequest('unknown mode %r (known: %s)'
                                            % (mode, ', '.join(MODES)))
        if policy not in POLICIES:
            raise exceptions.InvalidRequest(
                'unknown policy %r for %s mode (known: %s)'
                % (policy, mode, ', '.join(POLICIES)))
        self.catalog = catalog or catalog_mod.load_catalog()
        self.mode = mode
        self.policy = policy
        self.hosts = build_hosts(nodes, mode, self.catalog)
        self.models = [h.gpus[0].model for h in self.hosts]
        self.weights = weights or scoring.DEFAULT_WEIGHTS
        # FGD's typical tasks for both; ours adds memory via stranding.
        self.demand = demands(typical_fgd, mode, self.catalog, memory=False)
        self.strand = scoring.StrandModel.from_typical(
            [(t.cpu, t.memory, t.num_gpu * t.milli, t.weight)
             for t in typical_mem])
        self.engine = engine_mod.PlacementEngine()
        self.capacity = sum(len(h.gpus) for h in self.hosts) * host_mod.MILLI
        self._cache = [dict() for _ in self.hosts]
        self._frag = [None] * len(self.hosts)

    def used(self):
        return sum(host_mod.MILLI - g.free_milli
                   for h in self.hosts for g in h.gpus)

    def _base(self, i):
        if self._frag[i] is None:
            self._frag[i] = fragmentation.host_fragmentation(
                self.hosts[i], self.demand[self.models[i].name])
        return self._frag[i]

    def _best_on(self, i, key, task):
        """(score tuple, placement) of the best choice on host i, or None."""
        cache = self._cache[i]
        if key in cache:
            return cache[key]
        host = self.hosts[i]
        cpu, mem, num, milli = task
        req = to_request(self.models[i], self.mode, cpu, mem, num, milli)
        if req is None:
            if cpu > host.cpu_free or mem > host.memory_free:
                best = None
            else:
                best = (self._cost(i, None, cpu, mem),
                        host_mod.Assignment(host.name, (), None, cpu, mem))
        else:
            best = None
            for placement in self._choices(host, req):
                cost = self._cost(i, placement, cpu, mem)
                if best is None or cost < best[0]:
                    best = (cost, placement)
        cache[key] = best
        return best

    def _choices(self, host, req):
        choices = self.engine.choices(host, req)
        # Stock Nova takes the first candidate in GPU (provider) order.
        return sorted(choices, key=lambda p: [(s.gpu, str(s.detail))
                                              for s in p.slots])

    def _cost(self, i, placement, cpu, mem):
        host = self.hosts[i]
        if self.policy == 'nova':
            return (0,)  # the first choice; hosts are weighed apart
        placement = placement or host_mod.Assignment(host.name, (), None,
                                                     cpu, mem)
        effect = scoring.placement_effect(
            host, placement, self.demand[self.models[i].name],
            before=self._base(i))
        delta = effect.frag_delta
        if self.policy == 'fgd':
            score = int(100.0 / (1.0 + math.exp(delta / 1000.0)))
            return (-score,)
        return (scoring.placement_cost(
            self.weights, self.strand, delta, effect.gpu_free_before,
            effect.gpu_free_after, host.cpu_free, host.cpu_free - cpu,
            host.memory_free, host.memory_free - mem, effect.unit_free, 0.0,
            effect.unit_free_after),)

    def place(self, task):
        """Place one task; returns (host index, placement) or None."""
        key = task
        best, where = None, None
        if self.policy == 'nova':
            fits = [i for i in range(len(self.hosts))
                    if self._best_on(i, key, task) is not None]
            if not fits:
                return None
            ram = np.array([self.hosts[i].memory_free for i in fits], float)
            cpu = np.array([self.hosts[i].cpu_free for i in fits], float)
            weight = _norm(ram) + _norm(cpu)
            where = fits[int(np.argmax(weight))]
            best = self._best_on(where, key, task)
        else:
            for i in range(len(self.hosts)):
                cand = self._best_on(i, key, task)
                if cand is not None and (best is None or cand[0] < best[0]):
                    best, where = cand, i
            if best is None:
                return None
        placement = best[1]
        self.hosts[where].allocate(placement)
        self._cache[where].clear()
        self._frag[where] = None
        return where, placement


def _norm(values):
    lo, hi = values.min(), values.max()
    return np.zeros(len(values)) if hi == lo else (values - lo) / (hi - lo)


def replay(nodes, tasks, mode, policy, typical_source, stride=1):
    """Replay ``tasks`` in ``mode``.

    Returns (capacity, arrived, requested, allocated): per task, the GPU
    request arrived so far, the request placed so far (what tasks asked,
    in milli) and the capacity allocated (profiles rounded up).
    """
    if stride > 1:
        nodes = trace_mod.Nodes(nodes.names[::stride], nodes.cpu[::stride],
                                nodes.memory[::stride], nodes.gpus[::stride],
                                nodes.models[::stride])
    run = Replay(nodes, mode, policy, trace_mod.typical_tasks(typical_source),
                 trace_mod.typical_tasks(typical_source, with_memory=True))
    arrived, requested, allocated = [], [], []
    total = placed = 0
    for i in range(len(tasks)):
        task = (int(tasks.cpu[i]), int(tasks.memory[i]),
                int(tasks.num_gpu[i]), int(tasks.milli[i]))
        if run.place(task) is not None:
            placed += task[2] * task[3]
        total += task[2] * task[3]
        arrived.append(total)
        requested.append(placed)
        allocated.append(run.used())
    return (run.capacity, np.array(arrived), np.array(requested),
            np.array(allocated))
