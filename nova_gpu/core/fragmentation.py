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

from nova_gpu.core import host as host_mod


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


_CHECKERS = {}


def fit_checker(req):
    """A function ``gpu -> bool`` answering ``unit_fits`` for ``req``.

    Built once per request: fragmentation asks this question for every
    typical request on every GPU of every host scored, so it must not
    rebuild tuples or re-dispatch on the request kind each time.
    """
    checker = _CHECKERS.get(req)
    if checker is None:
        checker = _CHECKERS[req] = _build_checker(req)
    return checker


def _build_checker(req):
    allowed = req.models
    kind = req.kind

    def model_ok(model):
        return allowed is None or _model_allowed(model, allowed)

    if kind == host_mod.SHARE:
        milli = req.milli

        def fits(gpu):
            return gpu.fits_share(milli) and model_ok(gpu.model)
    elif kind == host_mod.WHOLE:
        def fits(gpu):
            return gpu.fits_whole() and model_ok(gpu.model)
    elif kind == host_mod.MIG:
        name = req.profile

        def fits(gpu):
            mig = gpu.model.mig
            profile = mig.profiles.get(name) if mig else None
            return (profile is not None and gpu.fits_mig(profile)
                    and model_ok(gpu.model))
    else:
        def fits(gpu):
            return bool(unit_slots(gpu, req)) and model_ok(gpu.model)
        if req.profile:
            name = req.profile

            def fits(gpu):  # noqa: F811 - the common case, made cheap
                profile = gpu.model.vgpu_profiles.get(name)
                return (profile is not None and model_ok(gpu.model)
                        and gpu.fits_vgpu(profile))
    return fits


def unit_slots(gpu, req):
    """Every slot on ``gpu`` that could hold one device of ``req``."""
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
        return tuple(host_mod.Slot(gpu.index, kind, (req.profile, s, None))
                     for s in gpu.mig_starts(model.mig.profiles[req.profile]))
    # VGPU
    names = ((req.profile,) if req.profile else
             gpu.vgpu_types or tuple(gpu.vgpus) or ())
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


def _model_allowed(model, allowed):
    return model.name in allowed or any(a in allowed for a in model.aliases)


def host_fits(host, req, free_gpus=None):
    """Could ``req`` fit ``host`` at all (ignoring topology)?"""
    if (req.cpu_milli > host.cpu_free or req.memory_mib > host.memory_free):
        return False
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
