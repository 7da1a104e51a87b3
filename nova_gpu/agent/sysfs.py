"""Read (and, through privsep, write) what the kernel shows in sysfs.

Only plain file reads here: PCI functions of NVIDIA GPUs, their NUMA node,
IOMMU group and bound driver, mdev parents and types, the NVIDIA vendor
VFIO files of SR-IOV virtual functions, and active mdev devices. The root
is configurable so tests can point it at a fake tree.
"""

import dataclasses
import os
import re

from nova_gpu.agent import errors

NVIDIA_VENDOR = '0x10de'
# Anchored with \A...\Z, never '^...$': '$' also matches before a final
# newline, so '0000:3b:00.0\n' (as read from a file) would pass. Other
# modules use these patterns with .match().
PCI_ADDR_RE = re.compile(
    r'\A[0-9a-f]{4}:[0-9a-f]{2}:[0-1][0-9a-f]\.[0-7]\Z')
UUID_RE = re.compile(r'\A[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-'
                     r'[0-9a-f]{12}\Z')
# GPU (0x0300 VGA, 0x0302 3D controller)
GPU_CLASSES = ('0x030000', '0x030200')


def is_pci_address(text):
    """True if ``text`` is exactly a PCI address (``0000:3b:00.0``)."""
    return isinstance(text, str) and PCI_ADDR_RE.fullmatch(text) is not None


def is_uuid(text):
    """True if ``text`` is exactly a lower-case UUID."""
    return isinstance(text, str) and UUID_RE.fullmatch(text) is not None


@dataclasses.dataclass
class MdevType:
    id: str
    name: str
    available: int
    device_api: str = ''
    description: str = ''


@dataclasses.dataclass
class PciFunction:
    address: str
    device_id: str
    numa_node: int
    iommu_group: int = None
    group_members: tuple = ()
    driver: str = None
    sysfs_path: str = ''
    bridges: tuple = ()           # PCI bridges from the root port down
    physfn: str = None            # the PF of an SR-IOV virtual function
    vfs: tuple = ()               # VFs of a PF
    mdev_types: dict = dataclasses.field(default_factory=dict)
    creatable_vgpu_types: dict = dataclasses.field(default_factory=dict)
    current_vgpu_type: int = None  # None: no NVIDIA vendor VFIO files
    vendor_id: str = NVIDIA_VENDOR[2:]

    @property
    def vendor_vfio(self):
        """A VF of NVIDIA's vendor-specific VFIO driver (vGPU 17+).

        It shows ``nvidia/current_vgpu_type`` and no mdev types.
        """
        return self.current_vgpu_type is not None and not self.mdev_types

    @property
    def pcie_switch(self):
        """The bridge that GPUs behind one PCIe switch share.

        Below a root port a switch shows as upstream port -> downstream
        port -> device, so the upstream port identifies the switch; a GPU
        directly on a root port has none of its own.
        """
        if len(self.bridges) >= 3:
            return self.bridges[1]
        return self.bridges[0] if self.bridges else None


@dataclasses.dataclass
class Mdev:
    uuid: str
    parent: str
    type_id: str
    iommu_group: int = None


def read_text(path, default=None):
    """The stripped text of a sysfs file, or ``default`` when unreadable."""
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return default


def _link_name(path):
    try:
        return os.path.basename(os.readlink(path))
    except OSError:
        return None


def parse_creatable(text):
    """``creatable_vgpu_types`` -> {type id: name}; the header is skipped."""
    result = {}
    for line in (text or '').splitlines():
        key, sep, name = line.partition(':')
        key = key.strip()
        if sep and key.isdigit():
            result[int(key)] = name.strip()
    return result


class Sysfs:
    def __init__(self, root='/sys'):
        self.root = root

    def path(self, *parts):
        return os.path.join(self.root, *parts)

    def exists(self):
        return os.path.isdir(self.path('bus', 'pci', 'devices'))

    def check(self):
        """Raise ``NotFound`` unless the root shows a PCI bus."""
        if not os.path.isdir(self.root):
            raise errors.NotFound('sysfs root %s does not exist'
                                  % self.root)
        if not self.exists():
            raise errors.NotFound('sysfs root %s has no PCI bus (no %s); '
                                  'is sysfs mounted there?'
                                  % (self.root, self.path('bus', 'pci',
                                                          'devices')))

    # -- PCI --------------------------------------------------------------

    def pci_addresses(self):
        try:
            return sorted(os.listdir(self.path('bus', 'pci', 'devices')))
        except OSError:
            return []

    def nvidia_gpus(self):
        """NVIDIA display/3D PCI functions: PFs and VFs, by address."""
        result = {}
        for addr in self.pci_addresses():
            base = self.path('bus', 'pci', 'devices', addr)
            if (read_text(os.path.join(base, 'vendor')) != NVIDIA_VENDOR
                    or read_text(os.path.join(base, 'class'))
                    not in GPU_CLASSES):
                continue
            result[addr] = self.pci_function(addr)
        return result

    def pci_function(self, addr):
        if not is_pci_address(addr):
            raise errors.InvalidName('not a PCI address: %r' % (addr,))
        base = self.path('bus', 'pci', 'devices', addr)
        if not os.path.isdir(base):
            raise errors.NotFound('PCI device %s does not exist (no %s)'
                                  % (addr, base))
        real = os.path.realpath(base)
        rel = os.path.relpath(real, os.path.realpath(self.path('devices')))
        parts = rel.split(os.sep)
        bridges = tuple(p for p in parts[1:-1] if is_pci_address(p))
        group = _link_name(os.path.join(base, 'iommu_group'))
        members = ()
        if group is not None:
            try:
                members = tuple(sorted(os.listdir(self.path(
                    'kernel', 'iommu_groups', group, 'devices'))))
            except OSError:
                members = (addr,)
        numa = read_text(os.path.join(base, 'numa_node'), '-1')
        vfs = sorted((n for n in os.listdir(base) if n.startswith('virtfn')),
                     key=lambda n: int(n[6:]))
        fn = PciFunction(
            address=addr,
            device_id=(read_text(os.path.join(base, 'device')) or '')[2:],
            vendor_id=(read_text(os.path.join(base, 'vendor'))
                       or NVIDIA_VENDOR)[2:],
            numa_node=max(int(numa), 0) if numa.lstrip('-').isdigit()
            else 0,
            iommu_group=int(group) if group and group.isdigit() else None,
            group_members=members,
            driver=_link_name(os.path.join(base, 'driver')),
            sysfs_path=real, bridges=bridges,
            physfn=_link_name(os.path.join(base, 'physfn')),
            vfs=tuple(_link_name(os.path.join(base, v)) for v in vfs),
            mdev_types=self.mdev_types(addr))
        vendor_dir = os.path.join(base, 'nvidia')
        if os.path.isdir(vendor_dir):
            fn.creatable_vgpu_types = parse_creatable(
                read_text(os.path.join(vendor_dir, 'creatable_vgpu_types')))
            current = read_text(os.path.join(vendor_dir, 'current_vgpu_type'))
            fn.current_vgpu_type = int(current) if current and \
                current.isdigit() else None
        return fn

    def sriov_pfs(self):
        """``{PF address: (sriov_numvfs, sriov_totalvfs)}`` of the NVIDIA
        GPUs that are SR-IOV physical functions.
        """
        result = {}
        for addr, fn in self.nvidia_gpus().items():
            if fn.physfn:
                continue
            counts = self.sriov_counts(addr)
            if counts is not None:
                result[addr] = counts
        return result

    def sriov_counts(self, addr):
        """``(sriov_numvfs, sriov_totalvfs)`` of PF ``addr``, or None when
        it has no SR-IOV capability.
        """
        base = self.path('bus', 'pci', 'devices', addr)
        num = read_text(os.path.join(base, 'sriov_numvfs'))
        total = read_text(os.path.join(base, 'sriov_totalvfs'))
        if not (num and total and num.isdigit() and total.isdigit()):
            return None
        return int(num), int(total)

    # -- mdev -------------------------------------------------------------

    def mdev_types(self, addr):
        base = self.path('bus', 'pci', 'devices', addr, 'mdev_supported_types')
        result = {}
        try:
            names = sorted(os.listdir(base))
        except OSError:
            return result
        for type_id in names:
            d = os.path.join(base, type_id)
            avail = read_text(os.path.join(d, 'available_instances'), '0')
            result[type_id] = MdevType(
                id=type_id, name=read_text(os.path.join(d, 'name'), type_id),
                available=int(avail) if avail.isdigit() else 0,
                device_api=read_text(os.path.join(d, 'device_api'), ''),
                description=read_text(os.path.join(d, 'description'), ''))
        return result

    def mdevs(self):
        """Active mdev devices, by UUID."""
        base = self.path('bus', 'mdev', 'devices')
        result = {}
        try:
            names = os.listdir(base)
        except OSError:
            return result
        for uuid in sorted(names):
            d = os.path.join(base, uuid)
            real = os.path.realpath(d)
            group = _link_name(os.path.join(d, 'iommu_group'))
            result[uuid] = Mdev(
                uuid=uuid, parent=os.path.basename(os.path.dirname(real)),
                type_id=_link_name(os.path.join(d, 'mdev_type')),
                iommu_group=int(group) if group and group.isdigit()
                else None)
        return result

    def mdev_active(self, uuid):
        return os.path.lexists(self.path('bus', 'mdev', 'devices', uuid))

    # -- NVIDIA vendor VFIO (SR-IOV VFs) ----------------------------------

    def vgpu_type_file(self, vf):
        return self.path('bus', 'pci', 'devices', vf, 'nvidia',
                         'current_vgpu_type')
