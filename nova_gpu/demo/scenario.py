"""The demo's cloud and the request sequence booted on it (data only).

The hosts show every way Nova 34 exposes an NVIDIA GPU (doc/source/
generations.rst): H100 with NVIDIA's vendor-specific VFIO (VFs pooled per
GPU by PCI in Placement), A100 in MIG mode and L40S with SR-IOV + mdev (a
VGPU provider per VF), T4 with mdev types on the PF, H200 GPUs passed
through whole, and an L40S in NVIDIA's mixed-size vGPU mode whose
vendor-VFIO VFs get their type when a guest starts (doc/source/hgx.rst,
"Mixed vGPU sizes on one GPU").

The sequence is chosen to show what choosing the host and the GPUs by
expected fragmentation and topology buys over Nova's default (spread hosts
by free RAM, claim the first allocation candidate Placement lists): servers
that need one vGPU on each of four GPUs on one NUMA node come first, then
single vGPUs. nova-gpu gives every four-GPU server one NUMA node, packing
two on each node's four GPUs, and the single vGPUs fill what is left;
stock Nova ignores gpu:topology and spreads, so its four-GPU servers span
NUMA nodes. On the mixed-size L40S an L40S-24C and an L40S-8C share the
GPU (equal-size mode would refuse the second size); an L40S-16C no
longer fits it, though 16 GB of its frame buffer are free: no free
4-slot placement is left. It is refused, and another L40S-8C still fits.
"""

import collections
import dataclasses
import itertools

from nova_gpu.core import catalog as catalog_mod
from nova_gpu.core import partitions as partitions_mod
from nova_gpu.tests.harness import cloud as cloud_mod


def _all_pairs(gpus):
    """NVLink through NVSwitch: every GPU reaches every other one."""
    return tuple(itertools.combinations(range(gpus), 2))


HOSTS = (
    # HGX H100: 8 GPUs behind NVSwitch, 4 per NUMA node, NVIDIA vGPU 17+
    # (vendor-specific VFIO): two VFs per GPU preset to H100-40C, pooled
    # per GPU by PCI in Placement.
    cloud_mod.GpuHost('h100-1', 'H100-80GB', 'H100-40C', gpus=8,
                      nvlink=_all_pairs(8), path=cloud_mod.VFIO),
    cloud_mod.GpuHost('h100-2', 'H100-80GB', 'H100-40C', gpus=8,
                      nvlink=_all_pairs(8), path=cloud_mod.VFIO),
    # A100 SXM4 in pairs of NVLinked GPUs, in MIG mode, vGPU 16 (SR-IOV +
    # mdev): the MIG-backed vGPU type A100-2-10C on three VFs per GPU,
    # each on a MIG 2g.10gb GPU instance, which may only start at slice 0,
    # 2 or 4.
    cloud_mod.GpuHost('a100-1', 'A100-40GB', 'A100-2-10C', gpus=4,
                      nvlink=((0, 1), (2, 3)), mig=True),
    # PCIe L40S for inference and graphics, SR-IOV + mdev: L40S-8C on six
    # VFs per GPU.
    cloud_mod.GpuHost('l40s-1', 'L40S', 'L40S-8C', gpus=2),
    # PCIe L40S in mixed-size (heterogeneous) vGPU mode, NVIDIA vGPU 17+:
    # six vendor-VFIO VFs (L40S-8C's equal-size maximum) pooled by PCI in
    # Placement, none typed until a guest starts (nova-gpu-qemu-hook gives
    # the VF the flavor's type); vGPUs of several sizes share the GPU, as
    # its 8 placement slots allow (L40S-24C takes 4, L40S-8C 2).
    cloud_mod.GpuHost('l40s-mix', 'L40S', 'L40S-8C', gpus=1,
                      path=cloud_mod.VFIO, vf_types=cloud_mod.ON_DEMAND,
                      mixed_size=True),
    # Turing: mdev types on the PF. T4-8C: two per GPU.
    cloud_mod.GpuHost('t4-1', 'T4', 'T4-8C', gpus=2),
    # HGX H100 for training, whole GPUs passed through in Fabric
    # Manager's Shared NVSwitch mode: a guest gets only GPUs forming one
    # of the board's published partitions (doc/source/hgx.rst). Eight
    # ConnectX-7 NICs, two with two GPUs under each of four PCIe switches,
    # their VFs in PCI in Placement for GPUDirect RDMA (gpu:rdma).
    cloud_mod.GpuHost('hgx-1', 'H100-80GB', gpus=8, nvlink=_all_pairs(8),
                      path=cloud_mod.PASSTHROUGH,
                      partitions=partitions_mod.published_table(
                          'HGX-H100-8GPU'),
                      rdma=cloud_mod.RdmaLayout.hgx_h100()),
    # Two NVLinked H200 GPUs passed through whole.
    cloud_mod.GpuHost('h200-1', 'H200-141GB', gpus=2, nvlink=((0, 1),),
                      path=cloud_mod.PASSTHROUGH),
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
    Flavor('h100.40c', {'gpu:profile': 'H100-40C', 'gpu:backend': 'vfio'},
           asks='1x H100-40C'),
    Flavor('h100.40c.x4', {'gpu:profile': 'H100-40C', 'gpu:count': '4',
                           'gpu:topology': 'numa', 'gpu:backend': 'vfio'},
           vcpus=2, asks='4x H100-40C, one NUMA node'),
    Flavor('a100.mig', {'gpu:profile': 'A100-2-10C'},
           asks='1x A100-2-10C (MIG)'),
    Flavor('a100.mig.x2', {'gpu:profile': 'A100-2-10C', 'gpu:count': '2',
                           'gpu:topology': 'nvlink'},
           asks='2x A100-2-10C, NVLinked'),
    Flavor('l40s.8c', {'gpu:profile': 'L40S-8C'}, asks='1x L40S-8C'),
    Flavor('l40s.24c.mix', {'gpu:profile': 'L40S-24C',
                            'gpu:backend': 'vfio'},
           asks='1x L40S-24C, mixed-size GPU (VF typed at start)'),
    Flavor('l40s.16c.mix', {'gpu:profile': 'L40S-16C',
                            'gpu:backend': 'vfio'},
           asks='1x L40S-16C, mixed-size GPU (VF typed at start)'),
    Flavor('l40s.8c.mix', {'gpu:profile': 'L40S-8C', 'gpu:backend': 'vfio'},
           asks='1x L40S-8C, mixed-size GPU (VF typed at start)'),
    Flavor('t4.8c', {'gpu:profile': 'T4-8C'}, asks='1x T4-8C'),
    Flavor('h100.x2', {'gpu:kind': 'whole', 'gpu:model': 'H100-80GB',
                       'gpu:count': '2', 'gpu:topology': 'nvlink'},
           vcpus=2, asks='2 whole H100, one NVSwitch partition'),
    Flavor('h100.rdma', {'gpu:kind': 'whole', 'gpu:model': 'H100-80GB',
                         'gpu:rdma': 'true'},
           asks='1 whole H100 + a NIC VF on its switch'),
    Flavor('h200.x2', {'gpu:kind': 'whole', 'gpu:model': 'H200-141GB',
                       'gpu:count': '2', 'gpu:topology': 'nvlink'},
           vcpus=2, asks='2 whole H200, NVLinked'),
)

# (flavor, how many), booted one server at a time in this order.
SEQUENCE = (
    ('h100.40c.x4', 6),
    ('l40s.8c', 2),
    # Two sizes on the mixed-size L40S (6 of its 8 slots), then a size
    # that no longer fits (4 slots; refused) and one that does (2).
    ('l40s.24c.mix', 1),
    ('l40s.8c.mix', 1),
    ('l40s.16c.mix', 1),
    ('l40s.8c.mix', 1),
    ('a100.mig', 3),
    ('h100.40c', 6),
    ('a100.mig.x2', 2),
    ('t4.8c', 2),
    ('h200.x2', 1),
    ('h100.x2', 2),
    ('h100.rdma', 1),
)


def model_of(flavor):
    """The GPU model a flavor asks (for the aggregates)."""
    if 'gpu:model' in flavor.extra_specs:
        return flavor.extra_specs['gpu:model']
    profile = flavor.extra_specs['gpu:profile']
    for host in HOSTS:
        if host.vgpu_type == profile:
            return host.model
    for host in HOSTS:
        # A mixed-size GPU takes any time-sliced type of its model.
        if host.mixed_size and profile in catalog_mod.load_catalog().model(
                host.model).vgpu_profiles:
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
