"""GPU quotas with Nova's unified limits: the resource classes to cap.

Nova's ``UnifiedLimitsDriver`` (``[quota] driver``) caps a project's
Placement usage per resource class against the Keystone limits named
``class:<resource class>`` (nova/limit/placement.py: ``_get_deltas`` takes
what a boot asks from ``ResourceRequest.from_request_spec`` of
``scheduler.utils.request_spec_for_limits``, the flavor's ``resources*:``
keys plus its PCI in Placement groups; ``_get_usage`` counts the
project's usage from Placement, ``GET /usages?project_id=``). So Nova
caps whatever class a boot asks and Placement allocates; it caps nothing
else.

The device classes (``VGPU`` for every mdev vGPU, the PCI classes of
``[pci] device_spec``) are one per path, for every model: the scheduler,
the set traits and flavors that accept several models rely on that. A
cap per model and on GPU memory comes from classes of their own, which
this module names once for every part of nova-gpu:

* ``CUSTOM_GPU_QUOTA_<MODEL>_VGPU``: vGPUs (time-sliced or MIG-backed,
  mdev or vendor-VFIO) of one catalog model;
* ``CUSTOM_GPU_QUOTA_<MODEL>_WHOLE``: whole GPUs (passthrough) of it;
* ``CUSTOM_GPU_QUOTA_MEMORY_MB``: GPU memory in MiB, every model and path.

The compute host offers them on its root provider (``host_inventory``,
written by nova-gpu-agent into nova-compute's provider config: Nova
merges custom inventory of a provider config into its provider tree,
nova/compute/resource_tracker.py ``_merge_provider_configs``) and a
flavor asks them in its unnumbered group (``extra_specs``), which
Placement may take from any provider of the tree. Their totals are at
least what the host's GPUs can hold, so they never limit capacity: the
device classes do. They only make the project's usage countable.
"""

import re
import shlex

from nova_gpu.core import exceptions
from nova_gpu.core import flavor as flavor_mod
from nova_gpu.core import host as host_mod
from nova_gpu.core import report as report_mod

PREFIX = 'CUSTOM_GPU_QUOTA_'
MEMORY_CLASS = PREFIX + 'MEMORY_MB'
VGPU = 'VGPU'
WHOLE = 'WHOLE'
KINDS = (VGPU, WHOLE)
LIMIT_PREFIX = 'class:'  # Keystone limit name of a resource class (Nova)
_VGPU_PROVIDERS = (report_mod.PF_MDEV, report_mod.VF_MDEV,
                   report_mod.PCI_POOL)
_WHOLE_PROVIDERS = (report_mod.PCI_DEVICE,)
_RC_MAX = 255  # Placement's longest resource class name


def class_part(model_name):
    """A catalog model name as a resource class part (H100-80GB ->
    H100_80GB).
    """
    return re.sub(r'[^A-Z0-9]+', '_', str(model_name).upper()).strip('_')


def model_class(model_name, kind):
    """The class that counts ``kind`` (``VGPU``/``WHOLE``) devices of a
    model.
    """
    if kind not in KINDS:
        raise exceptions.InvalidRequest(
            'unknown GPU quota kind %r (allowed: %s)'
            % (kind, ', '.join(KINDS)))
    part = class_part(model_name)
    if not part:
        raise exceptions.InvalidRequest(
            'GPU model %r makes no resource class name' % (model_name,))
    name = '%s%s_%s' % (PREFIX, part, kind)
    if len(name) > _RC_MAX:
        raise exceptions.InvalidRequest(
            'GPU model %r makes a resource class longer than %d '
            'characters' % (model_name, _RC_MAX))
    return name


def _device_mib(catalog, request):
    """GPU memory (MiB) of one device of ``request``; None: unknown (a
    vGPU of whatever type the GPU is set up for, a GPU of any model).
    """
    models = request.models
    if request.kind == host_mod.VGPU:
        if request.profile is None:
            return None
        _model, profile = catalog.vgpu_profile(request.profile)
        return profile.framebuffer_mib
    if not models:
        return None
    found = []
    for name in models:
        model = catalog.model(name)
        if request.kind == host_mod.WHOLE:
            found.append(model.framebuffer_mib)
        elif model.mig and request.profile in model.mig.profiles:
            found.append(model.mig.profiles[request.profile]
                         .framebuffer_mib)
    return min(found) if found else None


def flavor_resources(spec, catalog):
    """``{resource class: amount}`` of the quota classes a flavor asks.

    ``spec``: the flavor's ``core.flavor.GpuSpec``. The model class when
    every alternative is of one model; the memory class when every
    alternative says its size (``gpu:profile``, ``gpu:mig``,
    ``gpu:memory``, whole GPUs of named models): the smallest
    alternative's, which is at least what the flavor asked and what the
    scheduler prefers. A stock flavor (no ``gpu:`` keys) asks none.
    """
    if spec is None or not spec.explicit or not spec.alternatives:
        return {}
    count = spec.alternatives[0].count
    result = {}
    models = set()
    for alt in spec.alternatives:
        models.update(alt.models or ('*',))
    if len(models) == 1 and '*' not in models:
        kind = WHOLE if spec.path == flavor_mod.PATH_PASSTHROUGH else VGPU
        result[model_class(models.pop(), kind)] = count
    sizes = [_device_mib(catalog, alt) for alt in spec.alternatives]
    if sizes and None not in sizes:
        result[MEMORY_CLASS] = min(sizes) * count
    return result


def extra_specs(spec, catalog):
    """The flavor keys (``resources:<class>=<amount>``) of
    ``flavor_resources``: the unnumbered group, so that Placement takes
    them from the host's root provider whichever group holds the devices.
    """
    return {'resources:%s' % rc: str(amount)
            for rc, amount in sorted(flavor_resources(spec,
                                                      catalog).items())}


def _slots(model):
    """The most vGPUs one GPU of ``model`` can hold (any type)."""
    return max((p.max_instances for p in model.vgpu_profiles.values()),
               default=1)


def host_inventory(gpus):
    """The quota inventory of a host's root provider.

    ``gpus``: ``(catalog.GpuModel, provider kinds)`` of each GPU, the
    kinds of ``core.report`` (``pf_mdev``, ``vf_mdev``, ``pci_pool``,
    ``pci_device``) of the providers Nova makes for it. Returns
    ``{resource class: {'total': n, 'max_unit': n}}``: per model, the
    vGPUs its GPUs can hold at most and its whole GPUs; the GPUs' memory.
    A GPU Nova makes no provider for offers nothing, nor one whose model
    name makes no class name: one odd model never costs the host's file.
    """
    totals = {}
    for model, kinds in gpus:
        kinds = set(kinds)
        try:
            if kinds & set(_VGPU_PROVIDERS):
                rc, amount = model_class(model.name, VGPU), _slots(model)
            elif kinds & set(_WHOLE_PROVIDERS):
                rc, amount = model_class(model.name, WHOLE), 1
            else:
                continue
        except exceptions.InvalidRequest:
            continue
        totals[rc] = totals.get(rc, 0) + amount
        totals[MEMORY_CLASS] = (totals.get(MEMORY_CLASS, 0)
                                + model.framebuffer_mib)
    return {rc: {'total': total, 'max_unit': total}
            for rc, total in sorted(totals.items())}


def limit_names(catalog, models=None, kinds=KINDS):
    """``[(Keystone limit name, what it caps)]`` for ``models`` (catalog
    names or aliases; None: every catalog model), memory first.
    """
    result = [(LIMIT_PREFIX + MEMORY_CLASS,
               'GPU memory (MiB) of every model and path')]
    names = ([catalog.model(m).name for m in models] if models
             else sorted(catalog.models))
    for name in names:
        for kind in kinds:
            what = ('%s vGPUs (mdev or vendor-VFIO, time-sliced or '
                    'MIG-backed)' % name if kind == VGPU
                    else 'whole %s GPUs (passthrough)' % name)
            result.append((LIMIT_PREFIX + model_class(name, kind), what))
    return result


def limit_command(limit_name, default_limit, region=None,
                  service='nova'):
    """The ``openstack registered limit create`` command of one limit."""
    if not isinstance(default_limit, int) or default_limit < -1:
        raise exceptions.InvalidRequest(
            'default limit %r of %s: expected an integer of -1 (no limit) '
            'or more' % (default_limit, limit_name))
    words = ['openstack', 'registered', 'limit', 'create', '--service',
             service, '--default-limit', str(default_limit)]
    if region:
        words += ['--region', region]
    # Quoted for a shell: a region or service name is the operator's text.
    return ' '.join(shlex.quote(w) for w in words + [limit_name])
