"""Nova API validators for the ``gpu:`` flavor extra specs.

Registered in the ``nova.api.extra_spec_validators`` entry point group, so
that ``openstack flavor set --property gpu:profile=NOPE`` is refused by the
Nova API (microversion 2.86 and later) with a 400 that names the key, the
problem and the allowed values. The parsing is ``gpu_spec.validate_value``
(the core's grammar, ``core.flavor``, with ``[gpu_scheduler]
max_gpu_count`` and ``[gpu] catalog_files``), the same code the scheduler
filter uses.

Nova calls a validator only for a key it matches: by exact name, then by
each validator's name pattern, and a key of no registered namespace is
accepted unchecked. So a near miss (``GPU:profile``, `` gpu:profile``,
``gpu :count``) would be stored and then ignored. ``NEAR_MISS_PATTERN``
is the name pattern of one more validator, matching those keys, so that
Nova calls it and it refuses them with the key they probably meant. It has
no literal colon: Nova takes the text before the first colon of every
pattern as a namespace of its own.
"""

from nova.api.validation.extra_specs import base
from nova import exception

from nova_gpu.core import exceptions
from nova_gpu.core import flavor as grammar
from nova_gpu.scheduler import gpu_spec

_DESCRIPTIONS = {
    'profile': 'NVIDIA vGPU type (time-sliced or MIG-backed) each device '
               'must be, e.g. A100-10C.',
    'mig': 'MIG GPU instance profile each device must be, e.g. 3g.40gb.',
    'count': 'Number of GPU devices, each on its own physical GPU: 1 to '
             '[gpu_scheduler] max_gpu_count (default 8, at most 8).',
    'model': 'Comma-separated GPU models allowed, e.g. H100-80GB,H200-141GB.',
    'topology': 'any, numa (all GPUs on one NUMA node) or nvlink (all '
                'GPUs NVLink-connected).',
    'memory': 'Ask by need: the smallest device with at least this much GPU '
              'memory, e.g. 20GB (binary units).',
    'compute': 'With gpu:memory, the minimum share of one GPU\'s compute, '
               'e.g. 0.25 or 25%.',
    'kind': 'What serves gpu:memory: vgpu (default), mig or whole.',
    'backend': 'How vGPUs reach the guest where a cloud mixes paths: mdev '
               '(mediated devices, resources:VGPU) or vfio (NVIDIA '
               'vendor-specific VFIO VFs, pci_passthrough:alias); default '
               '[gpu_scheduler] vgpu_backend. Not with gpu:kind=whole.',
    'preemptible': 'true (spot: nova-gpu-reclaimer may shelve-offload or '
                   'delete the flavor\'s servers, after a grace period, '
                   'to serve on-demand GPU servers) or false (default).',
    'rdma': 'true (GPUDirect RDMA: each GPU with one RDMA NIC function, '
            'pci_passthrough:alias [gpu_scheduler] rdma_nic_alias:N, '
            'under the same PCIe switch or root complex, [gpu_scheduler] '
            'rdma_locality) or false (default).',
}


class GpuExtraSpecValidator(base.ExtraSpecValidator):
    """Validates with nova_gpu's parser instead of a value pattern."""

    def validate(self, name, value):
        super().validate(name, value)
        try:
            gpu_spec.validate_value(name, value)
        except exceptions.GpuError as e:
            raise exception.ValidationError(
                'Validation failed; %s' % e) from None


# "gpu" in any case with spaces around, a colon (\x3a), then anything;
# the exact gpu:<name> keys are found by name before any pattern is tried.
NEAR_MISS_PATTERN = r'\s*[Gg][Pp][Uu]\s*\x3a[\s\S]*'


def register():
    validators = [
        GpuExtraSpecValidator(
            name=grammar.PREFIX + key,
            description=_DESCRIPTIONS[key],
            value={'type': str, 'description': _DESCRIPTIONS[key]})
        for key in sorted(_DESCRIPTIONS)
    ]
    validators.append(GpuExtraSpecValidator(
        name='{gpu_key}',
        description='Any other key that looks meant for the gpu: namespace '
                    '(other case, spaces): refused, with the key meant.',
        value={'type': str, 'description': 'Not read.'},
        parameters=[{'name': 'gpu_key', 'pattern': NEAR_MISS_PATTERN,
                     'description': 'gpu in any case, spaces, a colon, '
                                    'anything'}]))
    return validators
