"""Default demand distributions: what a typical request looks like.

The fragmentation measure needs a distribution of typical requests. In
production it comes from the flavors actually booted; these defaults give
every model's vGPU profiles, MIG profiles and whole-GPU counts a share.
"""

from nova_gpu.core import fragmentation
from nova_gpu.core import host as host_mod
from nova_gpu.core import request as request_mod


def catalog_demand(catalog, models=None, whole_counts=(1, 2, 4, 8)):
    """Uniform demand over the catalog's profiles and whole-GPU counts."""
    items = []
    for model in catalog.models.values():
        if models is not None and model.name not in models:
            continue
        for profile in model.vgpu_profiles.values():
            items.append(fragmentation.DemandItem(
                request_mod.GpuRequest(host_mod.VGPU, profile.name), 1.0))
        if model.mig:
            for name in model.mig.profiles:
                items.append(fragmentation.DemandItem(
                    request_mod.GpuRequest(host_mod.MIG, name), 1.0))
    for count in whole_counts:
        items.append(fragmentation.DemandItem(
            request_mod.GpuRequest(host_mod.WHOLE, count=count), 1.0))
    return fragmentation.Demand(items)
