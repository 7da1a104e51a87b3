"""Node and task lists in the Alibaba GPU trace format, and the workload.

The format is the one of ``cluster-trace-gpu-v2023`` (``openb_*.csv``):
nodes ``sn,cpu_milli,memory_mib,gpu,model``; tasks
``name,cpu_milli,memory_mib,num_gpu,gpu_milli[,gpu_spec,...]``. The
workload follows the FGD artifact (Weng et al., ATC 2023): every task of
the list, plus tasks drawn with replacement until the GPU request reaches
``tune`` times the cluster's GPU capacity, in an order shuffled by ``seed``.
"""

import collections
import csv
import dataclasses
import os

import numpy as np

from nova_gpu.core import exceptions
from nova_gpu.core import host as host_mod

NODE_COLUMNS = ('sn', 'cpu_milli', 'memory_mib', 'gpu', 'model')
TASK_COLUMNS = ('name', 'cpu_milli', 'memory_mib', 'num_gpu', 'gpu_milli')
# The FGD artifact's typical tasks: the most popular specs covering 95% of
# the task list, CPU-only tasks included.
TYPICAL_COVERAGE = 0.95


@dataclasses.dataclass
class Nodes:
    names: list
    cpu: np.ndarray  # milli
    memory: np.ndarray  # MiB
    gpus: np.ndarray  # GPU count
    models: list  # model name per node ('' for none)

    def __len__(self):
        return len(self.names)

    @property
    def total_gpu_milli(self):
        return int(self.gpus.sum()) * host_mod.MILLI


@dataclasses.dataclass
class Tasks:
    names: list
    cpu: np.ndarray
    memory: np.ndarray
    num_gpu: np.ndarray
    milli: np.ndarray  # per GPU; 1000 for whole GPUs, 0 for CPU-only
    spec: list  # frozenset of models, or None for any

    def __len__(self):
        return len(self.names)

    @property
    def gpu_request(self):
        return self.num_gpu * self.milli

    def take(self, index):
        index = np.asarray(index)
        return Tasks([self.names[i] for i in index], self.cpu[index],
                     self.memory[index], self.num_gpu[index],
                     self.milli[index], [self.spec[i] for i in index])


def _read(path, columns, what):
    if not os.path.isfile(path):
        raise exceptions.InvalidRequest('%s file %s does not exist'
                                        % (what, path))
    with open(path, newline='') as f:
        reader = csv.DictReader(f)
        missing = [c for c in columns if c not in (reader.fieldnames or ())]
        if missing:
            raise exceptions.InvalidRequest(
                '%s file %s lacks column(s) %s (has: %s)'
                % (what, path, ', '.join(missing),
                   ', '.join(reader.fieldnames or ())))
        return list(reader)


def _int(row, column, path, line, minimum=0):
    try:
        value = int(row[column])
    except (TypeError, ValueError):
        raise exceptions.InvalidRequest(
            '%s line %d: %s must be an integer, got %r'
            % (path, line, column, row[column])) from None
    if value < minimum:
        raise exceptions.InvalidRequest(
            '%s line %d: %s must be >= %d, got %d'
            % (path, line, column, minimum, value))
    return value


def load_nodes(path):
    """Nodes from a node list CSV; only nodes with GPUs are kept."""
    rows = _read(path, NODE_COLUMNS, 'node list')
    names, cpu, mem, gpus, models = [], [], [], [], []
    for line, row in enumerate(rows, 2):
        n = _int(row, 'gpu', path, line)
        if not n:
            continue
        if n > 8:
            raise exceptions.InvalidRequest(
                '%s line %d: at most 8 GPUs per node, got %d'
                % (path, line, n))
        if not row['model']:
            raise exceptions.InvalidRequest(
                '%s line %d: a node with GPUs needs a model' % (path, line))
        names.append(row['sn'])
        cpu.append(_int(row, 'cpu_milli', path, line))
        mem.append(_int(row, 'memory_mib', path, line))
        gpus.append(n)
        models.append(row['model'])
    if not names:
        raise exceptions.InvalidRequest('%s lists no node with GPUs' % path)
    return Nodes(names, np.array(cpu, np.int64), np.array(mem, np.int64),
                 np.array(gpus, np.int64), models)


def load_tasks(path):
    """Tasks from a task list CSV, validated."""
    rows = _read(path, TASK_COLUMNS, 'task list')
    names, cpu, mem, num, milli, spec = [], [], [], [], [], []
    for line, row in enumerate(rows, 2):
        n = _int(row, 'num_gpu', path, line)
        m = _int(row, 'gpu_milli', path, line)
        if m > host_mod.MILLI or (n > 1 and m != host_mod.MILLI):
            raise exceptions.InvalidRequest(
                '%s line %d: gpu_milli %d with num_gpu %d (a share below '
                '1000 is for one GPU only)' % (path, line, m, n))
        if bool(n) != bool(m):
            raise exceptions.InvalidRequest(
                '%s line %d: num_gpu %d and gpu_milli %d disagree'
                % (path, line, n, m))
        raw = (row.get('gpu_spec') or '').strip()
        names.append(row['name'])
        cpu.append(_int(row, 'cpu_milli', path, line))
        mem.append(_int(row, 'memory_mib', path, line))
        num.append(n)
        milli.append(m)
        spec.append(frozenset(raw.split('|')) if raw else None)
    if not names:
        raise exceptions.InvalidRequest('%s lists no task' % path)
    return Tasks(names, np.array(cpu, np.int64), np.array(mem, np.int64),
                 np.array(num, np.int64), np.array(milli, np.int64), spec)


def workload(tasks, capacity_milli, tune, seed):
    """The FGD artifact's workload: tuned to ``tune`` x capacity, shuffled.

    As its ``TunePodsByNodeTotalResource``: below the target, tasks drawn
    with replacement are appended while the next draw keeps the request
    within the target; above it, random tasks are removed. Then the order
    is shuffled. ``tune`` 0 keeps the list as it is (still shuffled).
    """
    if tune < 0:
        raise exceptions.InvalidRequest('tune must be >= 0, got %r' % tune)
    rng = np.random.default_rng(seed)
    request = tasks.gpu_request
    index = list(range(len(tasks)))
    total = int(request.sum())
    target = tune * capacity_milli
    if tune and total < target:
        draws = rng.integers(0, len(tasks), size=4 * len(tasks))
        pos = 0
        while True:
            if pos == len(draws):
                draws = rng.integers(0, len(tasks), size=len(tasks))
                pos = 0
            i = int(draws[pos])
            pos += 1
            if total + int(tasks.milli[i]) > target:
                break
            total += int(request[i])
            index.append(i)
    elif tune and total > target:
        while total > target:
            i = index.pop(int(rng.integers(0, len(index))))
            total -= int(request[i])
    order = rng.permutation(len(index))
    result = tasks.take(np.array(index)[order])
    # Drawn copies get their own names, as the artifact's "-tuned-<i>".
    original = len(tasks) if total >= request.sum() else 0
    for pos, k in enumerate(order):
        if original and k >= original:
            result.names[pos] = '%s-tuned-%d' % (result.names[pos],
                                                 k - original)
    return result


@dataclasses.dataclass(frozen=True)
class Typical:
    """A typical task spec and its probability."""

    cpu: int
    memory: int
    num_gpu: int
    milli: int
    spec: frozenset
    weight: float


def typical_tasks(tasks, coverage=TYPICAL_COVERAGE, with_memory=False):
    """The most popular task specs covering ``coverage`` of the list.

    As the FGD artifact (``GetTypicalPods``): specs are (CPU, GPU share,
    GPU count, model list); memory is part of the spec only when asked
    (our policy also keeps memory from stranding GPUs).
    """
    counts = collections.Counter()
    for i in range(len(tasks)):
        counts[(int(tasks.cpu[i]),
                int(tasks.memory[i]) if with_memory else 0,
                int(tasks.num_gpu[i]), int(tasks.milli[i]),
                tasks.spec[i])] += 1
    total = sum(counts.values())

    def order(item):
        (cpu, mem, num, milli, spec), n = item
        return (n, cpu, milli, num, sorted(spec or ()), mem)
    ranked = sorted(counts.items(), key=order, reverse=True)
    chosen, covered = [], 0
    for key, n in ranked:
        if covered >= coverage * total:
            break
        chosen.append((key, n))
        covered += n
    return [Typical(cpu, mem, num, milli, spec, n / covered)
            for (cpu, mem, num, milli, spec), n in chosen]
