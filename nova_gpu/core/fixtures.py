"""Host layouts shaped like real GPU servers, for tests, demo and benches.

These describe hardware we model (PCI addresses, NUMA nodes, PCIe
switches, NVLink): they are data, not fakes of any OpenStack service.
"""

from nova_gpu.core import host as host_mod


def hgx_host(name, model, gpus=8, numa_nodes=2, cpu_milli=224000,
             memory_mib=2 * 1024 * 1024, mig=False, vgpu_types=None,
             partitions=None):
    """An HGX-style server: NVSwitch between all GPUs, two per switch.

    ``partitions`` (a ``partitions.PartitionTable``): the host is in
    Fabric Manager's Shared NVSwitch mode.
    """
    per_node = gpus // numa_nodes or 1
    devices = []
    for i in range(gpus):
        bus = 0x18 + 0x20 * i
        devices.append(host_mod.Gpu(
            i, model, address='0000:%02x:00.0' % bus,
            numa_node=i // per_node,
            pcie_switch='0000:%02x:00.0' % (bus - 2 - (i % 2) * 0x20),
            nvlink_peers=[j for j in range(gpus) if j != i and model.nvlink],
            mig_enabled=mig, vgpu_types=vgpu_types))
    cells = [host_mod.NumaCell(n, cpu_milli // numa_nodes,
                               memory_mib // numa_nodes)
             for n in range(numa_nodes)]
    return host_mod.Host(name, devices, cpu_milli, memory_mib, cells,
                         partitions)


def pcie_host(name, model, gpus=4, numa_nodes=2, cpu_milli=96000,
              memory_mib=768 * 1024, mig=False, vgpu_types=None):
    """A PCIe server: no NVLink, each GPU under its own root port."""
    per_node = gpus // numa_nodes or 1
    devices = [host_mod.Gpu(
        i, model, address='0000:%02x:00.0' % (0x3b + 0x40 * i),
        numa_node=i // per_node, pcie_switch=None, nvlink_peers=(),
        mig_enabled=mig, vgpu_types=vgpu_types) for i in range(gpus)]
    cells = [host_mod.NumaCell(n, cpu_milli // numa_nodes,
                               memory_mib // numa_nodes)
             for n in range(numa_nodes)]
    return host_mod.Host(name, devices, cpu_milli, memory_mib, cells)
