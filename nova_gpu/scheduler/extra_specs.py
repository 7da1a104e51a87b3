"""Nova API validators for the ``gpu:`` flavor extra specs.

Registered in the ``nova.api.extra_spec_validators`` entry point group, so
that ``openstack flavor set --property gpu:profile=NOPE`` is refused by the
Nova API (microversion 2.86 and later) with a 400 that names the key, the
problem and the allowed values. The parsing is ``flavor.validate_value``,
the same code the scheduler filter uses.
"""

from nova.api.validation.extra_specs import base
from nova import exception

from nova_gpu.core import exceptions
from nova_gpu.scheduler import flavor

_DESCRIPTIONS = {
    'profile': 'NVIDIA vGPU type (time-sliced or MIG-backed) each device '
               'must be, e.g. A100-10C.',
    'mig': 'MIG GPU instance profile each device must be, e.g. 3g.40gb.',
    'count': 'Number of GPU devices, each on its own physical GPU.',
    'model': 'Comma-separated GPU models allowed, e.g. H100-80GB,H200-141GB.',
    'topology': 'any, numa (all GPUs on one NUMA node) or nvlink (all '
                'GPUs NVLink-connected).',
    'memory': 'Ask by need: the smallest device with at least this much GPU '
              'memory, e.g. 20GB (binary units).',
    'compute': 'With gpu:memory, the minimum share of one GPU\'s compute, '
               'e.g. 0.25 or 25%.',
    'kind': 'What serves gpu:memory: vgpu (default), mig or whole.',
}


class GpuExtraSpecValidator(base.ExtraSpecValidator):
    """Validates with nova_gpu's parser instead of a value pattern."""

    def validate(self, name, value):
        super().validate(name, value)
        try:
            flavor.validate_value(name, value)
        except exceptions.GpuError as e:
            raise exception.ValidationError(
                'Validation failed; %s' % e) from None


def register():
    return [
        GpuExtraSpecValidator(
            name=flavor.PREFIX + key,
            description=_DESCRIPTIONS[key],
            value={'type': str, 'description': _DESCRIPTIONS[key]})
        for key in sorted(_DESCRIPTIONS)
    ]
