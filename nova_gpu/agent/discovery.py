"""Merge what NVML, sysfs and libvirt say about the GPUs of this host.

Each source is optional. The result is a ``HostInventory``: the core
``host.Host`` the scheduler reasons about, plus per-GPU facts only the
agent needs (IOMMU group, driver, mdev types, VFs, devices), and the host
GPU report built with ``nova_gpu.core.report``.

The report lists, per physical GPU, every Placement resource provider
Nova 34 makes for it or a part of it (``GpuRecord.providers``), named by
the wire contract's functions in ``nova_gpu.core.report`` only.
"""

import collections
import dataclasses
import re

from oslo_log import log as logging

from nova_gpu.agent import fabric
from nova_gpu.agent import pcie as pcie_mod
from nova_gpu.agent import sysfs as sysfs_mod
from nova_gpu.core import catalog as catalog_mod
from nova_gpu.core import exceptions
from nova_gpu.core import host as host_mod
from nova_gpu.core import mixed_size
from nova_gpu.core import report as report_mod

LOG = logging.getLogger(__name__)
_VENDOR_PREFIX = re.compile(r'^(GRID|NVIDIA)\s+', re.I)


# Why a MIG-backed VF's provider carries no MIG slot (yet): nvml.py reads
# GPU instances but no vGPU instances, so nothing maps a VF to the GPU
# instance behind it (NVML tells that only for a running vGPU, through
# nvmlDeviceGetActiveVgpus + nvmlVgpuInstanceGetGpuInstanceId).
MIG_SLOT_UNKNOWN = ('NVML does not say which GPU instance backs the vGPU '
                    'of a VF')


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
    # mdev parent address (PF or VF) -> UUIDs of the mdevs on it
    mdev_parents: dict = dataclasses.field(default_factory=dict)
    # UUIDs of the mdevs no libvirt domain refers to (empty when libvirt
    # cannot say): room Nova gives the next guest of their type.
    idle_mdevs: set = dataclasses.field(default_factory=set)
    # Start slices of the GPU instances no guest's vGPU holds (see
    # Discovery._idle_gpu_instances): room for MIG-backed vGPUs.
    idle_gpu_instances: set = dataclasses.field(default_factory=set)
    # GPU instance start slice -> UUID of the domain whose MIG-backed vGPU
    # runs on it (NVML's vGPU -> GPU instance and mdev UUID, libvirt's
    # mdev -> domain), for the report's device ``instance``.
    mig_holders: dict = dataclasses.field(default_factory=dict)
    # mdev UUID or VF address -> UUID of the libvirt domain (the Nova
    # instance) that holds it, for "openstack gpu server show"
    holders: dict = dataclasses.field(default_factory=dict)

    @property
    def vgpu_profiles(self):
        """Catalog vGPU profile names this GPU offers (mdev or VF).

        For a GPU with vendor-VFIO VFs: the types a VF can be given now
        (``vendor_vfio_types``), since the ``qemu`` hook types a VF just in
        time and the scheduler must place only where that will succeed.
        """
        vendor = [vf for vf in self.vfs() if vf.current_vgpu_type is not None]
        if vendor:
            return self.vendor_vfio_types(vendor)
        names = []
        if self.pci is not None:
            for t in self.pci.mdev_types.values():
                names.append(_VENDOR_PREFIX.sub('', t.name))
        for vf in self.vfs():
            # SR-IOV + mdev: the types are the VFs' mdev types.
            names.extend(_VENDOR_PREFIX.sub('', t.name)
                         for t in vf.mdev_types.values())
            names.extend(_VENDOR_PREFIX.sub('', n)
                         for n in vf.creatable_vgpu_types.values())
        if self.nvml is not None:
            names.extend(_VENDOR_PREFIX.sub('', n) for n in
                         self.nvml.supported_vgpu_types.values())
        return sorted({n for n in names if n in self.model.vgpu_profiles})

    def vendor_vfio_types(self, vfs):
        """Types that one of the GPU's vendor-VFIO ``vfs`` can take now
        (``settable_types`` of the types set and the untyped VFs' lists).
        """
        typed, creatable = [], set()
        for vf in vfs:
            if vf.current_vgpu_type:
                typed.append(self.vf_type_name(vf))
            else:
                creatable.update(vf.creatable_vgpu_types.values())
        return settable_types(self.model, typed, creatable,
                              mixed=bool(self.nvml and self.nvml.mixed_size))

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

    def providers(self, nodename, resource_classes=None):
        """Every Placement provider Nova 34 makes for this GPU.

        One dict per provider (``name``, ``kind``, ``address``,
        ``resource_class``, ``vgpu_type``, ``vfs``, ``mig``), in the
        order: PF, then VFs. Which shape the GPU has is read from sysfs:

        * mdev types on the PF (T4, V100, P100): one ``pf_mdev`` VGPU
          provider. nova/virt/libvirt/driver.py ``_get_mdev_capable_devices``
          lists every mdev-capable device and ``_ensure_pgpu_providers``
          makes one child provider ``<nodename>_pci_<address>`` for each.
        * SR-IOV + mdev (mdev types on the VFs, NVIDIA vGPU 16 and older):
          the same code makes one ``vf_mdev`` VGPU provider per VF.
        * NVIDIA vendor-specific VFIO (VFs with ``nvidia/current_vgpu_type``
          and no mdev types, vGPU 17+): PCI in Placement. In
          nova/compute/pci_placement_translator.py a VF is a child device
          whose provider is named after its parent, ``PlacementView.
          _get_rp_name_for_child`` -> ``_get_rp_name_for_address
          (dev.parent_addr)`` = ``<hypervisor hostname>_<PF ADDRESS>``, so
          the VFs of one PF are pooled in one ``pci_pool`` provider.
        * Whole-GPU passthrough (PF bound to vfio-pci, no VFs, no mdev
          types): a parent device with its own provider
          ``<hypervisor hostname>_<ADDRESS>`` (``pci_device``).

        ``resource_classes`` maps a PF address, a catalog vGPU type name or
        a PCI product id to the resource class the operator's ``[pci]
        device_spec`` gives those devices; without an entry it is Nova's
        default ``CUSTOM_PCI_<vendor>_<product>``
        (``pci_placement_translator.get_resource_class``).
        """
        result = []
        pf = self.pci
        if pf is None:  # known to NVML only: Nova cannot see it either
            return result
        if pf.mdev_types:
            result.append(_provider(
                report_mod.PF_MDEV,
                report_mod.mdev_provider_name(nodename, pf.address),
                pf.address, report_mod.VGPU_RC, self._mdev_type(pf)))
        for vf in self.vfs():
            if vf.mdev_types:
                result.append(_provider(
                    report_mod.VF_MDEV,
                    report_mod.mdev_provider_name(nodename, vf.address),
                    vf.address, report_mod.VGPU_RC, self._mdev_type(vf),
                    mig=self._mig_slot(vf)))
        pooled = [vf for vf in self.vfs() if vf.vendor_vfio]
        if pooled:
            vgpu_type = self._pool_type(pooled)
            rc = _resource_class(resource_classes, pooled[0],
                                 (self.address, vgpu_type))
            result.append(_provider(
                report_mod.PCI_POOL,
                report_mod.pci_provider_name(nodename, self.address),
                self.address, rc, vgpu_type,
                vfs=[vf.address for vf in pooled]))
        elif not result and not self.vfs() and pf.driver == 'vfio-pci':
            result.append(_provider(
                report_mod.PCI_DEVICE,
                report_mod.pci_provider_name(nodename, self.address),
                self.address,
                _resource_class(resource_classes, pf, (self.address,)),
                None))
        return result

    def _catalog_type(self, name):
        """Catalog vGPU type of a driver's type name, or None."""
        name = _VENDOR_PREFIX.sub('', name or '')
        if name in self.model.vgpu_profiles:
            return name
        if name:
            LOG.debug('GPU %s: vGPU type %r is not in the catalog model %s',
                      self.address, name, self.model.name)
        return None

    def _mdev_type(self, fn):
        """The vGPU type Nova exposes on mdev parent ``fn``.

        Nova exposes one type per parent: the ``[mdev_<type>]
        device_addresses`` one, else the default enabled type
        (driver.py ``_get_vgpu_type_per_pgpu``). The agent does not read
        nova.conf, so it takes the type of an mdev already on the parent
        (Nova made it with the enabled type), else of any mdev on the
        same GPU (equal-size mode: one type per physical GPU), else the
        only type the parent offers or has room for; None if that still
        leaves a choice.
        """
        types = fn.mdev_types
        names = [name for uuid, name in self.mdevs
                 if uuid in self.mdev_parents.get(fn.address, ())]
        names = names or [name for _, name in self.mdevs]
        if names:
            return self._catalog_type(names[0])
        offered = list(types.values())
        if len(offered) != 1:
            offered = [t for t in offered if t.available > 0]
        if len(offered) == 1:
            return self._catalog_type(offered[0].name)
        return None

    def vf_type_name(self, vf):
        """Driver name of the vGPU type preset on ``vf`` (None if unknown).

        A VF may no longer list its own type as creatable; NVML names it.
        """
        type_id = vf.current_vgpu_type
        names = dict(self.nvml.supported_vgpu_types) if self.nvml else {}
        names.update(vf.creatable_vgpu_types)
        return names.get(type_id)

    def _pool_type(self, vfs):
        """The vGPU type preset on the pooled VFs (None if none or mixed).

        One pool has one resource class in Placement
        (``PciResourceProvider.add_child`` refuses mixed classes), so one
        type per pool is what Nova can serve.
        """
        preset = {self._catalog_type(self.vf_type_name(vf))
                  for vf in vfs if vf.current_vgpu_type}
        if len(preset) > 1:
            LOG.warning('GPU %s: its VFs have different vGPU types preset '
                        '(%s); one Placement pool serves one type',
                        self.address, ', '.join(sorted(map(str, preset))))
            return None
        return preset.pop() if preset else None

    def _mig_slot(self, vf):
        """[MIG profile, start] of the GPU instance behind ``vf``'s vGPU.

        Always None today; see ``MIG_SLOT_UNKNOWN``.
        """
        return None


def _provider(kind, name, address, resource_class, vgpu_type, vfs=(),
              mig=None):
    return {'name': name, 'kind': kind, 'address': address,
            'resource_class': resource_class, 'vgpu_type': vgpu_type,
            'vfs': list(vfs), 'mig': list(mig) if mig else None}


def settable_types(model, typed, creatable, mixed=False):
    """Catalog types a vendor-VFIO VF of a ``model`` GPU can take now.

    ``typed``: the driver names of the types set on the GPU's VFs;
    ``creatable``: what the driver lists in its untyped VFs'
    ``creatable_vgpu_types``. Both, unless a VF holds a time-sliced type
    and the card cannot mix time-sliced types (the catalog's
    ``time_sliced_mixing``; NVIDIA's equal-size mode, ``mixed`` False):
    then only that type. In mixed-size mode every type stays listed and
    the scheduler's fit rule (``core.mixed_size``) decides what fits.
    The GPU's other VFs can take no other, and Nova's PCI tracker may
    hand out the typed VF itself, so an idle typed VF counts too: a
    guest is never sent where the ``qemu`` hook must refuse its VF. The
    agent reports this to the scheduler and the hook types by it.

    NVIDIA's NVML reference, ``nvmlDeviceGetCreatableVgpus``: "if only one
    vGPU type is allowed at a time on a device, then the creatable list
    will be restricted to whatever vGPU type is already running on the
    device" (https://docs.nvidia.com/deploy/nvml-api/group__nvmlVgpu.html);
    heterogeneous mode (``nvmlDeviceSetVgpuHeterogeneousMode``) lifts that.
    """
    profiles = model.vgpu_profiles
    typed = {_VENDOR_PREFIX.sub('', n or '').strip() for n in typed}
    creatable = {_VENDOR_PREFIX.sub('', n or '').strip() for n in creatable}
    time_sliced = {n for n in typed
                   if n in profiles and not profiles[n].mig_backed}
    if time_sliced and not (model.time_sliced_mixing or mixed):
        names = time_sliced
    else:
        names = typed | creatable
    return sorted(n for n in names if n in profiles)


def resource_class_map(entries):
    """``[gpu_agent] pci_resource_classes`` (``KEY:CLASS`` entries) as a
    dict; the key may be a PCI address, so the last ``:`` separates.
    """
    if isinstance(entries, dict):
        return dict(entries)
    result = {}
    for entry in entries or ():
        key, sep, value = str(entry).strip().rpartition(':')
        if not sep or not key or not value:
            raise ValueError(
                '[gpu_agent] pci_resource_classes: %r is not KEY:CLASS (a '
                'PF address, vGPU type or product id, then a resource '
                'class)' % entry)
        if key in result:
            raise ValueError('[gpu_agent] pci_resource_classes: %s is '
                             'listed twice' % key)
        result[key.lower() if sysfs_mod.is_pci_address(key.lower())
               else key] = value
    return result


def normalise_resource_class(name):
    """What Nova makes of a ``device_spec`` ``resource_class`` tag.

    Upper case; anything but the standard PGPU/VGPU classes becomes
    ``CUSTOM_<NAME>`` with other characters as ``_``
    (pci_placement_translator ``_normalize_resource_class``).
    """
    name = str(name).upper()
    if name in (report_mod.VGPU_RC, 'PGPU') or name.startswith('CUSTOM_'):
        return name
    return 'CUSTOM_' + re.sub(r'[^A-Z0-9_]', '_', name)


def _resource_class(mapping, fn, keys):
    """Resource class of PCI device ``fn`` (first key of ``mapping`` that
    matches ``keys`` or its product id), else Nova's default.
    """
    for key in tuple(keys) + (fn.device_id,):
        if mapping and key and key in mapping:
            return normalise_resource_class(mapping[key])
    return report_mod.pci_default_resource_class(fn.vendor_id,
                                                 fn.device_id)


@dataclasses.dataclass
class HostInventory:
    host: object                         # core host.Host
    gpus: list
    nodename: str
    sources: dict
    resource_classes: dict = None        # see GpuRecord.providers
    drivers: object = None               # core drivers.DriverInfo
    # GPUs NVML lists but cannot read now ({address, nvml_index, reason};
    # address None when NVML cannot give it), and the GPUs left out of
    # ``gpus`` for them, as the report's ``left_out`` lists them
    # ({address, reason, providers}; ``_left_out``).
    unreadable: list = dataclasses.field(default_factory=list)
    left_out: list = dataclasses.field(default_factory=list)

    def providers(self):
        """GPU index -> every provider of that GPU (report dicts)."""
        return {g.index: g.providers(self.nodename, self.resource_classes)
                for g in self.gpus}

    def report(self, generation=0):
        providers = self.providers()
        if report_mod.VERSION >= 2:
            by_index = providers
        else:  # schema 1: one provider name per GPU
            by_index = {i: p[0]['name'] if p else None
                        for i, p in providers.items()}
        data = report_mod.host_to_dict(
            self.host, nodename=self.nodename, generation=generation,
            providers=by_index,
            devices={g.index: self._devices(g) for g in self.gpus},
            drivers=self.drivers)
        # Additive fields (ignored by report.host_from_dict): what the
        # agent knows beyond the scheduling model.
        data['agent'] = {'sources': self.sources}
        if self.left_out:
            data['left_out'] = [dict(g, reason=g['reason'][
                :report_mod.MAX_NAME]) for g in self.left_out]
        for raw, g in zip(data['gpus'], self.gpus):
            pci = g.pci
            raw['providers'] = providers[g.index]
            # Schema 1 field, kept for older schedulers: the first one.
            raw['provider'] = (providers[g.index][0]['name']
                               if providers[g.index] else None)
            raw['traits'] = g.traits()
            raw['nvlink_domain'] = g.nvlink_domain
            raw['iommu_group'] = pci.iommu_group if pci else None
            raw['driver'] = pci.driver if pci else None
            # Devices no guest holds (not in "devices": room, not usage).
            raw['idle_mdevs'] = [{'uuid': uuid, 'detail': name}
                                 for uuid, name in g.mdevs
                                 if uuid in g.idle_mdevs]
            raw['idle_gpu_instances'] = [
                {'detail': list(detail)} for detail in g.mig_slots
                if detail[1] in g.idle_gpu_instances]
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
        """The GPU's devices in use, for the report.

        A MIG-backed mdev is left out too: the GPU instance that backs it
        is a ``mig`` device already.

        An mdev no guest holds is left out, as a typed vendor-VFIO VF no
        guest holds is: Nova's libvirt driver gives an existing mdev of
        the type to the next guest before it makes one, and counts it in
        the provider's VGPU inventory, so it is room for its type, not
        usage. Counted as usage, it would hold the GPU full in the
        scheduler's view from a guest's deletion until the agent removes
        the orphan (``orphan_grace_period`` later, or never with
        ``remove_orphans`` off).
        """
        profiles = g.model.vgpu_profiles
        devices = [_held({'kind': host_mod.VGPU, 'detail': name,
                          'uuid': uuid}, g.holders.get(uuid.lower()))
                   for uuid, name in g.mdevs if uuid not in g.idle_mdevs
                   # A MIG-backed vGPU takes no share of its own: its GPU
                   # instance, listed below from NVML, holds the slices
                   # (the core refuses it as a time-sliced device).
                   and not (name in profiles and profiles[name].mig_backed)]
        devices += [_held({'kind': host_mod.VGPU, 'detail': name, 'vf': vf},
                          g.holders.get(vf))
                    for vf, name in sorted(g.vf_vgpus.items())]
        devices += [_held({'kind': host_mod.MIG, 'detail': list(detail)},
                          g.mig_holders.get(detail[1]))
                    for detail in g.mig_slots
                    if detail[1] not in g.idle_gpu_instances]
        # A whole GPU passed through: in use while a domain holds its PF.
        if (g.pci is not None and g.pci.driver == 'vfio-pci'
                and not g.vfs() and not devices
                and g.address in g.holders):
            devices.append(_held({'kind': host_mod.WHOLE},
                                 g.holders[g.address]))
        return devices

    def gpu_by_address(self, address):
        for g in self.gpus:
            if g.address == address or address in [
                    vf.address for vf in g.vfs()]:
                return g
        return None


def _held(device, instance):
    """A report device, with the instance holding it where libvirt says."""
    if instance:
        device['instance'] = instance
    return device


class Discovery:
    def __init__(self, sysfs, nvml=None, catalog=None, host='localhost',
                 nodename=None, libvirt=None, cpu_milli=0, memory_mib=0,
                 resource_classes=None, vf_types_on_demand=False,
                 fabric=None, pcie_tree=False):
        # [gpu_agent] report_pcie_tree: the PCIe tree and RDMA NICs go in
        # the report (agent.pcie, GPUDirect RDMA pairing).
        self.pcie_tree = pcie_tree
        # Fabric Manager (agent.fabric.FabricManager) of a host in Shared
        # NVSwitch mode: its partitions go in the report.
        self.fabric = fabric
        self.resource_classes = resource_class_map(resource_classes)
        # [gpu_agent] vf_types_on_demand: a typed VF is a VF a guest holds.
        self.vf_types_on_demand = vf_types_on_demand
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
        nvml_gpus, unreadable = (self.nvml.read_gpus() if sources['nvml']
                                 else ([], []))
        by_addr = {g.address: g for g in nvml_gpus}
        pfs = [a for a, f in pci.items() if not f.physfn]
        left_out = _left_out(unreadable, pfs, pci, by_addr)
        if nvml_gpus:
            order = [g.address for g in nvml_gpus]
            order += [a for a in pfs if a not in by_addr]
        else:
            order = sorted(pfs)
        order = [a for a in order if a not in left_out]
        if self.libvirt is not None:
            # libvirt's node devices confirm what it can hand to guests;
            # a GPU only libvirt knows (sysfs not mounted as expected) is
            # still listed.
            try:
                for info in self.libvirt.pci_devices():
                    sources['libvirt'] = True
                    addr = _nodedev_address(info)
                    if (addr and addr not in order and addr in pci
                            and not pci[addr].physfn
                            and addr not in left_out):
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
        self._devices(records, self._attached(sources))
        gpus = [host_mod.Gpu(
            r.index, r.model, address=r.address, numa_node=r.numa_node,
            pcie_switch=r.pcie_switch, nvlink_peers=r.nvlink_peers,
            mig_enabled=bool(r.nvml and r.nvml.mig_enabled
                             and r.model.mig_capable),
            vgpu_types=r.vgpu_profiles or None,
            mixed_size=self._mixed_size(r)) for r in records]
        host = host_mod.Host(self.hostname, gpus, self.cpu_milli,
                             self.memory_mib,
                             partitions=(fabric.read_table(self.fabric, gpus)
                                         if self.fabric is not None
                                         else None),
                             pcie=(pcie_mod.read_tree(
                                 self.sysfs, [g.address for g in gpus],
                                 self.nodename) if self.pcie_tree
                                 else None))
        for r in records:
            self._account(host.gpus[r.index], r)
        return HostInventory(host=host, gpus=records,
                             nodename=self.nodename, sources=sources,
                             resource_classes=self.resource_classes,
                             drivers=(self.nvml.driver_info()
                                      if sources['nvml'] else None),
                             unreadable=[
                                 {'address': u.address, 'nvml_index': u.index,
                                  'reason': u.reason} for u in unreadable],
                             left_out=[{
                                 'address': address, 'reason': why,
                                 'providers': report_mod.left_out_providers(
                                     self.nodename, address,
                                     pci[address].vfs if address in pci
                                     else ())}
                                 for address, why in sorted(
                                     left_out.items())])

    @staticmethod
    def _account(gpu, record):
        """Mark what the devices on a GPU take, for the agent's own model.

        Every mdev, idle ones too: one holds its share of the GPU until it
        is removed or reused. The report leaves idle mdevs out
        (``_devices``), since Nova hands them to its next guest.
        """
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

    def _mixed_size(self, r):
        """The GPU of ``r`` is in mixed-size vGPU mode as the scheduler
        can model it (NVML says so, MIG is off, the catalog has the
        model's mixed-size maxima); a mode the catalog lacks is logged.
        """
        if r.nvml is None or not r.nvml.mixed_size or r.nvml.mig_enabled:
            return False
        if not mixed_size.supported(r.model):
            LOG.warning('GPU %s: NVML says mixed-size vGPU mode is on but '
                        'the catalog has no mixed-size maxima for %s; '
                        'reported in equal-size mode', r.address,
                        r.model.name)
            return False
        return True

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

    def _attached(self, sources):
        """PCI addresses libvirt domains hold as hostdevs; None when
        libvirt cannot say.

        A vendor-VFIO VF has its vGPU type set ahead of any guest (the
        type is the pool's), so only a domain referring to it makes it a
        vGPU in use.
        """
        if self.libvirt is None or not sources.get('libvirt'):
            return None
        try:
            self._holders = self.libvirt.domain_refs(by='uuid')
            return set(self._holders)
        except Exception as e:  # libvirt is optional for discovery
            LOG.warning('cannot list libvirt domains (%s): vendor-VFIO '
                        'VFs in use are not counted', e)
            return None

    def _devices(self, records, attached=None):
        mdevs = self.sysfs.mdevs()
        by_parent = {}
        for m in mdevs.values():
            by_parent.setdefault(m.parent, []).append(m)
        holders = getattr(self, '_holders', None) or {}
        for r in records:
            parents = [r.address] + [vf.address for vf in r.vfs()]
            r.holders = {ref: domains[0] for ref, domains in holders.items()
                         if domains and (ref in parents or any(
                             ref == m.uuid.lower() for p in parents
                             for m in by_parent.get(p, ())))}
            r.mdev_parents = {
                p: {m.uuid for m in by_parent.get(p, ())} for p in parents}
            for parent in parents:
                fn = r.pci if parent == r.address else next(
                    vf for vf in r.vfs() if vf.address == parent)
                for m in by_parent.get(parent, ()):
                    t = fn.mdev_types.get(m.type_id) if fn else None
                    name = _VENDOR_PREFIX.sub('', t.name) if t else m.type_id
                    r.mdevs.append((m.uuid, name))
                    if attached is not None and (
                            m.uuid.lower() not in attached):
                        r.idle_mdevs.add(m.uuid)
            for vf in r.vfs():
                # With types preset and without libvirt nothing says which
                # typed VF a guest has: Placement's pool usage stays the
                # capacity authority. Typed on demand (the qemu hook), a
                # typed VF is held: it takes its share of the GPU.
                held = self.vf_types_on_demand or (
                    attached is not None and vf.address in attached)
                if vf.current_vgpu_type and held:
                    name = r.vf_type_name(vf) or str(vf.current_vgpu_type)
                    r.vf_vgpus[vf.address] = _VENDOR_PREFIX.sub('', name)
            if r.nvml is not None and r.nvml.mig_enabled and \
                    r.model.mig_capable:
                named = [(mig_profile_name(r.model, inst), inst)
                         for inst in r.nvml.mig_instances]
                named = [(name, inst) for name, inst in named if name]
                r.mig_slots.extend((name, inst.start, None)
                                   for name, inst in named)
                r.mig_holders = self._mig_holders(r, named)
                r.idle_gpu_instances = self._idle_gpu_instances(
                    r, named, attached)

    def _mig_holders(self, r, named):
        """``{start slice: domain UUID}`` of ``r``'s GPU instances that a
        guest's MIG-backed vGPU runs on, where NVML and libvirt say.
        """
        if self.nvml is None or not r.holders:
            return {}
        mdevs = self.nvml.mig_vgpu_mdevs(r.nvml.index) or {}
        result = {}
        for _name, inst in named:
            mdev = mdevs.get(inst.gi_id)
            holder = r.holders.get(mdev.lower()) if mdev else None
            if holder:
                result[inst.start] = holder
        return result

    def _idle_gpu_instances(self, r, named, attached):
        """Start slices of ``r``'s GPU instances that no guest holds.

        For MIG-backed vGPUs the GPU instances are made ahead (by the
        operator or the layout planner) and a new vGPU takes a free one:
        a GPU instance no guest's vGPU holds is room for the vGPU types
        of its profile, not usage. Per MIG profile, as many instances are
        held as guests hold MIG-backed mdevs of a type it backs (libvirt's
        domains, so a stopped guest still holds its own), and at least
        those NVML runs a vGPU on; those NVML names first, then by start
        slice. Every instance is held where that cannot be told (libvirt
        does not say), and every instance of a profile that backs none of
        the GPU's vGPU types.

        Limit: the scheduler's model has no "instance made for profile P",
        so the slices of idle instances are free slices to it. Where a
        GPU enables MIG-backed types of several profiles, idle instances
        of two profiles can add up, in its view, to room for a third that
        no instance matches (Nova's mdev creation then fails and the boot
        is rescheduled).
        """
        profiles = r.model.vgpu_profiles
        # MIG profiles behind the GPU's MIG-backed vGPU types: an idle
        # instance of another profile is room for nothing Nova can give.
        backing = {profiles[n].mig_profile for n in r.vgpu_profiles
                   if n in profiles and profiles[n].mig_backed}
        if attached is None or not backing:
            return set()
        held = collections.Counter(
            profiles[name].mig_profile for uuid, name in r.mdevs
            if uuid not in r.idle_mdevs and name in profiles
            and profiles[name].mig_backed)
        active = (self.nvml.mig_in_use(r.nvml.index)
                  if self.nvml is not None else None) or set()
        by_profile = collections.defaultdict(list)
        for name, inst in named:  # (catalog MIG profile, NVML instance)
            by_profile[name].append(inst)
        idle = set()
        for name, instances in by_profile.items():
            if name not in backing:
                continue
            instances.sort(key=lambda i: (i.gi_id not in active, i.start))
            keep = max(held[name],
                       sum(1 for i in instances if i.gi_id in active))
            idle.update(i.start for i in instances[keep:])
        return idle


def mig_profile_name(model, inst):
    """Catalog MIG profile of an NVML GPU instance (by its slice shape)."""
    candidates = [p for p in model.mig.profiles.values()
                  if p.compute_slices == inst.compute_slices
                  and p.memory_slices == inst.size]
    candidates.sort(key=lambda p: p.name.endswith('+me'))
    return candidates[0].name if candidates else None


def _left_out(unreadable, pfs, pci, listed):
    """``{PCI address: why}`` of the GPUs discovery leaves out: those NVML
    cannot read now (``Nvml.read_gpus``).

    A GPU that cannot serve guests (fallen off the bus, a driver fault)
    must not reach the scheduler as a free one through sysfs or libvirt,
    which still show it. When NVML could not even give an address, the
    GPUs the nvidia driver holds that NVML did not list are those it
    failed on (a GPU NVML does not list otherwise is bound to another
    driver: vfio-pci for passthrough).
    """
    left_out = {u.address: u.reason for u in unreadable if u.address}
    nameless = sorted({u.reason for u in unreadable if not u.address})
    if nameless:
        why = 'NVML cannot give its PCI address: %s' % ', '.join(nameless)
        left_out.update((a, why) for a in pfs if a not in listed
                        and a not in left_out and pci[a].driver == 'nvidia')
    return left_out


def _nodedev_address(info):
    path = info.get('path') or ''
    tail = path.rstrip('/').rsplit('/', 1)[-1]
    return tail if sysfs_mod.is_pci_address(tail) else None
