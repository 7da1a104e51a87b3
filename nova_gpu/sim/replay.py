"""Replay a workload on the modelled cluster with one policy.

Tasks arrive one by one and never leave; each is placed once or fails.
After each task the allocated GPU capacity is recorded against the GPU
request arrived so far; ``ReplayResult.curve`` reads the allocation ratio at
every 1% of arrived request the way the FGD artifact does
(``merge_alloc_discrete``: the mean over the tasks whose arrived request
rounds to that percentage).
"""

import csv
import dataclasses
import time

import numpy as np

from nova_gpu.core import exceptions
from nova_gpu.core import host as host_mod
from nova_gpu.sim import policies as policies_mod
from nova_gpu.sim import state as state_mod
from nova_gpu.sim import trace as trace_mod

PLACEMENT_COLUMNS = ('task', 'node', 'gpus', 'taken', 'cpu_milli',
                     'memory_mib', 'reason')


@dataclasses.dataclass
class ReplayResult:
    policy: str
    capacity: int  # GPU milli of the cluster
    arrived: np.ndarray  # cumulative GPU request after each task
    used: np.ndarray  # allocated GPU milli after each task
    decisions: list  # (node index or -1, gpus, reason)
    tasks: object
    nodes: object
    seconds: float  # wall clock
    cpu_seconds: float = 0.0  # this process's CPU time (load-independent)

    def curve(self, upto=130):
        """{percent arrived: allocation ratio %}, as the FGD artifact."""
        arrived = np.round(self.arrived * 100.0 / self.capacity)
        ratio = np.round(self.used * 100.0 / self.capacity, 2)
        out = {}
        for k in range(upto + 1):
            sel = arrived == k
            if not sel.any():
                sel = (arrived >= k - 1) & (arrived <= k + 1)
                if not sel.any():
                    continue
            out[k] = round(float(ratio[sel].mean()), 2)
        return out

    @property
    def failed(self):
        return sum(1 for d in self.decisions if d[0] < 0)

    def write_placements(self, path):
        """Every decision as CSV, for audit (see ``audit``)."""
        with open(path, 'w', newline='') as f:
            out = csv.writer(f)
            out.writerow(PLACEMENT_COLUMNS)
            t = self.tasks
            for i, (node, gpus, reason) in enumerate(self.decisions):
                milli = int(t.milli[i])
                out.writerow((
                    t.names[i],
                    self.nodes.names[node] if node >= 0 else '',
                    ' '.join(str(g) for g in gpus),
                    ' '.join(str(milli) for _ in gpus),
                    int(t.cpu[i]), int(t.memory[i]), reason))


def spec_access(cluster, spec, cache):
    """Boolean per model index: may a task with ``spec`` use it?"""
    acc = cache.get(spec)
    if acc is None:
        acc = cache[spec] = np.array(
            [spec is None or m in spec for m in cluster.model_names])
    return acc


def why_not(cluster, task, access):
    cpu, mem, num, milli = task[:4]
    parts = []
    n_cpu = int((cluster.cpu >= cpu).sum())
    n_mem = int((cluster.mem >= mem).sum())
    parts.append('%d nodes have %d CPU milli free' % (n_cpu, cpu))
    parts.append('%d have %d MiB free' % (n_mem, mem))
    if num:
        gpu_ok = access[cluster.model] & cluster.enough_gpus(num, milli)
        parts.append('%d have %d GPU(s) with %d milli free of an allowed '
                     'model' % (int(gpu_ok.sum()), num, milli))
    return 'no node fits: ' + ', '.join(parts)


def replay(nodes, tasks, policy, seed=0, typical_source=None):
    """Place ``tasks`` (in order) on ``nodes`` with ``policy``.

    ``typical_source`` is the task list typical tasks are drawn from (the
    original list, before tuning); defaults to ``tasks``.
    """
    if isinstance(policy, str):
        policy = policies_mod.make(policy)
    source = typical_source if typical_source is not None else tasks
    cluster = state_mod.Cluster(nodes)
    policy.setup(cluster, trace_mod.typical_tasks(source),
                 trace_mod.typical_tasks(source, with_memory=True))
    rng = np.random.default_rng(seed)
    n = len(tasks)
    arrived = np.cumsum(tasks.gpu_request)
    used = np.zeros(n, np.int64)
    decisions = []
    cache = {}
    cpu_l, mem_l = tasks.cpu.tolist(), tasks.memory.tolist()
    num_l, milli_l = tasks.num_gpu.tolist(), tasks.milli.tolist()
    start = time.perf_counter()
    start_cpu = time.process_time()
    for i in range(n):
        task = (cpu_l[i], mem_l[i], num_l[i], milli_l[i])
        access = spec_access(cluster, tasks.spec[i], cache)
        placed = policy.place(cluster, task, access, rng)
        if placed is None:
            decisions.append((-1, (), why_not(cluster, task, access)))
        else:
            node, gpus = placed
            if not cluster.fits(node, task[0], task[1], task[2], task[3],
                                access):
                raise exceptions.AllocationError(
                    'policy %s chose infeasible node %s'
                    % (policy.name, nodes.names[node]))
            cluster.allocate(node, task[0], task[1], gpus, task[3])
            decisions.append((node, gpus, ''))
        used[i] = cluster.used
    return ReplayResult(policy.name, cluster.capacity, arrived, used,
                        decisions, tasks, nodes, time.perf_counter() - start,
                        time.process_time() - start_cpu)


def audit(nodes, tasks_by_name, path):
    """Check a placements CSV is a valid packing; returns problems found.

    No GPU over 1000 milli, no node over its CPU or memory, every task's
    GPU count, share and model list kept, whole-GPU tasks alone on their
    GPUs, and no task failed while some node could take it (work
    conservation). ``tasks_by_name`` maps a task name to (cpu, memory,
    num_gpu, milli, spec).
    """
    index = {name: i for i, name in enumerate(nodes.names)}
    cpu = nodes.cpu.astype(np.int64).copy()
    mem = nodes.memory.astype(np.int64).copy()
    left = np.zeros((len(nodes), state_mod.MAX_GPUS), np.int64)
    for i, count in enumerate(nodes.gpus):
        left[i, :count] = host_mod.MILLI
    problems = []
    with open(path, newline='') as f:
        for line, row in enumerate(csv.DictReader(f), 2):
            t = tasks_by_name.get(row['task'])
            if t is None and '-tuned-' in row['task']:
                t = tasks_by_name.get(row['task'].rsplit('-tuned-', 1)[0])
            if t is None:
                problems.append('line %d: unknown task %s'
                                % (line, row['task']))
                continue
            if not row['node']:
                fits = _fits_somewhere(nodes, cpu, mem, left, t)
                if fits is not None:
                    problems.append('line %d: %s failed but fits %s'
                                    % (line, row['task'], fits))
                continue
            n = index.get(row['node'])
            if n is None:
                problems.append('line %d: unknown node %s'
                                % (line, row['node']))
                continue
            gpus = [int(g) for g in row['gpus'].split()]
            taken = [int(m) for m in row['taken'].split()]
            tcpu, tmem, tnum, tmilli, tspec = t
            if len(gpus) != tnum or len(set(gpus)) != len(gpus) or any(
                    m != tmilli for m in taken):
                problems.append('line %d: %s got GPUs %s with %s, asked '
                                '%d x %d' % (line, row['task'], gpus, taken,
                                             tnum, tmilli))
            if tspec is not None and tnum and nodes.models[n] not in tspec:
                problems.append('line %d: %s on %s (%s) breaks gpu_spec %s'
                                % (line, row['task'], row['node'],
                                   nodes.models[n], '|'.join(sorted(tspec))))
            cpu[n] -= tcpu
            mem[n] -= tmem
            if cpu[n] < 0 or mem[n] < 0:
                problems.append('line %d: %s over-commits CPU or memory'
                                % (line, row['node']))
            for g, m in zip(gpus, taken):
                if not 0 <= g < nodes.gpus[n]:
                    problems.append('line %d: %s has no GPU %d'
                                    % (line, row['node'], g))
                    continue
                if m == host_mod.MILLI and left[n, g] != host_mod.MILLI:
                    problems.append('line %d: %s GPU %d is not free for a '
                                    'whole-GPU task' % (line, row['node'], g))
                left[n, g] -= m
                if left[n, g] < 0:
                    problems.append('line %d: %s GPU %d over-committed'
                                    % (line, row['node'], g))
    return problems


def _fits_somewhere(nodes, cpu, mem, left, task):
    tcpu, tmem, tnum, tmilli, tspec = task
    for n in range(len(nodes)):
        if cpu[n] < tcpu or mem[n] < tmem:
            continue
        if tnum and tspec is not None and nodes.models[n] not in tspec:
            continue
        if (left[n] >= tmilli).sum() >= tnum:
            return nodes.names[n]
    return None


def task_index(tasks):
    """{name: (cpu, memory, num_gpu, milli, spec)} for ``audit``."""
    return {tasks.names[i]: (int(tasks.cpu[i]), int(tasks.memory[i]),
                             int(tasks.num_gpu[i]), int(tasks.milli[i]),
                             tasks.spec[i]) for i in range(len(tasks))}
