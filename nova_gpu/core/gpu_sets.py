"""Set traits: how an N-device request stays a small Placement query.

A flavor asking N devices on N distinct GPUs is N Placement request groups
of one device each (``core.flavor``). Placement lists a host's candidates
by walking the cartesian product of the groups' providers and dropping the
combinations that reuse one, so N groups over P providers cost up to P**N
steps per host: 8**8 (16.7 million) for 8 whole GPUs, 32**4 (a million)
for 4 vGPUs on an 8-GPU host whose VFs are providers (Nova 34's SR-IOV
shape, 4 VFs per GPU). Measured in doc/source/scheduler.rst, "Multi-GPU
flavors and Placement": minutes per host.

Two rules make it small, both in Placement's own terms (required traits):

* **Few stand-in providers per GPU.** A GPU with one provider (a PF mdev
  parent, a vendor-VFIO pool, a whole GPU) stands for itself. A GPU whose
  VFs are providers has *heads*: VFs with a free vGPU, picked by the agent
  (``heads``), which moves them to other free VFs when guests take them;
  as many as keep the walk under ``BUDGET`` (``heads_per_gpu``: 1 for 4
  devices on 8 GPUs, 2 for 8, all for 2). Only stand-ins carry set traits.
* **Group k may only take GPUs k to G-N+k** (positions among the host's G
  GPUs of that resource class, in GPU index order). Every set of N GPUs,
  sorted, is still one assignment (its k-th GPU is at a position between k
  and G-N+k), so no choice is lost; the product shrinks to (G-N+1)**N:
  1 for 8 devices on 8 GPUs, 625 for 4 on 8.

The stand-in of the GPU at position p carries ``CUSTOM_NOVA_GPU_SET<N>_<k>``
for every N and k that may use it (``traits_at``); group k of an
N-device flavor requires ``trait(N, k)`` (mdev: ``trait<k+1>:...=required``;
PCI paths: one ``[pci] alias`` per (N, k) whose ``traits`` names it,
``alias_name``). A host whose agent has not set them offers no candidate
to such a flavor, which is quick to tell. This module is the one place
that says which provider carries which trait; the agent writes them, the
flavors ask for them.
"""

import re

from nova_gpu.core import report as report_mod

MAX_COUNT = 8
"""The most devices one request can ask (``gpu:count``); see core.flavor."""

# Combinations Placement may walk per host for one request: 4,096 take it
# about 0.3 s (plain groups, 4 devices on 8 GPU providers, measured in
# doc/source/scheduler.rst), and the heads of SR-IOV GPUs multiply them.
BUDGET = 4096
MAX_HEADS = 8

PREFIX = 'CUSTOM_NOVA_GPU_SET'
_TRAIT = re.compile(r'CUSTOM_NOVA_GPU_SET([0-9]+)_([0-9]+)')
_ALIAS = re.compile(r'(.+)-set([0-9]+)-([0-9]+)')
# One provider per GPU: the GPU stands for itself.
_SINGLE = (report_mod.PF_MDEV, report_mod.PCI_POOL, report_mod.PCI_DEVICE)


def trait(count, k):
    """The trait group ``k`` (0-based) of a ``count``-device request
    requires.
    """
    if not 0 <= k < count <= MAX_COUNT:
        raise ValueError('device %d of %d: 0 <= k < count <= %d'
                         % (k, count, MAX_COUNT))
    return '%s%d_%d' % (PREFIX, count, k)


def is_set_trait(name):
    return _TRAIT.fullmatch(name or '') is not None


def parse_trait(name):
    """``(count, k)`` of a set trait, or None."""
    match = _TRAIT.fullmatch(name or '')
    return (int(match.group(1)), int(match.group(2))) if match else None


def traits_at(position, gpus, max_count=MAX_COUNT):
    """The set traits of the stand-in of the GPU at ``position`` (0-based)
    among ``gpus`` GPUs of one resource class on a host.
    """
    if not 0 <= position < gpus:
        raise ValueError('position %d of %d GPUs' % (position, gpus))
    result = set()
    for count in range(2, min(gpus, max_count) + 1):
        low = max(0, position - (gpus - count))
        for k in range(low, min(position, count - 1) + 1):
            result.add(trait(count, k))
    return frozenset(result)


def alias_name(base, count, k):
    """The ``[pci] alias`` name of device ``k`` of ``count`` on a PCI path
    whose one-device alias is ``base`` (``nvidia-gpu-set4-0``).
    """
    trait(count, k)  # validates
    return '%s-set%d-%d' % (base, count, k)


def parse_alias(name):
    """``(base, count, k)`` of a set alias name, or None."""
    match = _ALIAS.fullmatch(name or '')
    if not match:
        return None
    count, k = int(match.group(2)), int(match.group(3))
    if not 0 <= k < count <= MAX_COUNT:
        return None
    return match.group(1), count, k


def pci_aliases(base, resource_class, device_type, max_count=MAX_COUNT):
    """Every ``[pci] alias`` entry (a dict) the set aliases of ``base``
    need: one per device k of each count 2..``max_count``.
    """
    return [{'name': alias_name(base, count, k),
             'resource_class': resource_class,
             'traits': trait(count, k), 'device_type': device_type}
            for count in range(2, max_count + 1) for k in range(count)]


def _groups(gpus):
    """``{resource class: [GPU dicts in index order]}`` of report GPUs."""
    groups = {}
    for gpu in sorted(gpus, key=lambda g: g['index']):
        classes = {p.get('resource_class') for p in gpu.get('providers')
                   or ()} - {None}
        for rc in sorted(classes):
            groups.setdefault(rc, []).append(gpu)
    return groups


def static_traits(gpus):
    """``{provider name: set traits}`` of the GPUs that stand for
    themselves (one provider of the class): written once, in nova-compute's
    provider config, since they change only when the host's GPUs do.

    ``gpus``: report GPU dicts (``index``, ``providers`` with ``name``,
    ``kind``, ``resource_class``).
    """
    result = {}
    for rc, members in _groups(gpus).items():
        for position, gpu in enumerate(members):
            own = [p for p in gpu['providers']
                   if p.get('resource_class') == rc]
            if len(own) == 1 and own[0].get('kind') in _SINGLE:
                result[own[0]['name']] = traits_at(position, len(members))
    return result


def heads_per_gpu(count, gpus, budget=None):
    """How many free VFs of each GPU may carry the set traits of
    ``count`` devices on a host of ``gpus`` GPUs: the most h with
    (h * (gpus - count + 1)) ** count <= ``budget`` (``BUDGET``), at
    least 1. More heads let more multi-GPU servers land on a GPU between
    two moves of the agent (Nova's multi-create reuses one candidate
    list), at a cost of h**count more combinations.
    """
    budget = BUDGET if budget is None else budget
    span = gpus - count + 1
    h = 1
    while h < MAX_HEADS and ((h + 1) * span) ** count <= budget:
        h += 1
    return h


def heads(gpus, free, current=None):
    """``{provider name: set traits}`` for every VF provider of the GPUs
    whose VFs are providers: the heads of each such GPU get their
    position's traits, every other VF none.

    ``free(name)`` says whether a provider can take one more vGPU now
    (Placement: capacity above usage). Of a GPU's free VFs, the current
    heads (``current``: provider names holding set traits now) come
    first, so heads move only when a guest takes them, then the others in
    name order (the VFs' addresses); the first ``heads_per_gpu(N, G)`` of
    them carry the traits of N devices. A GPU with no free VF has no
    head: it can take no device of a multi-GPU request anyway.
    """
    current = set(current or ())
    result = {}
    for rc, members in _groups(gpus).items():
        total = len(members)
        depth = {count: heads_per_gpu(count, total)
                 for count in range(2, min(total, MAX_COUNT) + 1)}
        for position, gpu in enumerate(members):
            vfs = sorted(p['name'] for p in gpu['providers']
                         if p.get('resource_class') == rc
                         and p.get('kind') == report_mod.VF_MDEV)
            if not vfs:
                continue
            # A quarantined GPU (core.health) takes no new guest: no head.
            held = (gpu.get('health') or {}).get('quarantined')
            free_vfs = [name for name in vfs if free(name) and not held]
            ranked = ([n for n in free_vfs if n in current]
                      + [n for n in free_vfs if n not in current])
            traits = traits_at(position, total)
            for name in vfs:
                result[name] = frozenset()
            for rank, name in enumerate(ranked):
                result[name] = frozenset(
                    t for t in traits if rank < depth[parse_trait(t)[0]])
    return result
