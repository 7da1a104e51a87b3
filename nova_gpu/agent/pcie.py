"""The host's PCIe tree, read from sysfs, for GPUDirect RDMA pairing.

What ``core.rdma`` needs to pair each GPU with an RDMA NIC VF below the
same PCIe switch (or root complex), read from plain sysfs files:

* where a device sits: ``/sys/bus/pci/devices/<address>`` links to its
  place under ``/sys/devices/pci<domain>:<bus>/<root port>/...``; the
  first part names the root complex (its host bridge, ``pci0000:15``),
  the PCI addresses after it the bridges from the root port down. Below
  a root port a PCIe switch shows as its upstream port, then one of its
  downstream ports (both class 0x0604, PCI-to-PCI bridge), then the
  device: the upstream port names the switch (``sysfs.PciFunction.
  pcie_switch``, the same rule the GPU entries' ``pcie_switch`` uses);
* the switch's ACS state: the ACS extended capability (ID 0x000d) in the
  config space of its downstream ports (``config``, 4096 bytes when the
  reader may read past the header: root, or CAP_SYS_ADMIN; an
  unprivileged read gets the first 64 bytes only, and the state is then
  reported unknown). A port redirects peer-to-peer requests upstream when
  P2P Request Redirect (bit 2 of the ACS Control register) is on and
  Direct Translated P2P (bit 6) is off; a switch redirects when one of
  its downstream ports does;
* RDMA NICs: Mellanox/NVIDIA (vendor 0x15b3) physical functions of
  network (0x02) or InfiniBand (0x0207) class with SR-IOV VFs
  (``virtfn<N>`` links); a VF bound to ``vfio-pci`` is counted as held
  by a guest (Nova's libvirt driver binds a passed-through VF to vfio-pci
  for the guest; the host's ``mlx5_core`` holds a free one).

No writes, no privileges needed beyond reading sysfs (ACS aside).
"""

import os
import struct

from nova_gpu.agent import sysfs as sysfs_mod
from nova_gpu.core import rdma as rdma_mod
from nova_gpu.core import report as report_mod

MELLANOX_VENDOR = '0x15b3'
# PCI class codes: network controllers (0x02xxxx: Ethernet 0x0200,
# InfiniBand 0x0207) and PCI-to-PCI bridges (0x0604xx).
NETWORK_CLASS = '0x02'
BRIDGE_CLASS = '0x0604'
VFIO_DRIVER = 'vfio-pci'

# PCIe extended capabilities start at 0x100 of the config space; ACS is
# ID 0x000d, its Control register at +6 of the capability.
EXT_CAP_START = 0x100
ACS_CAP_ID = 0x000d
ACS_P2P_REQUEST_REDIRECT = 1 << 2
ACS_DIRECT_TRANSLATED_P2P = 1 << 6
# A capability list longer than this is corrupt (at most 4 KiB / 4 bytes).
_MAX_CAPS = 1024


def acs_control(config):
    """The ACS Control register in ``config`` (a device's config space,
    bytes), or None when the config space read holds no extended
    capabilities or no ACS capability.
    """
    offset, seen = EXT_CAP_START, 0
    while offset and offset + 8 <= len(config) and seen < _MAX_CAPS:
        header, = struct.unpack_from('<I', config, offset)
        if header in (0, 0xffffffff):
            return None
        if header & 0xffff == ACS_CAP_ID:
            return struct.unpack_from('<H', config, offset + 6)[0]
        offset = (header >> 20) & 0xffc
        seen += 1
    return None


def redirects(control):
    """Whether ACS Control value ``control`` sends peer-to-peer requests
    through the root complex.
    """
    return bool(control & ACS_P2P_REQUEST_REDIRECT
                and not control & ACS_DIRECT_TRANSLATED_P2P)


class PcieReader:
    """Reads the tree of one host's sysfs (``sysfs.Sysfs``)."""

    def __init__(self, sysfs):
        self.sysfs = sysfs

    def _base(self, address):
        return self.sysfs.path('bus', 'pci', 'devices', address)

    def _attr(self, address, name):
        return sysfs_mod.read_text(os.path.join(self._base(address), name))

    def place(self, address):
        """``(root complex, switch)`` of the device at ``address``."""
        real = os.path.realpath(self._base(address))
        rel = os.path.relpath(real, os.path.realpath(
            self.sysfs.path('devices')))
        parts = rel.split(os.sep)
        root = parts[0] if parts and parts[0].startswith('pci') else None
        fn = sysfs_mod.PciFunction(
            address, '', 0, bridges=tuple(
                p for p in parts[1:-1] if sysfs_mod.is_pci_address(p)))
        return root, (fn.pcie_switch if len(fn.bridges) >= 3 else None)

    def downstream_ports(self, switch):
        """The bridges right below the switch's upstream port."""
        base = os.path.realpath(self._base(switch))
        try:
            names = sorted(os.listdir(base))
        except OSError:
            return []
        return [n for n in names if sysfs_mod.is_pci_address(n)
                and (self._attr(n, 'class') or '').startswith(BRIDGE_CLASS)]

    def acs_redirect(self, switch):
        """True/False whether a downstream port of ``switch`` redirects
        peer-to-peer requests; None when no port's ACS could be read.
        """
        found = None
        for port in self.downstream_ports(switch):
            try:
                with open(os.path.join(self._base(port), 'config'),
                          'rb') as f:
                    config = f.read(4096)
            except OSError:
                continue
            control = acs_control(config)
            if control is None:
                continue
            if redirects(control):
                return True
            found = False
        return found

    def device_id(self, address):
        vendor = self._attr(address, 'vendor') or ''
        device = self._attr(address, 'device') or ''
        if vendor.startswith('0x') and device.startswith('0x'):
            return '%s:%s' % (vendor[2:].lower(), device[2:].lower())
        return None

    def rdma_nics(self):
        """Addresses of the RDMA NIC PFs with SR-IOV VFs."""
        found = []
        for address in self.sysfs.pci_addresses():
            base = self._base(address)
            if (self._attr(address, 'vendor') != MELLANOX_VENDOR
                    or not (self._attr(address, 'class') or '').startswith(
                        NETWORK_CLASS)
                    or os.path.lexists(os.path.join(base, 'physfn'))):
                continue
            found.append(address)
        return found

    def vfs(self, address):
        """The VF addresses of PF ``address``."""
        base = self._base(address)
        try:
            names = [n for n in os.listdir(base) if n.startswith('virtfn')
                     and n[6:].isdigit()]
        except OSError:
            return []
        names.sort(key=lambda n: int(n[6:]))
        return [os.path.basename(os.readlink(os.path.join(base, n)))
                for n in names]

    def read(self, gpu_addresses, nodename):
        """The ``core.rdma.PcieTree`` of the GPUs at ``gpu_addresses`` (in
        host GPU index order) and every RDMA NIC; VF providers named as
        Nova's PCI in Placement names them on ``nodename``.
        """
        gpus = []
        switches = {}
        for address in gpu_addresses:
            root, switch = self.place(address) if address else (None, None)
            gpus.append((switch, root))
            if switch is not None:
                switches[switch] = root
        nics = []
        for address in self.rdma_nics()[:rdma_mod.MAX_NICS]:
            root, switch = self.place(address)
            if switch is not None:
                switches[switch] = root
            vfs = self.vfs(address)[:rdma_mod.MAX_VFS]
            used = sum(1 for vf in vfs if os.path.basename(os.path.realpath(
                os.path.join(self._base(vf), 'driver'))) == VFIO_DRIVER
                and os.path.lexists(os.path.join(self._base(vf), 'driver')))
            nics.append(rdma_mod.Nic(
                address, switch, root, len(vfs), used,
                report_mod.pci_provider_name(nodename, address) if vfs
                else None, self.device_id(address)))
        tree_switches = [
            rdma_mod.Switch(sw, root, self.acs_redirect(sw),
                            self.device_id(sw))
            for sw, root in sorted(switches.items())]
        return rdma_mod.PcieTree(gpus, nics, tree_switches)


def read_tree(sysfs, gpu_addresses, nodename):
    """``PcieReader(sysfs).read(gpu_addresses, nodename)``."""
    return PcieReader(sysfs).read(gpu_addresses, nodename)
