"""Merge what NVML, sysfs and libvirt say about the GPUs of this host.

Each source is optional. The result is a ``HostInventory``: the core
``host.Host`` the scheduler reasons about, plus per-GPU facts only the
agent needs (IOMMU group, driver, mdev types, VFs, devices), and the host
GPU report built with ``nova_gpu.core.report``.
"""

import dataclasses
import re

from oslo_log import log as logging

from nova_gpu.agent import sysfs as sysfs_mod
from nova_gpu.core import catalog as catalog_mod
from nova_gpu.core import exceptions
from nova_gpu.core import host as host_mod
from nova_gpu.core import report as report_mod

LOG = logging.getLogger(__name__)
_VENDOR_PREFIX = re.compile(r'^(GRID|NVIDIA)\s+', re.I)


def provider_name(nodename, address):
    """Name nova-compute gives the resource provider of a PCI GPU."""
    return '%s_pci_%s' % (nodename, re.sub(r'[:.]', '_', address))


def trait_part(text):
    return re.sub(r'[^A-Z0-9]+', '_', str(text).upper()).strip('_')


@dataclasses.dataclass
class GpuRecord:
    index: int
    address: str
    model: object                       # catalog.GpuModel
    pci: object = None                  # sysfs.PciFunction
    nvml: object = None                 # nvml.NvmlGpu
    numa_node: int = 0
    pcie_switch: str = None
    nvlink_peers: set = dataclasses.field(default_factory=set)
    nvlink_domain: int = None
    mdevs: list = dataclasses.field(default_factory=list)
    vf_vgpus: dict = dataclasses.field(default_factory=dict)  # vf -> id
    mig_slots: list = dataclasses.field(default_factory=list)
    vf_functions: tuple = ()            # sysfs.PciFunction of each VF

    @property
    def vgpu_profiles(self):
        """Catalog vGPU profile names this GPU offers (mdev or VF)."""
        names = []
        if self.pci is not None:
            for t in self.pci.mdev_types.values():
                names.append(_VENDOR_PREFIX.sub('', t.name))
        for vf in self.vfs():
            names.extend(_VENDOR_PREFIX.sub('', n)
                         for n in vf.creatable_vgpu_types.values())
        if self.nvml is not None:
            names.extend(_VENDOR_PREFIX.sub('', n) for n in
                         self.nvml.supported_vgpu_types.values())
        return sorted({n for n in names if n in self.model.vgpu_profiles})

    def vfs(self):
        return self.vf_functions

    def traits(self):
        result = ['CUSTOM_GPU_MODEL_' + trait_part(self.model.name),
                  'CUSTOM_GPU_NUMA_%d' % self.numa_node]
        if self.nvlink_domain is not None:
            result.append('CUSTOM_GPU_NVLINK_%d' % self.nvlink_domain)
        if self.nvml is not None and self.nvml.mig_enabled:
            result.append('CUSTOM_GPU_MIG')
        return result

    def provider_addresses(self):
        """The PF, plus VFs that are mdev parents.

        Nova gives each mdev parent its own resource provider.
        """
        return [self.address] + [vf.address for vf in self.vfs()
                                 if vf.mdev_types]


@dataclasses.dataclass
class HostInventory:
    host: object                         # core host.Host
    gpus: list
    nodename: str
    sources: dict

    def report(self, generation=0):
        data = report_mod.host_to_dict(
            self.host, nodename=self.nodename, generation=generation,
            providers={g.index: provider_name(self.nodename, g.address)
                       for g in self.gpus},
            devices={g.index: self._devices(g) for g in self.gpus})
        # Additive fields (ignored by report.host_from_dict): what the
        # agent knows beyond the scheduling model.
        data['agent'] = {'sources': self.sources}
        for raw, g in zip(data['gpus'], self.gpus):
            pci = g.pci
            raw['traits'] = g.traits()
            raw['nvlink_domain'] = g.nvlink_domain
            raw['iommu_group'] = pci.iommu_group if pci else None
            raw['driver'] = pci.driver if pci else None
            raw['mdev_types'] = {
                t.id: {'name': t.name, 'available': t.available}
                for t in (pci.mdev_types.values() if pci else ())}
            raw['vfs'] = [{'address': vf.address,
                           'current_vgpu_type': vf.current_vgpu_type,
                           'creatable_vgpu_types': {
                               str(k): v for k, v in
                               vf.creatable_vgpu_types.items()}}
                          for vf in g.vfs()]
        return data

    @staticmethod
    def _devices(g):
        devices = [{'kind': host_mod.VGPU, 'detail': name, 'uuid': uuid}
                   for uuid, name in g.mdevs]
        devices += [{'kind': host_mod.VGPU, 'detail': name, 'vf': vf}
                    for vf, name in sorted(g.vf_vgpus.items())]
        devices += [{'kind': host_mod.MIG, 'detail': list(detail)}
                    for detail in g.mig_slots]
        return devices

    def gpu_by_address(self, address):
        for g in self.gpus:
            if g.address == address or address in [
                    vf.address for vf in g.vfs()]:
                return g
        return None


class Discovery:
    def __init__(self, sysfs, nvml=None, catalog=None, host='localhost',
                 nodename=None, libvirt=None, cpu_milli=0, memory_mib=0):
        self.sysfs = sysfs
        self.nvml = nvml
        self.catalog = catalog or catalog_mod.load_catalog()
        self.hostname = host
        self.nodename = nodename or host
        self.libvirt = libvirt
        self.cpu_milli = cpu_milli
        self.memory_mib = memory_mib

    def discover(self):
        sources = {'sysfs': self.sysfs.exists(),
                   'nvml': bool(self.nvml and self.nvml.available),
                   'libvirt': False}
        pci = self.sysfs.nvidia_gpus()
        nvml_gpus = self.nvml.gpus() if sources['nvml'] else []
        by_addr = {g.address: g for g in nvml_gpus}
        pfs = [a for a, f in pci.items() if not f.physfn]
        if nvml_gpus:
            order = [g.address for g in nvml_gpus]
            order += [a for a in pfs if a not in by_addr]
        else:
            order = sorted(pfs)
        if self.libvirt is not None:
            # libvirt's node devices confirm what it can hand to guests;
            # a GPU only libvirt knows (sysfs not mounted as expected) is
            # still listed.
            try:
                for info in self.libvirt.pci_devices():
                    sources['libvirt'] = True
                    addr = _nodedev_address(info)
                    if (addr and addr not in order and addr in pci
                            and not pci[addr].physfn):
                        order.append(addr)
            except Exception:  # libvirt is optional for discovery
                sources['libvirt'] = False
        records = []
        for index, addr in enumerate(order):
            fn = pci.get(addr)
            nv = by_addr.get(addr)
            model = self._model(fn, nv)
            rec = GpuRecord(index=index, address=addr, model=model, pci=fn,
                            nvml=nv)
            rec.vf_functions = tuple(
                pci[v] for v in (fn.vfs if fn else ()) if v in pci)
            rec.numa_node = (fn.numa_node if fn else None)
            if rec.numa_node is None:
                rec.numa_node = (nv.numa_node if nv and nv.numa_node
                                 is not None else 0)
            # sysfs shows the bridges; NVML's common ancestor is the
            # fallback when sysfs is not there.
            rec.pcie_switch = (fn.pcie_switch if fn and fn.bridges
                               else nv.pcie_group if nv else None)
            records.append(rec)
        self._nvlinks(records)
        self._devices(records)
        gpus = [host_mod.Gpu(
            r.index, r.model, address=r.address, numa_node=r.numa_node,
            pcie_switch=r.pcie_switch, nvlink_peers=r.nvlink_peers,
            mig_enabled=bool(r.nvml and r.nvml.mig_enabled
                             and r.model.mig_capable),
            vgpu_types=r.vgpu_profiles or None) for r in records]
        host = host_mod.Host(self.hostname, gpus, self.cpu_milli,
                             self.memory_mib)
        for r in records:
            self._account(host.gpus[r.index], r)
        return HostInventory(host=host, gpus=records,
                             nodename=self.nodename, sources=sources)

    @staticmethod
    def _account(gpu, record):
        """Mark what the devices on a GPU take, as the scheduler will."""
        slots = [host_mod.Slot(gpu.index, host_mod.VGPU, name)
                 for _, name in record.mdevs] + [
            host_mod.Slot(gpu.index, host_mod.VGPU, name)
            for name in record.vf_vgpus.values()] + [
            host_mod.Slot(gpu.index, host_mod.MIG, detail)
            for detail in record.mig_slots]
        for slot in slots:
            try:
                gpu.take(slot)
            except (exceptions.GpuError, KeyError) as e:
                LOG.warning('GPU %s: device %s does not fit the catalog '
                            'model (%s); not counted', record.address,
                            slot.detail, e)

    def _model(self, fn, nv):
        model = None
        if nv is not None:
            model = self.catalog.model_for_nvml_name(nv.name)
        if model is None and fn is not None:
            model = self.catalog.model_for_pci(fn.device_id)
        if model is None:
            name = nv.name if nv else 'PCI-10DE-%s' % (
                fn.device_id.upper() if fn else 'UNKNOWN')
            model = catalog_mod.GpuModel.generic(
                name, nv.memory_mib if nv else 0)
        return model

    @staticmethod
    def _nvlinks(records):
        """Peers and NVLink domains from the far ends of each GPU's links.

        A link ends at another GPU (direct NVLink) or at an NVSwitch; GPUs
        reaching a common switch talk over NVLink too.
        """
        index_of = {r.address: r.index for r in records}
        ends = {}
        for r in records:
            for remote in (r.nvml.nvlink_remotes if r.nvml else ()):
                if remote in index_of:
                    r.nvlink_peers.add(index_of[remote])
                else:
                    ends.setdefault(remote, set()).add(r.index)
        for members in ends.values():
            for i in members:
                records[i].nvlink_peers |= members - {i}
        for r in records:
            for p in list(r.nvlink_peers):
                records[p].nvlink_peers.add(r.index)
        seen = set()
        for r in records:
            if r.index in seen or not r.nvlink_peers:
                continue
            stack, component = [r.index], set()
            while stack:
                i = stack.pop()
                if i not in component:
                    component.add(i)
                    stack.extend(records[i].nvlink_peers)
            seen |= component
            for i in component:
                records[i].nvlink_domain = min(component)

    def _devices(self, records):
        mdevs = self.sysfs.mdevs()
        by_parent = {}
        for m in mdevs.values():
            by_parent.setdefault(m.parent, []).append(m)
        for r in records:
            parents = [r.address] + [vf.address for vf in r.vfs()]
            for parent in parents:
                fn = r.pci if parent == r.address else next(
                    vf for vf in r.vfs() if vf.address == parent)
                for m in by_parent.get(parent, ()):
                    t = fn.mdev_types.get(m.type_id) if fn else None
                    name = _VENDOR_PREFIX.sub('', t.name) if t else m.type_id
                    r.mdevs.append((m.uuid, name))
            for vf in r.vfs():
                if vf.current_vgpu_type:
                    name = vf.creatable_vgpu_types.get(
                        vf.current_vgpu_type, str(vf.current_vgpu_type))
                    r.vf_vgpus[vf.address] = _VENDOR_PREFIX.sub('', name)
            if r.nvml is not None and r.nvml.mig_enabled and \
                    r.model.mig_capable:
                for inst in r.nvml.mig_instances:
                    name = mig_profile_name(r.model, inst)
                    if name:
                        r.mig_slots.append((name, inst.start, None))


def mig_profile_name(model, inst):
    """Catalog MIG profile of an NVML GPU instance (by its slice shape)."""
    candidates = [p for p in model.mig.profiles.values()
                  if p.compute_slices == inst.compute_slices
                  and p.memory_slices == inst.size]
    candidates.sort(key=lambda p: p.name.endswith('+me'))
    return candidates[0].name if candidates else None


def _nodedev_address(info):
    path = info.get('path') or ''
    tail = path.rstrip('/').rsplit('/', 1)[-1]
    return tail if sysfs_mod.PCI_ADDR_RE.match(tail) else None
