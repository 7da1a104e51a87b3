"""The demo's cloud and the request sequence booted on it (data only).

The sequence is chosen to show what choosing the host and the GPUs by
expected fragmentation and topology buys over Nova's default (spread hosts
by free RAM, claim the first allocation candidate Placement lists): single
vGPUs come first, then servers that need one vGPU on each of four GPUs on
one NUMA node. nova-gpu packs the single vGPUs on one H100 host and gives
every four-GPU server one NUMA node; stock Nova spreads the single vGPUs,
ignores gpu:topology and, depending on the order Placement lists the GPUs
in, strands vGPU slots on too few GPUs for the last four-GPU servers.
"""

import collections
import dataclasses
import itertools

from nova_gpu.testing import cloud as cloud_mod


def _all_pairs(gpus):
    """NVLink through NVSwitch: every GPU reaches every other one."""
    return tuple(itertools.combinations(range(gpus), 2))


HOSTS = (
    # HGX H100: 8 GPUs behind NVSwitch, 4 per NUMA node. H100-40C: two
    # vGPUs per GPU.
    cloud_mod.GpuHost('h100-1', 'H100-80GB', 'H100-40C', gpus=8,
                      nvlink=_all_pairs(8)),
    cloud_mod.GpuHost('h100-2', 'H100-80GB', 'H100-40C', gpus=8,
                      nvlink=_all_pairs(8)),
    # A100 SXM4 in pairs of NVLinked GPUs, in MIG mode: the MIG-backed
    # vGPU type A100-2-10C sits on a MIG 2g.10gb instance, which may only
    # start at slice 0, 2 or 4 (3 per GPU).
    cloud_mod.GpuHost('a100-1', 'A100-40GB', 'A100-2-10C', gpus=4,
                      nvlink=((0, 1), (2, 3)), mig=True),
    # PCIe L40S for inference and graphics: L40S-8C (6 per GPU).
    cloud_mod.GpuHost('l40s-1', 'L40S', 'L40S-8C', gpus=4),
)


@dataclasses.dataclass(frozen=True)
class Flavor:
    name: str
    extra_specs: dict
    vcpus: int = 1
    ram_mb: int = 1024
    # What the table says the flavor asks, in words.
    asks: str = ''


# Stock Nova cannot read gpu: extra specs; like an operator would, both
# clouds steer each flavor to its GPU model with host aggregates
# (AggregateInstanceExtraSpecsFilter). The Placement keys
# (resources:VGPU=..., group_policy) are derived from the gpu: keys.
AGGREGATE_KEY = 'gpu_model'
FLAVORS = (
    Flavor('h100.40c', {'gpu:profile': 'H100-40C'}, asks='1x H100-40C'),
    Flavor('h100.40c.x4', {'gpu:profile': 'H100-40C', 'gpu:count': '4',
                           'gpu:topology': 'numa'},
           vcpus=2, asks='4x H100-40C, one NUMA node'),
    Flavor('a100.mig', {'gpu:profile': 'A100-2-10C'},
           asks='1x A100-2-10C (MIG)'),
    Flavor('a100.mig.x2', {'gpu:profile': 'A100-2-10C', 'gpu:count': '2',
                           'gpu:topology': 'nvlink'},
           asks='2x A100-2-10C, NVLinked'),
    Flavor('l40s.8c', {'gpu:profile': 'L40S-8C'}, asks='1x L40S-8C'),
)

# (flavor, how many), booted one server at a time in this order.
SEQUENCE = (
    ('h100.40c', 6),
    ('l40s.8c', 2),
    ('a100.mig', 3),
    ('h100.40c.x4', 6),
    ('a100.mig.x2', 2),
)


def model_of(flavor):
    """The GPU model a flavor's profile belongs to (for the aggregates)."""
    profile = flavor.extra_specs['gpu:profile']
    for host in HOSTS:
        if host.vgpu_type == profile:
            return host.model
    raise ValueError('no demo host offers %s' % profile)


def flavors_by_name():
    return {f.name: f for f in FLAVORS}


def requests():
    """(server name, flavor name) in boot order; names number per flavor."""
    seen = collections.Counter()
    result = []
    for name, count in SEQUENCE:
        for _ in range(count):
            seen[name] += 1
            result.append(('%s-%d' % (name.replace('.', '-'), seen[name]),
                           name))
    return result
