"""Which of a host's allocation candidates pair each GPU with its NIC VF.

A ``gpu:rdma=true`` flavor asks Placement for its GPUs and, through the
RDMA NIC alias, one NIC VF per GPU (``core.flavor.placement_extra_specs``).
With PCI in Placement, Nova makes one provider per NIC PF holding its VFs
(``<hypervisor hostname>_<PF address>``), so each allocation candidate
names the PFs its VFs come from, and the compute host claims the VFs from
exactly those PFs (``nova.pci.stats.PciDeviceStats.
_filter_pools_based_on_placement_allocation``): the candidate Nova claims
decides the NIC as well as the GPUs. A candidate is kept only when each of
its GPUs gets a VF of its own in its locality domain (``core.rdma.match``,
the rule); the others are dropped as GPU sets that cannot serve.
"""

from nova_gpu.core import rdma
from nova_gpu.scheduler import hosts as hosts_mod


def scope_of(spec):
    """The locality ``spec`` pairs GPUs and NICs in, or None."""
    return spec.alternatives[0].rdma if spec.alternatives else None


def paired(entry, spec, candidates, gpu_sets):
    """``gpu_sets`` (one per candidate) with ``hosts.LOST`` in place of
    each candidate whose NIC VFs do not pair every one of its GPUs; as it
    is for a request without ``gpu:rdma``.
    """
    scope = scope_of(spec)
    tree = entry.host.pcie
    if scope is None:
        return gpu_sets
    result = []
    for gpus, candidate in zip(gpu_sets, candidates):
        if gpus is None or gpus is hosts_mod.LOST:
            result.append(gpus)
            continue
        unpaired = (gpus if tree is None else rdma.match(
            tree, gpus, entry.nic_vfs(candidate), scope)[1])
        result.append(hosts_mod.LOST if unpaired else gpus)
    return tuple(result)


def why_none(entry, spec):
    """Why none of Placement's candidates pairs its GPUs with its NICs."""
    scope = scope_of(spec)
    word = 'PCIe switch' if scope == rdma.PCIE_SWITCH else 'root complex'
    if not entry.nic_uuids:
        return ('Placement offered no RDMA NIC VF provider this host\'s '
                'report names (NIC VFs not in Placement, or the report '
                'without its PCIe tree)')
    return ('Placement offered no candidate whose RDMA NIC VFs sit under '
            'the same %s as its GPUs' % word)
