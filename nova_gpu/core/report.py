"""The host GPU report: what the compute agent publishes about a host.

This is the one schema both sides share. The agent builds it from
discovery and sends it (oslo.messaging); the scheduler-side view parses it
back (``parse``) into a ``host.Host`` plus every Placement provider that
stands for each GPU. It is plain JSON-able data with a version so that
agents and schedulers of different releases can coexist during upgrades:
this release writes version 2 and reads versions 1 and 2.

Schema (version 2)::

    {"version": 2,
     "host": "compute-1",          # nova-compute host name
     "nodename": "compute-1",      # hypervisor node name
     "generation": 17,             # increases with every report
     "boot_id": "6f1c...",         # optional: one value per agent run
     "cpu_milli": 128000, "memory_mib": 1048576,
     "numa_cells": [{"id": 0, "cpu_milli": 64000, "memory_mib": 524288}],
     "gpus": [{
        "index": 0, "address": "0000:3b:00.0", "model": "A100-40GB",
        "numa_node": 0, "pcie_switch": "0000:3a:00.0",
        "nvlink_peers": [1, 2, 3], "mig_enabled": false,
        "vgpu_types": ["A100-10C"],  # enabled types, or null for any
        "mixed_size": false,         # optional: NVIDIA's mixed-size mode
        "providers": [               # every provider standing for it
          {"name": "compute-1_pci_0000_3b_00_4", "kind": "vf_mdev",
           "address": "0000:3b:00.4", "resource_class": "VGPU",
           "vgpu_type": "A100-10C", "vfs": [], "mig": null}],
        "devices": [                 # what guests hold now
          {"kind": "vgpu", "detail": "A100-10C", "uuid": "...",
           "instance": "..."},      # optional: the domain holding it
          {"kind": "mig", "detail": ["3g.20gb", 0, null], "uuid": "..."},
          {"kind": "whole"}],
        "idle_mdevs": [              # optional: mdevs no guest holds
          {"uuid": "...", "detail": "A100-10C"}],
        "idle_gpu_instances": [      # optional: MIG instances no guest
          {"detail": ["3g.20gb", 4, null]}]}]}  # holds (MIG-backed vGPU)

An mdev no guest holds is room for its type, not a device in use: Nova's
libvirt driver gives it to the next guest of that type. A GPU instance
made ahead for MIG-backed vGPUs that no guest holds is room for them
likewise. They are listed under ``idle_mdevs`` and ``idle_gpu_instances``
(ignored by the scheduler; ``present_devices`` joins them with
``devices`` for the agent's device notifications and metrics).

Optional in both versions, for driver-aware placement
(``nova_gpu.core.drivers``)::

     "nvidia": {"driver_version": "550.54.14",   # the vGPU manager
                "guest_driver_branches": ["R535", "R550"],
                "vgpu_version_range": [65536, 1114112]}  # may be null

Optional in version 2, the GPUs the agent left out of ``gpus``: those
NVML lists but cannot read now (fallen off the bus, a driver fault), with
every Placement provider Nova may have made for each (``left_out_providers``)::

     "left_out": [{"address": "0000:52:00.0", "reason": "GPU is lost",
                   "providers": ["compute-1_pci_0000_52_00_0",
                                 "compute-1_0000:52:00.0"]}]

The scheduler knows those providers to stand for no usable GPU and drops
the allocation candidates that use them.

Optional in both versions, on a host in Fabric Manager's Shared NVSwitch
mode (``nova_gpu.core.partitions``): its NVSwitch partitions, GPUs by
index; ``supported`` is false for a partition Fabric Manager cannot
activate (failed NVLinks), ``active`` true while it is activated. Absent
(or null): whole GPUs go in any set::

     "partitions": [{"id": 3, "gpus": [0, 1], "supported": true,
                     "active": false}]

Optional in both versions, the PCIe tree for GPUDirect RDMA pairing
(``nova_gpu.core.rdma``, read by the agent from sysfs: ``agent.pcie``):
each GPU's PCIe switch (its upstream port) and root complex (host
bridge), the switches with their ACS state, and the RDMA NIC PFs with
their VFs, the VFs guests hold and the Placement provider of the VFs.
Absent (or null): no ``gpu:rdma`` request fits the host::

     "pcie": {"gpus": [{"index": 0, "switch": "0000:16:00.0",
                        "root": "pci0000:15"}],
              "switches": [{"id": "0000:16:00.0", "root": "pci0000:15",
                            "acs_redirect": false, "device": "1000:c030"}],
              "nics": [{"address": "0000:1a:00.0", "switch": "0000:16:00.0",
                        "root": "pci0000:15", "vfs": 8, "vfs_used": 1,
                        "provider": "compute-1_0000:1a:00.0",
                        "device": "15b3:1021"}]}

Version 1 is the same without ``providers`` and ``boot_id``; each GPU has
one ``provider`` name instead (a ``pf_mdev`` provider of class VGPU). A
version 2 GPU entry without ``providers`` is read the same way.
Keys this module does not know are ignored (the agent adds diagnostics
such as ``traits`` and ``vfs``), so later versions can add fields.

Every field is validated (``parse``): its shape (types, ranges, strings
bounded, PCI addresses) by the JSON Schema of ``report_schema``, and in
code what a schema cannot say: GPU indices 0..n-1 each once, NVLink peers
among them, devices and vGPU types valid for the GPU's model, provider
names and PCI addresses unique. A bad report raises ``ReportError`` (an
``InvalidRequest``) naming the host and the field.

Cheap checks come first, so that what cannot be real costs little to
refuse: the header (version, host, nodename, generation, boot_id;
``parse_header``, which a receiver can hold against the report it has
before it reads the rest), then the report's size (``MAX_TOTAL_*``:
providers, VFs and devices over all GPUs, counted from the lists' lengths
without reading them), then every field.

Generations: ``generation`` is an integer in ``0 .. MAX_GENERATION``
(JSON-safe; ``inf``, floats, booleans and strings are refused). Every
receiver (the schedulers' view, the exporter, the reclaimer) keeps the
newest report per host by one rule, ``replaces``: a higher generation
replaces the report held; a lower or equal one does so only when it
comes from a new agent run (another ``boot_id``) or the held report is
older than the receiver's ``reset_after`` (``[gpu_scheduler]
generation_reset_after``), so a report never freezes a host.
"""

import dataclasses
import math
import re

from nova_gpu.core import drivers as drivers_mod
from nova_gpu.core import exceptions
from nova_gpu.core import host as host_mod
from nova_gpu.core import mixed_size
from nova_gpu.core import partitions as partitions_mod
from nova_gpu.core import rdma as rdma_mod
from nova_gpu.core import report_schema

VERSION = 2
SUPPORTED_VERSIONS = report_schema.SUPPORTED_VERSIONS

# -- wire contract: what the agent publishes and the scheduler listens to --

# oslo.messaging notification event type and publisher of a report.
EVENT_TYPE = 'gpu.host.report'
PUBLISHER = 'nova-gpu-agent'
# Default notification topic of reports: the agent's ``[gpu_agent]
# report_topic``, the scheduler's ``[gpu_scheduler] report_topic`` and the
# exporter's must agree, so their defaults come from here.
TOPIC = 'nova_gpu_reports'

# How Nova 34 shows a GPU (or a part of one) in Placement; each report
# lists, per physical GPU, every provider of these kinds that stands for it.
PF_MDEV = 'pf_mdev'        # mdev types on the PF (T4, V100, P100): VGPU
VF_MDEV = 'vf_mdev'        # SR-IOV + mdev: one VGPU provider per VF
PCI_POOL = 'pci_pool'      # vendor-specific VFIO VFs, pooled per PF
PCI_DEVICE = 'pci_device'  # whole-GPU passthrough, PCI in Placement
PROVIDER_KINDS = (PF_MDEV, VF_MDEV, PCI_POOL, PCI_DEVICE)
assert PROVIDER_KINDS == report_schema.PROVIDER_KINDS
VGPU_RC = 'VGPU'

# One generic resource class per PCI-in-Placement path, which operators give
# the GPU devices in ``[pci] device_spec`` (``resource_class``), and the
# ``[pci] alias`` names flavors ask them with (``pci_passthrough:alias``).
# One class for every vendor-VFIO VF pool, whatever vGPU type is preset on
# its VFs, as VGPU is one class for every mdev parent: Placement only
# counts, and GpuFilter picks the pool whose type (from the agent's report)
# fits the flavor. Schedulers may rename them ([gpu_scheduler] options).
VFIO_VGPU_RC = 'CUSTOM_NVIDIA_VGPU'   # vendor-VFIO VFs, pooled per PF
WHOLE_GPU_RC = 'CUSTOM_NVIDIA_GPU'    # whole GPUs (PFs) for passthrough
VFIO_VGPU_ALIAS = 'nvidia-vgpu'
WHOLE_GPU_ALIAS = 'nvidia-gpu'
# The PCI alias of RDMA NIC functions (ConnectX VFs) in gpu:rdma flavors
# ([gpu_scheduler] rdma_nic_alias; core.rdma).
RDMA_NIC_ALIAS = 'rdma-vf'

# -- bounds: a report is untrusted input --

# Per field: the schema's (report_schema), named here for callers.
MAX_GENERATION = report_schema.MAX_GENERATION
MAX_NAME = report_schema.MAX_NAME
MAX_GPUS = report_schema.MAX_GPUS
MAX_CELLS = report_schema.MAX_CELLS
MAX_DEVICES = report_schema.MAX_DEVICES
MAX_PROVIDERS = report_schema.MAX_PROVIDERS
MAX_LIST = report_schema.MAX_LIST
MAX_QUANTITY = report_schema.MAX_QUANTITY

# Per report, over all its GPUs: the per-field bounds alone let one report
# list 64 x 512 providers of 512 VFs each (16 million addresses, about
# 30 s to parse). The largest real host has 16 GPUs (HGX-2, DGX-2); an
# NVIDIA SR-IOV GPU has at most 64 VFs, so at most 66 providers (the PF's
# mdev provider, one per VF, a PCI pool or device); a GPU holds at most
# 32 vGPUs (the catalog's largest max_instances) or 7 MIG instances.
# Real: 16 x 66 = 1056 providers, 16 x 64 = 1024 VFs, 16 x 32 = 512
# devices. The bounds leave four times that and more.
MAX_TOTAL_PROVIDERS = 4096     # every GPU's providers and left_out's
MAX_TOTAL_VFS = 4096           # every pool's vfs
MAX_TOTAL_DEVICES = 4096       # every GPU's devices


def mdev_provider_name(nodename, address):
    """VGPU provider nova-compute (libvirt) makes for an mdev parent.

    The parent is the PF (pre-Ampere cards) or a VF (SR-IOV + mdev).
    ``<nodename>_<libvirt node device name>``, the device name being
    ``pci_<address with ':' and '.' as '_'>`` in lower case, e.g.
    ``compute-1_pci_0000_3b_00_4``: nova/virt/libvirt/driver.py
    ``LibvirtDriver._ensure_pgpu_providers`` (``pgpu_rp_name = '%s_%s' %
    (nodename, pgpu_dev_id)``, keyed by the libvirt names that
    ``_get_gpu_inventories`` lists, e.g. ``pci_0000_84_00_0``).
    """
    return '%s_pci_%s' % (nodename, re.sub(r'[:.]', '_', address.lower()))


def pci_provider_name(hypervisor_hostname, address):
    """Provider of PCI in Placement for a PF (or the PF of pooled VFs).

    ``<hypervisor_hostname>_<ADDRESS upper case>``, e.g.
    ``compute-1_0000:3B:00.0``: nova/compute/pci_placement_translator.py
    ``PlacementView._get_rp_name_for_address`` (``f"{self.root_rp_name}_
    {addr.upper()}"``, root name the hypervisor hostname). A VF (type-VF)
    is a child device: ``_get_rp_name_for_child`` names it after its
    ``parent_addr``, so every VF of one PF lands in the PF's provider.
    """
    return '%s_%s' % (hypervisor_hostname, address.upper())


def pci_default_resource_class(vendor_id, product_id):
    """Nova's resource class for a ``[pci] device_spec`` without one.

    ``CUSTOM_PCI_<VENDOR>_<PRODUCT>``, e.g. ``CUSTOM_PCI_10DE_2331``:
    nova/compute/pci_placement_translator.py ``get_resource_class``
    (``f"CUSTOM_PCI_{vendor_id}_{product_id}".upper()``, with the ids as
    libvirt reports them, without ``0x``; a leading ``0x`` is dropped here).
    """
    def bare(value):
        value = value.upper()
        return value[2:] if value.startswith('0X') else value
    return 'CUSTOM_PCI_%s_%s' % (bare(vendor_id), bare(product_id))


def provider_dict(name, kind, address, resource_class=VGPU_RC,
                  vgpu_type=None, vfs=(), mig=None):
    """One entry of a GPU's ``providers`` list (schema 2)."""
    return {'name': name, 'kind': kind, 'address': address,
            'resource_class': resource_class, 'vgpu_type': vgpu_type,
            'vfs': list(vfs), 'mig': list(mig) if mig else None}


# -- parsed form ----------------------------------------------------------


class ReportError(exceptions.InvalidRequest):
    """A report is malformed; names the host and the field."""

    def __init__(self, host, field, problem):
        self.host = host
        self.field = field
        self.problem = problem
        super().__init__('GPU report from %s: %s: %s'
                         % (_shown(host), field, problem))


@dataclasses.dataclass(frozen=True)
class Provider:
    """A Placement provider standing for GPU ``gpu`` or a part of it."""

    name: str
    kind: str
    gpu: int
    address: str
    resource_class: str
    vgpu_type: str = None
    vfs: tuple = ()
    mig: tuple = None  # (MIG profile, start) behind a MIG-backed VF


@dataclasses.dataclass(frozen=True)
class LeftOutGpu:
    """A GPU the agent left out of a report: NVML cannot read it now."""

    address: str
    reason: str
    providers: tuple  # names of the providers Nova may have made for it


@dataclasses.dataclass(frozen=True)
class Header:
    """What a report says of itself, before its GPUs (``parse_header``)."""

    version: int
    host: str
    nodename: str
    generation: int
    boot_id: str


@dataclasses.dataclass(frozen=True)
class Report:
    """A validated report."""

    version: int
    host: host_mod.Host
    nodename: str
    generation: int
    boot_id: str
    providers: tuple  # Provider, every kind, ordered by GPU
    drivers: object = None  # drivers.DriverInfo, when the agent knows
    left_out: tuple = ()  # LeftOutGpu

    def provider_map(self):
        """Provider name -> Provider."""
        return {p.name: p for p in self.providers}


def _absent_empty(value):
    """None (or no key) reads as an empty list; ``{}`` or ``''`` do not."""
    return [] if value is None else value


def _shown(value):
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + '...'


class _Parser:
    """Walks one report; every failure names the field's path."""

    def __init__(self, data, catalog):
        self.data = data
        self.catalog = catalog
        self.host = None

    def fail(self, field, problem):
        raise ReportError(self.host, field, problem)

    def check(self, schema):
        """Refuse the report at the first fault ``schema`` finds."""
        fault = report_schema.first_error(self.data, schema)
        if fault is not None:
            self.fail(*fault)

    def bounded(self, value, path, high):
        """An index the schema let through, within what this report
        holds (``high``).
        """
        if value > high:
            self.fail(path, 'must be in 0..%d, got %s' % (high,
                                                          _shown(value)))
        return value

    # -- typed fields --

    def field(self, mapping, key, path, default=dataclasses.MISSING):
        if key not in mapping:
            if default is dataclasses.MISSING:
                self.fail(path, 'missing')
            return default
        return mapping[key]

    def integer(self, value, path, low=0, high=MAX_QUANTITY):
        # bool is an int in Python but never a count or an index here.
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and not math.isfinite(value):
                self.fail(path, 'must be a finite integer, got %s' % value)
            self.fail(path, 'must be an integer, got %s'
                      % type(value).__name__)
        if not low <= value <= high:
            self.fail(path, 'must be in %d..%d, got %s'
                      % (low, high, _shown(value)))
        return value

    def boolean(self, value, path):
        if not isinstance(value, bool):
            self.fail(path, 'must be true or false, got %s'
                      % type(value).__name__)
        return value

    def array(self, value, path, limit=MAX_LIST):
        if not isinstance(value, list):
            self.fail(path, 'must be a list, got %s' % type(value).__name__)
        if len(value) > limit:
            self.fail(path, 'more than %d entries' % limit)
        return value

    def mapping(self, value, path):
        if not isinstance(value, dict):
            self.fail(path, 'must be an object, got %s'
                      % type(value).__name__)
        return value

    # -- the report --

    def header(self):
        """The header fields, each checked; nothing else is read."""
        data = self.data
        if isinstance(data, dict) and isinstance(data.get('host'), str):
            self.host = data['host']
        self.check(report_schema.HEADER)
        nodename = data.get('nodename')
        return Header(data['version'], self.host,
                      self.host if nodename is None else nodename,
                      data['generation'], data.get('boot_id'))

    def parse(self):
        header = self.header()
        data = self.data
        self.check(report_schema.LISTS)
        raws = data['gpus']
        # The size first, from the lists' lengths: the schema walks every
        # entry.
        self.size(raws, data.get('left_out'))
        fault = report_schema.report_error(data, header.version)
        if fault is not None:
            self.fail(*fault)
        cpu = data.get('cpu_milli', 0)
        memory = data.get('memory_mib', 0)
        cells = self.cells(_absent_empty(data.get('numa_cells')))
        raws = self.ordered(raws)
        gpus = [self.gpu(raw, len(raws), cells) for raw in raws]
        addresses = self.gpu_addresses(gpus)
        host = host_mod.Host(self.host, gpus, cpu, memory, cells,
                             self.partitions(data.get('partitions'),
                                             len(gpus)),
                             self.pcie(data.get('pcie'), len(gpus)))
        providers, names, vfs = [], set(), {}
        for raw, gpu in zip(raws, gpus):
            self.devices(raw, gpu, host)
            for n, p in enumerate(self.providers(raw, gpu, header.version,
                                                 header.nodename)):
                if p.name in names:
                    self.fail('gpus[%d].providers' % gpu.index,
                              'provider %s listed twice' % _shown(p.name))
                names.add(p.name)
                self.vf_addresses(p, '%s.providers[%d]' % (
                    'gpus[%d]' % gpu.index, n), addresses, vfs)
                providers.append(p)
        return Report(header.version, host, header.nodename,
                      header.generation, header.boot_id, tuple(providers),
                      self.drivers(data.get('nvidia')),
                      self.left_out(data.get('left_out'), host, names))

    def size(self, raws, left_out):
        """Refuse a report larger than any real host (``MAX_TOTAL_*``)
        from its lists' lengths, before any entry is read in full.

        Entries of the wrong type are skipped: the full parse names them.
        """
        providers = vfs = devices = 0
        for raw in raws:
            if not isinstance(raw, dict):
                continue
            listed = raw.get('devices')
            if isinstance(listed, list):
                devices += len(listed)
            listed = raw.get('providers')
            if not isinstance(listed, list):
                continue
            providers += len(listed)
            # Checked before the entries are walked: the walk is then
            # bounded by the total.
            self.within(providers, MAX_TOTAL_PROVIDERS, 'providers')
            for entry in listed:
                if isinstance(entry, dict) and isinstance(
                        entry.get('vfs'), list):
                    vfs += len(entry['vfs'])
        if isinstance(left_out, list):
            for entry in left_out[:MAX_GPUS + 1]:
                if isinstance(entry, dict) and isinstance(
                        entry.get('providers'), list):
                    providers += len(entry['providers'])
        self.within(providers, MAX_TOTAL_PROVIDERS, 'providers')
        self.within(vfs, MAX_TOTAL_VFS, 'VFs')
        self.within(devices, MAX_TOTAL_DEVICES, 'devices')

    def within(self, count, bound, what):
        if count > bound:
            self.fail('gpus', 'more than %d %s over all GPUs (at least '
                      '%d): larger than any real host' % (bound, what, count))

    def partitions(self, raw, gpu_count):
        """The optional ``partitions`` (Shared NVSwitch mode), or None."""
        if raw is None:
            return None
        raw = self.array(raw, 'partitions', partitions_mod.MAX_PARTITIONS)
        parts = []
        for n, entry in enumerate(raw):
            path = 'partitions[%d]' % n
            entry = self.mapping(entry, path)
            pid = self.integer(self.field(entry, 'id', path + '.id'),
                               path + '.id',
                               high=partitions_mod.MAX_PARTITIONS - 1)
            listed = self.array(self.field(entry, 'gpus', path + '.gpus'),
                                path + '.gpus', MAX_GPUS)
            gpus = set()
            for k, i in enumerate(listed):
                i = self.integer(i, '%s.gpus[%d]' % (path, k),
                                 high=max(gpu_count - 1, 0))
                if i >= gpu_count or i in gpus:
                    self.fail('%s.gpus[%d]' % (path, k), 'GPU %d %s' % (
                        i, 'not in the report' if i >= gpu_count
                        else 'listed twice'))
                gpus.add(i)
            parts.append(partitions_mod.Partition(
                pid, frozenset(gpus),
                self.boolean(entry.get('supported', True),
                             path + '.supported'),
                self.boolean(entry.get('active', False), path + '.active')))
        try:
            return partitions_mod.PartitionTable(parts, gpu_count)
        except exceptions.InvalidRequest as e:
            self.fail('partitions', str(e))

    def pcie(self, raw, gpu_count):
        """The optional ``pcie`` tree (GPUDirect RDMA), or None."""
        if raw is None:
            return None
        located = [(None, None)] * gpu_count
        seen = set()
        for n, entry in enumerate(raw['gpus']):
            i = entry['index']
            if i >= gpu_count or i in seen:
                self.fail('pcie.gpus[%d].index' % n, 'GPU %d %s' % (
                    i, 'not in the report' if i >= gpu_count
                    else 'listed twice'))
            seen.add(i)
            located[i] = (entry.get('switch'), entry.get('root'))
        switches = [rdma_mod.Switch(e['id'], e.get('root'),
                                    e.get('acs_redirect'), e.get('device'))
                    for e in _absent_empty(raw.get('switches'))]
        nics = [rdma_mod.Nic(e['address'], e.get('switch'), e.get('root'),
                             e.get('vfs', 0), e.get('vfs_used', 0),
                             e.get('provider'), e.get('device'))
                for e in _absent_empty(raw.get('nics'))]
        try:
            return rdma_mod.PcieTree(located, nics, switches)
        except exceptions.InvalidRequest as e:
            self.fail('pcie', str(e))

    def gpu_addresses(self, gpus):
        """GPU (PF) address -> its field path; each address once."""
        seen = {}
        for gpu in gpus:
            address = gpu.address.lower()
            path = 'gpus[%d].address' % gpu.index
            if address in seen:
                self.fail(path, 'PCI address %s listed twice (also %s)'
                          % (gpu.address, seen[address]))
            if address:
                seen[address] = path
        return seen

    def vf_addresses(self, provider, path, gpus, seen):
        """Each VF once in the host, and none of them a GPU (PF): a VF is
        in one pool or the parent of one mdev provider (``seen``: VF
        address -> its field path).
        """
        listed = [(a, '%s.vfs[%d]' % (path, n))
                  for n, a in enumerate(provider.vfs)]
        if provider.kind == VF_MDEV:
            listed.append((provider.address, path + '.address'))
        for address, where in listed:
            key = address.lower()
            also = seen.get(key) or gpus.get(key)
            if also is not None:
                self.fail(where, 'PCI address %s listed twice (also %s)'
                          % (address, also))
            seen[key] = where

    def left_out(self, raw, host, names):
        """The optional ``left_out`` list: a ``LeftOutGpu`` each, none of
        them a reported GPU, none of their providers a reported one's.
        """
        reported = {g.address for g in host.gpus}
        found, seen = [], {}
        for n, entry in enumerate(_absent_empty(raw)):
            path = 'left_out[%d]' % n
            address = entry['address']
            if address in reported:
                self.fail(path + '.address', 'GPU %s is also in gpus'
                          % address)
            if address.lower() in seen:
                self.fail(path + '.address', 'PCI address %s listed twice '
                          '(also %s)' % (address, seen[address.lower()]))
            seen[address.lower()] = path + '.address'
            providers = _absent_empty(entry.get('providers'))
            for i, name in enumerate(providers):
                if name in names:
                    self.fail('%s.providers[%d]' % (path, i), 'provider %s '
                              'also stands for a reported GPU' % _shown(name))
            found.append(LeftOutGpu(address, entry['reason'],
                                    tuple(providers)))
        return tuple(found)

    def drivers(self, raw):
        """The optional ``nvidia`` object: a ``drivers.DriverInfo``."""
        if raw is None:
            return None
        try:
            return drivers_mod.DriverInfo.build(
                raw['driver_version'], raw.get('guest_driver_branches'),
                raw.get('vgpu_version_range'))
        except exceptions.InvalidRequest as e:
            self.fail('nvidia', str(e))

    def cells(self, raw):
        cells, seen = [], set()
        for n, c in enumerate(raw):
            if c['id'] in seen:
                self.fail('numa_cells[%d].id' % n, 'NUMA cell %d listed '
                          'twice' % c['id'])
            seen.add(c['id'])
            cells.append(host_mod.NumaCell(c['id'], c.get('cpu_milli', 0),
                                           c.get('memory_mib', 0)))
        return cells

    def ordered(self, raws):
        """GPU entries sorted by index, indices exactly 0..n-1."""
        by_index = {}
        for n, raw in enumerate(raws):
            path = 'gpus[%d].index' % n
            index = self.bounded(raw['index'], path, len(raws) - 1)
            if index in by_index:
                self.fail(path, 'GPU %d listed twice' % index)
            by_index[index] = raw
        return [by_index[i] for i in range(len(raws))]

    def gpu(self, raw, count, cells):
        index = raw['index']
        path = 'gpus[%d]' % index
        try:
            model = self.catalog.model(raw['model'])
        except exceptions.GpuError as e:
            self.fail(path + '.model', str(e))
        numa = raw.get('numa_node')
        numa = 0 if numa is None else numa
        if cells and numa not in {c.id for c in cells}:
            self.fail(path + '.numa_node', 'NUMA node %d is not among '
                      'numa_cells' % numa)
        peers = _absent_empty(raw.get('nvlink_peers'))
        for n, peer in enumerate(peers):
            self.bounded(peer, '%s.nvlink_peers[%d]' % (path, n), count - 1)
            if peer == index:
                self.fail(path + '.nvlink_peers', 'GPU %d is its own '
                          'NVLink peer' % index)
        mig = raw.get('mig_enabled', False)
        if mig and not model.mig_capable:
            self.fail(path + '.mig_enabled', '%s does not support MIG'
                      % model.name)
        types = raw.get('vgpu_types')
        for n, t in enumerate(types or ()):
            self.vgpu_type(t, model, '%s.vgpu_types[%d]' % (path, n))
        mixed = raw.get('mixed_size', False)
        if mixed and (mig or not mixed_size.supported(model)):
            self.fail(path + '.mixed_size', '%s has no mixed-size vGPU '
                      'mode%s' % (model.name, ' with MIG on' if mig else ''))
        gpu = host_mod.Gpu(
            index, model, address=raw.get('address') or '',
            numa_node=numa, pcie_switch=raw.get('pcie_switch') or None,
            nvlink_peers=peers, mig_enabled=mig, vgpu_types=types or None,
            mixed_size=mixed)
        gpu.quarantine = self.health(raw.get('health'))
        return gpu

    def health(self, raw):
        """The quarantine reason of a GPU's ``health`` (core.health), or
        None. Only ``quarantined`` and ``reason`` are read; the faults
        and the evidence are for operators.
        """
        if raw is None or not raw.get('quarantined', False):
            return None
        return raw.get('reason') or 'quarantined'

    def vgpu_type(self, value, model, path):
        if value not in model.vgpu_profiles:
            self.fail(path, 'vGPU type %s is not one of %s'
                      % (_shown(value), model.name))
        return value

    def devices(self, raw, gpu, host):
        path = 'gpus[%d].devices' % gpu.index
        for n, dev in enumerate(_absent_empty(raw.get('devices'))):
            where = '%s[%d]' % (path, n)
            kind = dev['kind']
            detail = self.detail(kind, dev.get('detail'), gpu,
                                 where + '.detail')
            try:
                host.gpus[gpu.index].take(host_mod.Slot(gpu.index, kind,
                                                        detail))
            except exceptions.GpuError as e:
                self.fail(where, str(e))

    def detail(self, kind, detail, gpu, path):
        if kind == host_mod.WHOLE:
            return None
        if kind == host_mod.SHARE:
            return detail
        if kind == host_mod.VGPU:
            return self.vgpu_type(detail, gpu.model, path)
        profile, start = self.mig_slot(detail[:2], gpu, path)
        vgpu = detail[2]
        if vgpu is not None:
            self.vgpu_type(vgpu, gpu.model, path + '[2]')
        return (profile, start, vgpu)

    def mig_slot(self, pair, gpu, path):
        profile, start = pair
        mig = gpu.model.mig
        if mig is None or profile not in mig.profiles:
            self.fail(path + '[0]', 'MIG profile %s is not one of %s'
                      % (_shown(profile), gpu.model.name))
        self.bounded(start, path + '[1]', mig.memory_slices - 1)
        if start not in mig.profiles[profile].starts:
            self.fail(path + '[1]', 'MIG %s cannot start at slice %d'
                      % (profile, start))
        return profile, start

    def providers(self, raw, gpu, version, nodename):
        path = 'gpus[%d]' % gpu.index
        if version == 1 or 'providers' not in raw:
            # Version 1, or a version 2 writer that knows one provider per
            # GPU: the PF's VGPU provider.
            name = raw.get('provider')
            if not name:
                return []
            return [Provider(name, PF_MDEV, gpu.index, gpu.address,
                             VGPU_RC)]
        return [self.provider(entry, gpu, '%s.providers[%d]' % (path, n))
                for n, entry in enumerate(_absent_empty(raw['providers']))]

    def provider(self, entry, gpu, path):
        vgpu = entry.get('vgpu_type')
        if vgpu is not None:
            self.vgpu_type(vgpu, gpu.model, path + '.vgpu_type')
        mig = entry.get('mig')
        if mig is not None:
            mig = self.mig_slot(mig, gpu, path + '.mig')
        return Provider(entry['name'], entry['kind'], gpu.index,
                        entry['address'],
                        entry.get('resource_class', VGPU_RC), vgpu,
                        tuple(_absent_empty(entry.get('vfs'))), mig)


def present_devices(raw_gpu):
    """Every device of a report's GPU entry that exists: ``devices`` (in
    use), ``idle_mdevs`` (as ``vgpu`` devices) and ``idle_gpu_instances``
    (as ``mig`` devices).
    """
    def listed(key):
        value = raw_gpu.get(key)
        return [d for d in value if isinstance(d, dict)] if isinstance(
            value, list) else []
    found = listed('devices')
    for key, kind in (('idle_mdevs', host_mod.VGPU),
                      ('idle_gpu_instances', host_mod.MIG)):
        found += [dict(dev, kind=kind) for dev in listed(key)]
    return found


def parse(data, catalog):
    """Validate a report (version 1 or 2) and return a ``Report``."""
    return _Parser(data, catalog).parse()


def parse_header(data):
    """Validate a report's header only and return a ``Header``.

    Cheap whatever the report's size: a receiver holds it against the
    report it has (a stale replay is refused before its GPUs are read).
    """
    return _Parser(data, None).header()


# -- which report a receiver keeps ------------------------------------------

# The verdicts of ``replaces``: why a report replaces the one held ...
FIRST = 'first'                # nothing held for the host
NEWER = 'newer'                # a higher generation
NEW_RUN = 'new_run'            # not higher, but another agent run's
RESET = 'reset'                # lower, but the held one is too old
# ... or why it does not.
DUPLICATE = 'duplicate'        # the held report again (a resend)
OUT_OF_ORDER = 'out_of_order'  # lower, same run: a late delivery
REPLACING = frozenset((FIRST, NEWER, NEW_RUN, RESET))


@dataclasses.dataclass(frozen=True)
class Verdict:
    """What ``replaces`` decided: ``name`` (one of the verdicts above),
    ``replaces`` and a ``reason`` to log.
    """

    name: str
    reason: str

    @property
    def replaces(self):
        return self.name in REPLACING

    @property
    def went_back(self):
        """Taken although its generation is not higher (worth a WARNING:
        the agent restarted or its generations went back).
        """
        return self.name in (NEW_RUN, RESET)


# Default of every receiver's ``reset_after`` (``[gpu_scheduler]``,
# ``[gpu_exporter]`` and ``[gpu_reclaimer] generation_reset_after``):
# one value, so that the receivers hold the same report.
GENERATION_RESET_AFTER = 300


def replaces(held, received, new, now, reset_after):
    """Whether report ``new`` replaces ``held``, the report a receiver
    holds for the same host, which it received at ``received``: a
    ``Verdict``.

    ``held`` and ``new`` are anything with ``generation`` and ``boot_id``
    (a ``Header``, a ``Report``, a receiver's entry); ``held`` is None
    when the receiver holds nothing for the host. ``now`` and
    ``received`` are read on the receiver's clock, ``reset_after`` is in
    its seconds.

    The one rule every receiver applies, in this order:

    1. nothing held: taken;
    2. a higher generation: taken, whatever its ``boot_id`` (an agent
       counts up within a run, and across runs too: milliseconds since
       the epoch);
    3. another ``boot_id`` than the held report's: taken, whatever its
       generation (the agent restarted and may count from a low number).
       A report *without* ``boot_id`` (an agent release before it, or a
       version 1 report) proves no new run: a late delivery from the
       same run looks the same, so it is judged by its generation;
    4. the same generation (and run): the held report again, as the
       agent's outbox resends it when the broker's acknowledgement was
       lost. Ignored: it says nothing new, and taking it would be taken
       for a fresh report (the scheduler would drop the claims it
       counted since, a staleness clock would restart);
    5. a lower generation: a late, out-of-order delivery, ignored, unless
       the held report arrived more than ``reset_after`` seconds ago: the
       agent's generations went back (its clock ran ahead and was set
       back, or it restarted without ``boot_id`` support). A report that
       old would have been superseded by now had the agent gone on
       counting from it, so the host's view is not frozen.
    """
    if held is None:
        return Verdict(FIRST, 'no report held')
    if new.generation > held.generation:
        return Verdict(NEWER, 'newer than the one held (%d)'
                       % held.generation)
    if new.boot_id is not None and new.boot_id != held.boot_id:
        return Verdict(NEW_RUN, 'comes from a new agent run (boot_id %s, '
                       'was %s)' % (new.boot_id, held.boot_id))
    if new.generation == held.generation:
        return Verdict(DUPLICATE, 'the report held (%d), again'
                       % held.generation)
    age = now - received
    if age > reset_after:
        return Verdict(RESET, 'the held one (%d) arrived %.0f s ago, more '
                       'than %s s: the agent\'s generations went back '
                       '(clock set back?)' % (held.generation, age,
                                              reset_after))
    return Verdict(OUT_OF_ORDER, 'older than the one held (%d): out of '
                   'order' % held.generation)


def host_from_dict(data, catalog):
    """Rebuild a ``host.Host`` (with its allocations) from a report."""
    return parse(data, catalog).host


# -- writing ----------------------------------------------------------------


def gpu_to_dict(gpu, providers=None, devices=None, version=VERSION):
    """One GPU entry; ``providers``: a list of provider dicts, or (as
    older agents passed) one provider name or None.
    """
    if providers is None:
        providers = []
    elif isinstance(providers, str):
        providers = [provider_dict(providers, PF_MDEV, gpu.address)]
    data = {
        'index': gpu.index, 'address': gpu.address,
        'model': gpu.model.name, 'numa_node': gpu.numa_node,
        'pcie_switch': gpu.pcie_switch,
        'nvlink_peers': sorted(gpu.nvlink_peers),
        'mig_enabled': gpu.mig_enabled,
        'vgpu_types': list(gpu.vgpu_types) if gpu.vgpu_types else None,
        'devices': list(devices or ()),
    }
    if gpu.mixed_size:
        data['mixed_size'] = True
    if version >= 2:
        data['providers'] = [dict(p) for p in providers]
    else:
        data['provider'] = providers[0]['name'] if providers else None
    return data


def host_to_dict(host, nodename=None, generation=0, providers=None,
                 devices=None, boot_id=None, version=VERSION,
                 drivers=None):
    """Report for ``host``; ``providers``/``devices`` are keyed by index.

    ``providers[index]`` is a list of provider dicts (``provider_dict``)
    or a single provider name. ``version=1`` writes the old schema (one
    provider per GPU, the first) for schedulers not yet upgraded.
    ``drivers`` (a ``drivers.DriverInfo``) is written as ``nvidia``.
    """
    if version not in SUPPORTED_VERSIONS:
        raise exceptions.InvalidRequest('cannot write GPU report version %r'
                                        % (version,))
    providers = providers or {}
    devices = devices or {}
    data = {
        'version': version, 'host': host.name,
        'nodename': nodename or host.name, 'generation': generation,
        'cpu_milli': host.cpu_milli, 'memory_mib': host.memory_mib,
        'numa_cells': [{'id': c.id, 'cpu_milli': c.cpu_milli,
                        'memory_mib': c.memory_mib}
                       for _, c in sorted(host.cells.items())],
        'gpus': [gpu_to_dict(g, providers.get(g.index),
                             devices.get(g.index), version)
                 for g in host.gpus],
    }
    if version >= 2 and boot_id is not None:
        data['boot_id'] = boot_id
    if drivers is not None:
        data['nvidia'] = drivers_to_dict(drivers)
    if host.partitions is not None:
        data['partitions'] = partitions_to_list(host.partitions)
    if host.pcie is not None:
        data['pcie'] = pcie_to_dict(host.pcie)
    return data


def pcie_to_dict(tree):
    """The ``pcie`` of a report from a ``core.rdma.PcieTree``."""
    return {
        'gpus': [{'index': i, 'switch': s, 'root': r}
                 for i, (s, r) in enumerate(tree.gpus)],
        'switches': [s._asdict() for s in tree.switches],
        'nics': [n._asdict() for n in tree.nics]}


def partitions_to_list(table):
    """The ``partitions`` of a report from a ``PartitionTable``."""
    return [{'id': p.id, 'gpus': sorted(p.gpus), 'supported': p.supported,
             'active': p.active} for p in table.partitions]


def left_out_providers(nodename, address, vfs=()):
    """Every provider name Nova 34 may have made for the GPU at PCI
    ``address`` (a PF) with virtual functions ``vfs``: an mdev parent's
    VGPU provider for the PF and each VF, and the PCI in Placement
    provider of the PF (pooled VFs or the whole GPU). Names Nova did not
    make resolve to nothing.
    """
    names = [mdev_provider_name(nodename, a) for a in (address, *vfs)]
    names.append(pci_provider_name(nodename, address))
    return names


def drivers_to_dict(info):
    """The ``nvidia`` object of a report from a ``drivers.DriverInfo``."""
    return {'driver_version': info.driver_version,
            'guest_driver_branches': list(info.guest_branches),
            'vgpu_version_range': (list(info.vgpu_versions)
                                   if info.vgpu_versions else None)}
