"""NVSwitch GPU partitions: which GPU sets a passthrough guest may get.

On an HGX board in Fabric Manager's *Shared NVSwitch* virtualization
model a guest may only be given GPUs that form one of the partitions
Fabric Manager predefines, and only while no other active partition
holds one of them (Fabric Manager refuses overlapping activations with
``FM_ST_IN_USE``). A partition whose NVLinks failed is *unsupported*
(``fmGetUnsupportedFabricPartitions``) and is never given out. In the
*full passthrough* model the NVSwitches go with the GPUs and the host
reports no partitions: nothing here applies.

This module is the one rule, for the engine (which GPU sets are
feasible, which one is best), the fragmentation measure (a typical
multi-GPU request fits only where a free partition of its size is left)
and the agent (which partition to activate for a guest's GPUs).
"""

import functools
import os
import typing

import yaml

from nova_gpu.core import exceptions
from nova_gpu.core import host as host_mod

# Fabric Manager's FM_MAX_FABRIC_PARTITIONS.
MAX_PARTITIONS = 64

DEFAULT_TABLES = os.path.join(os.path.dirname(__file__), 'data',
                              'nvswitch_partitions.yaml')

# Topology penalty per free partition larger than the request that a
# choice breaks: as much as spanning one more NUMA node (topology.penalty).
LOST_LARGER = 0.1


class Partition(typing.NamedTuple):
    """One Fabric Manager partition, its GPUs by host GPU index."""

    id: int
    gpus: frozenset
    supported: bool = True
    active: bool = False


class PartitionTable:
    """A host's partitions, checked: the state Fabric Manager reported.

    ``partitions`` may be empty: the host is in Shared NVSwitch mode and
    no partition is usable (Fabric Manager listed none).
    """

    __slots__ = ('partitions', 'by_set', 'blocked', '_by_size')

    def __init__(self, partitions, gpu_count=None):
        parts = tuple(sorted(
            (Partition(p.id, frozenset(p.gpus), bool(p.supported),
                       bool(p.active)) for p in partitions),
            key=lambda p: p.id))
        validate(parts, gpu_count)
        self.partitions = parts
        # GPUs held by an active partition: no other partition holding
        # one of them can be activated.
        self.blocked = frozenset().union(*(p.gpus for p in parts
                                           if p.active))
        by_set = {}
        for p in parts:
            if p.supported and not p.active and not p.gpus & self.blocked:
                by_set.setdefault(p.gpus, p)
        self.by_set = by_set
        by_size = {}
        for gpus, p in by_set.items():
            by_size.setdefault(len(gpus), []).append(p)
        self._by_size = by_size

    def __eq__(self, other):
        return (isinstance(other, PartitionTable)
                and self.partitions == other.partitions)

    def __hash__(self):
        return hash(self.partitions)

    def __repr__(self):
        return 'PartitionTable(%r)' % (self.partitions,)

    def available(self, count):
        """Partitions of ``count`` GPUs that Fabric Manager could activate
        now (supported, inactive, no GPU in an active partition), lowest
        ID first; whether their GPUs are free is the host's to say.
        """
        return self._by_size.get(count, ())

    def partition_for(self, gpu_indices):
        """The partition to activate for exactly ``gpu_indices``, or None."""
        return self.by_set.get(frozenset(gpu_indices))

    def find(self, gpu_indices):
        """The partition of exactly ``gpu_indices`` in any state, or None
        (the agent's view: which partition a guest's GPUs form).
        """
        gpus = frozenset(gpu_indices)
        for p in self.partitions:
            if p.gpus == gpus:
                return p
        return None


def validate(partitions, gpu_count=None):
    """Raise InvalidRequest naming what is wrong with ``partitions``."""
    if len(partitions) > MAX_PARTITIONS:
        raise exceptions.InvalidRequest(
            'more than %d NVSwitch partitions' % MAX_PARTITIONS)
    seen = set()
    active = []
    for p in partitions:
        if p.id in seen:
            raise exceptions.InvalidRequest(
                'NVSwitch partition %d listed twice' % p.id)
        seen.add(p.id)
        if not p.gpus:
            raise exceptions.InvalidRequest(
                'NVSwitch partition %d has no GPUs' % p.id)
        if gpu_count is not None:
            bad = sorted(g for g in p.gpus if not 0 <= g < gpu_count)
            if bad:
                raise exceptions.InvalidRequest(
                    'NVSwitch partition %d names GPU %s: the host has GPUs '
                    '0..%d' % (p.id, bad[0], gpu_count - 1))
        if p.active:
            for q in active:
                if q.gpus & p.gpus:
                    raise exceptions.InvalidRequest(
                        'NVSwitch partitions %d and %d are both active and '
                        'share GPU %d' % (q.id, p.id,
                                          min(q.gpus & p.gpus)))
            active.append(p)


def applies(host, req):
    """The partition rule binds ``req`` on ``host``: whole GPUs on a host
    in Shared NVSwitch mode (a host that reports partitions).
    """
    return host.partitions is not None and req.kind == host_mod.WHOLE


def some_partition_fits(host, count, fits):
    """An activatable partition of ``count`` GPUs is left whose every GPU
    ``fits`` (a ``gpu -> bool``, or a set of GPU indices).
    """
    gpus = host.gpus
    for p in host.partitions.available(count):
        if isinstance(fits, (set, frozenset)):
            if p.gpus <= fits:
                return True
        elif all(fits(gpus[i]) for i in p.gpus):
            return True
    return False


def feasible(host, gpu_indices):
    """``gpu_indices`` form a partition Fabric Manager could activate now
    (the GPUs' own state, free or not, is the fit rule's to say).
    """
    return host.partitions.partition_for(gpu_indices) is not None


def candidate_sets(host, count, allowed):
    """GPU index tuples of every activatable partition of ``count`` GPUs
    all of which are in ``allowed`` (the GPUs that can take a device).
    """
    return [tuple(sorted(p.gpus))
            for p in host.partitions.available(count)
            if p.gpus <= allowed]


def lost_larger(host, gpu_indices, allowed):
    """How many activatable partitions larger than ``gpu_indices``, every
    GPU of which is in ``allowed``, a choice of ``gpu_indices`` breaks.

    Taking a pair inside a free 4-GPU partition when another pair is
    left in a 4-GPU partition already broken loses a 4-GPU partition for
    nothing: the best choice keeps the most larger partitions free.
    """
    chosen = frozenset(gpu_indices)
    lost = 0
    for gpus in host.partitions.by_set:
        if (len(gpus) > len(chosen) and gpus & chosen
                and gpus <= allowed):
            lost += 1
    return lost


def why_not(host, count):
    """A sentence for a whole-GPU request no partition can take."""
    table = host.partitions
    sizes = sorted({len(p.gpus) for p in table.partitions if p.supported})
    if count not in sizes:
        return ('no NVSwitch partition of %d GPUs (Shared NVSwitch mode; '
                'partition sizes: %s)'
                % (count, ', '.join(map(str, sizes)) or 'none'))
    return ('no free NVSwitch partition of %d GPUs (Shared NVSwitch mode)'
            % count)


# -- published tables -------------------------------------------------------


@functools.lru_cache(maxsize=8)
def _tables(path):
    with open(path, encoding='utf-8') as f:
        doc = yaml.safe_load(f)
    if not isinstance(doc, dict) or doc.get('schema_version') != 1:
        raise exceptions.InvalidRequest(
            '%s: schema_version must be 1' % path)
    return doc['baseboards']


def published(baseboard, path=DEFAULT_TABLES):
    """``(gpu_count, [(partition id, [physical module IDs])])`` of the
    published default table of ``baseboard`` (e.g. ``HGX-H100-8GPU``).
    """
    boards = _tables(path)
    if baseboard not in boards:
        raise exceptions.InvalidRequest(
            'no published NVSwitch partition table for %r (known: %s)'
            % (baseboard, ', '.join(sorted(boards))))
    board = boards[baseboard]
    return board['gpus'], [(p['id'], list(p['gpus']))
                           for p in board['partitions']]


def published_table(baseboard, gpu_order=None, unsupported=(), active=()):
    """A ``PartitionTable`` of ``baseboard``'s published partitions.

    ``gpu_order[i]`` is the physical module ID of host GPU ``i`` (default:
    module ``i + 1``).
    """
    count, parts = published(baseboard)
    order = list(gpu_order or range(1, count + 1))
    index = {module: i for i, module in enumerate(order)}
    return PartitionTable(
        [Partition(pid, frozenset(index[m] for m in modules),
                   pid not in unsupported, pid in active)
         for pid, modules in parts], len(order))
