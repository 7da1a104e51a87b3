"""Expected GPU fragmentation of a host against a demand distribution.

This is the measure of FGD (Weng et al., "Beware of Fragmentation:
Scheduling GPU-Sharing Workloads with Fragmentation Gradient Descent",
USENIX ATC 2023), generalised from GPU shares to vGPU and MIG profiles:
for each typical request ``m`` (with probability ``p_m``), the free GPU
capacity on a GPU where ``m`` cannot place a unit is a fragment; when ``m``
cannot fit the host at all (GPUs, CPU or memory), all free capacity is. The
host's fragmentation is the ``p_m``-weighted sum, in milli-GPUs.
"""

import collections
import dataclasses
import functools

from nova_gpu.core import host as host_mod
from nova_gpu.core import partitions


@dataclasses.dataclass(frozen=True)
class DemandItem:
    request: object  # a GpuRequest, or None for a CPU-only task
    weight: float


class Demand:
    """Typical requests and their probabilities (weights sum to 1)."""

    def __init__(self, items):
        items = [i for i in items if i.weight > 0]
        total = sum(i.weight for i in items)
        self.items = tuple(DemandItem(i.request, i.weight / total)
                           for i in items) if total else ()

    @classmethod
    def from_requests(cls, requests, top=None, coverage=None):
        """Demand from observed requests, most frequent first.

        ``top`` keeps at most that many distinct requests; ``coverage`` stops
        once that share of all requests is covered (FGD's "typical tasks").
        """
        counts = collections.Counter(requests)
        total = sum(counts.values())
        items, covered = [], 0
        for req, n in counts.most_common(top):
            items.append(DemandItem(req, n))
            covered += n
            if coverage is not None and covered >= coverage * total:
                break
        return cls(items)

    def __len__(self):
        return len(self.items)


def unit_fits(gpu, req):
    """Can ``gpu`` take one device of ``req`` now?"""
    return fit_checker(req)(gpu)


# The one fit rule is ``unit_slots`` (every slot of ``gpu`` that could hold
# one device of ``req``), written with ``host.Gpu``'s own predicates
# (``fits_share``, ``fits_whole``, ``mig_offers``, ``vgpu_room``...) and
# its model rule (``Gpu.serves_model``). ``fit_checker`` answers
# ``bool(unit_slots(gpu, req))`` with named fast paths, one per request
# kind, that ask the same Gpu predicates without building slots: the
# fragmentation measure asks it for every typical request on every GPU of
# every host it scores. A unit test holds the two to the same answers.


@functools.lru_cache(maxsize=4096)
def fit_checker(req):
    """A function ``gpu -> bool`` answering ``unit_fits`` for ``req``.

    Built once per request (memoised, bounded).
    """
    return _FAST_PATHS.get(req.kind, _by_slots)(req)


def _share_fits(req):
    milli, allowed = req.milli, req.models

    def share_fits(gpu):
        return gpu.fits_share(milli) and gpu.serves_model(allowed)
    return share_fits


def _whole_fits(req):
    allowed = req.models

    def whole_fits(gpu):
        return gpu.fits_whole() and gpu.serves_model(allowed)
    return whole_fits


def _mig_fits(req):
    name, allowed = req.profile, req.models

    def mig_fits(gpu):
        mig = gpu.model.mig
        profile = mig.profiles.get(name) if mig else None
        return (profile is not None and gpu.fits_mig(profile)
                and gpu.serves_model(allowed))
    return mig_fits


def _vgpu_fits(req):
    if not req.profile:
        return _by_slots(req)
    name, allowed = req.profile, req.models

    def vgpu_fits(gpu):
        profile = gpu.model.vgpu_profiles.get(name)
        return (profile is not None and gpu.serves_model(allowed)
                and gpu.fits_vgpu(profile))
    return vgpu_fits


def _by_slots(req):
    def fits_by_slots(gpu):
        return gpu.serves_model(req.models) and bool(unit_slots(gpu, req))
    return fits_by_slots


_FAST_PATHS = {host_mod.SHARE: _share_fits, host_mod.WHOLE: _whole_fits,
               host_mod.MIG: _mig_fits, host_mod.VGPU: _vgpu_fits}


def unit_slots(gpu, req):
    """Every slot on ``gpu`` that could hold one device of ``req``
    (ignoring the model rule, ``Gpu.serves_model``).

    None on a quarantined GPU (``core.health``): the one place that keeps
    new guests off it, for the scheduler, the capacity counts and the
    fragmentation measure alike.
    """
    if gpu.quarantine is not None:
        return ()
    kind = req.kind
    model = gpu.model
    if kind == host_mod.SHARE:
        return ((host_mod.Slot(gpu.index, kind, req.milli),)
                if gpu.fits_share(req.milli) else ())
    if kind == host_mod.WHOLE:
        return ((host_mod.Slot(gpu.index, kind),)
                if gpu.fits_whole() else ())
    if kind == host_mod.MIG:
        if not model.mig or req.profile not in model.mig.profiles:
            return ()
        # Gpu decides (MIG mode, enabled types, free slices): one rule.
        return tuple(host_mod.Slot(gpu.index, kind, (req.profile, s, None))
                     for s in gpu.mig_offers(model.mig.profiles[req.profile]))
    # VGPU
    names = ((req.profile,) if req.profile else
             gpu.vgpu_types or _held_types(gpu))
    slots = []
    for name in names:
        profile = model.vgpu_profiles.get(name)
        if profile is None:
            continue
        if profile.mig_backed:
            # Gpu decides (enabled types, MIG mode, free slices): one rule.
            slots.extend(host_mod.Slot(gpu.index, host_mod.MIG,
                                       (profile.mig_profile, s, name))
                         for s in gpu.vgpu_mig_starts(profile))
        elif gpu.vgpu_room(profile) > 0:
            slots.append(host_mod.Slot(gpu.index, kind, name))
    return tuple(slots)


def _held_types(gpu):
    """Types an unnamed vGPU ask may take where none are enabled: those
    held (equal-size mode), or every time-sliced type in mixed-size mode.
    """
    if gpu.mixed_size:
        return tuple(name for name, p in gpu.model.vgpu_profiles.items()
                     if not p.mig_backed)
    return tuple(gpu.vgpus)


def host_fits(host, req, free_gpus=None):
    """Could ``req`` fit ``host`` at all (ignoring topology)?"""
    if (req.cpu_milli > host.cpu_free or req.memory_mib > host.memory_free):
        return False
    if req.count > 1 and partitions.applies(host, req):
        # Shared NVSwitch: only a free partition of its size takes it.
        return partitions.some_partition_fits(host, req.count,
                                              fit_checker(req))
    if free_gpus is None:
        free_gpus = sum(1 for g in host.gpus if unit_fits(g, req))
    return free_gpus >= req.count


def gpu_fragment(gpu, free, demand_fit):
    """Fragment of one GPU: free capacity no fitting typical request uses.

    ``demand_fit`` pairs each typical request that fits the host with its
    weight; requests that do not fit the host are accounted by the caller.
    """
    if not free:
        return 0.0
    lost = 0.0
    for req, weight in demand_fit:
        if req is None or not unit_fits(gpu, req):
            lost += weight
    return lost * free


def host_fragmentation(host, demand):
    """Expected fragmentation of ``host`` in milli-GPUs."""
    frees = [g.free_milli for g in host.gpus]
    total_free = sum(frees)
    if not total_free:
        return 0.0
    result = 0.0
    fitting = []
    for item in demand.items:
        req = item.request
        if req is None or not host_fits(host, req):
            result += item.weight * total_free
        else:
            fitting.append((req, item.weight))
    for gpu, free in zip(host.gpus, frees):
        result += gpu_fragment(gpu, free, fitting)
    return result
