"""An in-process cloud with GPU hosts: real Nova, real Placement.

Built on Nova's own functional harness (``nova.tests.functional``): the
API, conductor, scheduler, Placement and nova-compute (libvirt driver) run
in this process; only the hypervisor is fake (``nova.tests.fixtures.
libvirt``), with PCI devices standing in for NVIDIA GPUs: each carries its
model's vendor and device id, and each host shows its GPUs the way Nova 34
sees that generation (``GpuHost.path``, doc/source/generations.rst):

* ``pf_mdev`` (T4, V100, P100): the PF lists the vGPU type as an mdev
  type; one VGPU provider per GPU, ``<host>_pci_<PF address>``.
* ``vf_mdev`` (A100, A30, A10, L40S, L4 with vGPU 16 and older): an SR-IOV
  PF whose VFs (``dev_type='VF'``, from function 4 on) each list the type
  as an mdev type; ``[mdev_<type>] device_addresses`` names the VFs, and
  Nova makes one VGPU provider per VF, ``<host>_pci_<VF address>``, with
  VGPU=1. In MIG mode (``mig=True``) the type is MIG-backed and the host
  carves the GPU instance when Nova creates the mdev (``GpuState.carve``).
* ``vfio`` (H100, H200, L40S with vGPU 17+): NVIDIA vendor-specific VFIO
  VFs with the type preset, plain PCI devices to Nova: ``[pci]
  device_spec`` gives them the generic class ``CUSTOM_NVIDIA_VGPU`` and
  PCI in Placement pools them in one provider per GPU,
  ``<host>_<PF ADDRESS>``; Nova's PCI tracker picks the VF.
* ``passthrough``: the PF (no VFs, vfio-pci) in ``[pci] device_spec``
  with class ``CUSTOM_NVIDIA_GPU``: one provider per GPU.

No nova-gpu-agent runs here; ``sync_gpu_reports`` plays its part: it
builds each host's GPU report from what the fake host shows (PCI ids, NUMA
nodes, every provider of each GPU named by the core's contract, the mdevs
and the GPU instances behind them, the VFs and PFs the domains use, the
NVLink pairs a real agent would read from NVML) and hands it to the
scheduler through the notification endpoint, the same code path as in
production. MIG slices come from the host's own layout, never from the
scheduler's decision.

Use ``GpuCloudTestCase`` as a test base class, or ``start_cloud`` from a
script (the all-in-one demo).
"""

import collections
import contextlib
import dataclasses
import itertools
import os
import re
import sys
import threading
import time

import fixtures
from keystoneauth1 import session as ks_session
from keystoneauth1 import token_endpoint
from lxml import etree
from nova.tests import fixtures as nova_fixtures
from nova.tests.fixtures import libvirt as fakelibvirt
from nova.tests.functional.libvirt import test_vgpu
import openstack
from oslo_config import cfg

from nova_gpu.agent import placement as agent_placement
from nova_gpu.agent import provider_config
from nova_gpu.core import catalog as catalog_mod
from nova_gpu.core import engine as engine_mod
from nova_gpu.core import flavor as grammar
from nova_gpu.core import fragmentation
from nova_gpu.core import host as host_mod
from nova_gpu.core import quota as quota_mod
from nova_gpu.core import report as report_mod
from nova_gpu.core import request as request_mod
from nova_gpu.scheduler import gpu_spec as flavor_mod
from nova_gpu.scheduler import listener
from nova_gpu.scheduler import manager as scheduler_manager
from nova_gpu.scheduler import view as view_mod
from nova_gpu.tests.harness import green
from nova_gpu.tests.harness import service_conf

CONF = cfg.CONF
IMAGE = '155d900f-4e14-4e4c-a73d-069cbf4541e6'  # in Nova's fake Glance

# What the harness sets on top of every service's files (etc/nova, see
# service_conf): reports come from sync_gpu_reports, not a message bus.
HARNESS_CONF = {'gpu_scheduler': {'report_listener': False}}
# The same cloud without the plugin: Nova's filters (the PCI and NUMA ones
# the GPU paths need), no nova-gpu scheduler file (SCHEDULER_FILES = ()).
STOCK_CONF = {
    'filter_scheduler': {
        'enabled_filters': ['ComputeFilter', 'ComputeCapabilitiesFilter',
                            'ImagePropertiesFilter',
                            'ServerGroupAntiAffinityFilter',
                            'ServerGroupAffinityFilter',
                            'NUMATopologyFilter', 'PciPassthroughFilter'],
    },
}


def scheduler_value(group, option, files=service_conf.SERVICE_FILES[
        service_conf.SCHEDULER]):
    """What nova-scheduler's files give an option, as oslo.config types it
    (a list for a list option), for tests and demos adding to it.
    """
    conf = cfg.ConfigOpts()
    conf.register_opt(CONF._get_opt_info(option, group)['opt'], group)
    value = service_conf.merge(files)[(group, option)]
    conf.set_override(option, value, group)
    return conf[group][option]


# How a fake host's GPUs reach guests (see the module doc).
PF_MDEV = 'pf_mdev'          # mdev types on the PF (Turing, Volta, Pascal)
VF_MDEV = 'vf_mdev'          # SR-IOV + mdev on each VF (vGPU 16 and older)
VFIO = 'vfio'                # NVIDIA vendor-specific VFIO VFs (vGPU 17+)
PASSTHROUGH = 'passthrough'  # the whole GPU (PF) to one guest
HOST_PATHS = (PF_MDEV, VF_MDEV, VFIO, PASSTHROUGH)
# How a vfio host's VFs get their vGPU type (GpuHost.vf_types).
PRESET = 'preset'
ON_DEMAND = 'on_demand'
VF_TYPINGS = (PRESET, ON_DEMAND)
# The first VF of an NVIDIA SR-IOV GPU is function 4 of the PF's slot
# (e.g. 0000:41:00.4 on an A100).
FIRST_VF_FUNCTION = 4
NVIDIA_VENDOR = '10de'
# ConnectX-7 (gpu:rdma hosts): PF and VF product ids.
MELLANOX_VENDOR = '15b3'
CX7_PF = '1021'
CX7_VF = '101e'
RDMA_NIC_PATH = 'rdma_nic'  # service_conf.PATH_FILES key of the NIC VFs


@dataclasses.dataclass(frozen=True)
class RdmaLayout:
    """GPUs and ConnectX NICs below PCIe switches (``GpuHost.rdma``).

    ``gpu_switches[i]``: the switch of GPU ``i``; ``nic_switches[n]``: that
    of NIC ``n``; ``roots[s]``: the root complex of switch ``s``; ``vfs``:
    VFs per NIC, each in ``[pci] device_spec`` (nova-compute-rdma-nic.conf).
    """

    gpu_switches: tuple
    nic_switches: tuple
    roots: tuple
    vfs: int = 4

    @classmethod
    def hgx_h100(cls, vfs=4, nic_switches=None):
        """The HGX H100 layout of the agent's fake sysfs
        (``tests/unit/agent/hgx_pcie.py``: 4 switches, 2 GPUs and 2 NICs
        each); ``nic_switches`` moves the NICs.
        """
        from nova_gpu.tests.unit.agent import hgx_pcie
        switches = list(hgx_pcie.SWITCHES)
        return cls(tuple(switches.index(hgx_pcie.switch_of(g))
                         for g in hgx_pcie.GPUS),
                   tuple(switches.index(hgx_pcie.switch_of(n))
                         for n in hgx_pcie.NICS)
                   if nic_switches is None else tuple(nic_switches),
                   tuple(sw.root for sw in switches), vfs)

    @staticmethod
    def switch_id(switch):
        """The upstream port address naming switch ``switch``."""
        return pci_address(0xc0 + switch, 0, 0)

    def nics(self, host_index):
        """``[(PF address, [VF addresses], switch)]`` on a host."""
        found = []
        for n, switch in enumerate(self.nic_switches):
            bus = 0x10 * (host_index + 1) + 8 + n
            found.append((pci_address(bus, 0, 0),
                          [pci_address(bus, (1 + k) // 8, (1 + k) % 8)
                           for k in range(self.vfs)], switch))
        return found


@dataclasses.dataclass(frozen=True)
class GpuHost:
    """A fake compute host: ``gpus`` GPUs of ``model``.

    ``path`` says how Nova 34 sees its GPUs (``HOST_PATHS``); by default
    the way the model's generation is shown: ``pf_mdev`` for Turing, Volta
    and Pascal, ``vf_mdev`` for Ampere and later (SR-IOV). ``vgpu_type``:
    the type nova-compute enables per GPU (mdev paths) or the type preset
    on the VFs (``vfio``); None for ``passthrough``. ``vfs``: VFs per GPU
    (SR-IOV paths; default the type's maximum per GPU, which is how many
    an operator lists in ``[mdev_*] device_addresses`` or ``[pci]
    device_spec``). ``numa`` gives each GPU's NUMA node (2 nodes),
    ``nvlink`` the NVLink-connected pairs (as NVML would). ``mig``: the
    GPUs run in MIG mode and ``vgpu_type`` is a MIG-backed vGPU type
    (``vf_mdev`` only). ``vf_types``: how a ``vfio`` host's VFs get their
    type: ``preset`` (``vgpu_type`` on every VF, as an operator scripts
    it) or ``on_demand`` (no type until a guest starts: the ``qemu`` hook
    sets it, ``nova_gpu.tests.harness.qemu_hook``; ``vgpu_type`` then only says
    how many VFs each GPU has). ``partitions``: an HGX host in Fabric
    Manager's Shared NVSwitch mode, its ``core.partitions.PartitionTable``
    (``passthrough`` only); the report marks a partition active while one
    guest holds exactly its GPUs, as the qemu hook activates it.
    ``rdma``: an ``RdmaLayout`` of PCIe switches and ConnectX-7 NICs whose
    VFs are PCI devices in Placement (gpu:rdma); the report carries the
    PCIe tree (``pcie``) as ``[gpu_agent] report_pcie_tree`` makes it.
    ``mixed_size``: the GPUs run NVIDIA's mixed-size vGPU mode (NVML
    says so to the agent, ``AgentReportsMixin``); ``vfio`` with
    ``on_demand`` VFs only, the one shape where Nova 34 gives one GPU
    vGPUs of several types (doc/source/hgx.rst).
    """

    name: str
    model: str
    vgpu_type: str = None
    gpus: int = 4
    numa: tuple = None
    nvlink: tuple = ()
    mig: bool = False
    path: str = None
    vfs: int = None
    vf_types: str = PRESET
    partitions: object = None
    rdma: object = None
    mixed_size: bool = False

    def __post_init__(self):
        model = _CATALOG.model(self.model)
        sriov = model.vgpu_mode == 'sriov'
        path = self.path or (VF_MDEV if sriov else PF_MDEV)
        object.__setattr__(self, 'path', path)
        if path not in HOST_PATHS:
            raise ValueError('%s: path %r is not one of %s'
                             % (self.name, path, ', '.join(HOST_PATHS)))
        if path == PF_MDEV and sriov:
            raise ValueError(
                '%s: %s is an SR-IOV GPU: Nova 34 shows its vGPUs on VFs '
                '(vf_mdev or vfio), never as mdev types on the PF'
                % (self.name, model.name))
        if path in (VF_MDEV, VFIO) and not sriov:
            raise ValueError('%s: %s has no SR-IOV vGPU support; use '
                             'pf_mdev' % (self.name, model.name))
        if (path == PASSTHROUGH) != (self.vgpu_type is None):
            raise ValueError('%s: a vGPU type is needed on vGPU paths and '
                             'meaningless for passthrough' % self.name)
        if self.mig and path != VF_MDEV:
            raise ValueError(
                '%s: MIG-backed vGPUs are modelled on vf_mdev hosts only: '
                'on vendor-VFIO VFs Nova pools them per GPU and its PCI '
                'tracker picks the VF, so no scheduler decides the GPU '
                'instance (see doc/source/generations.rst)' % self.name)
        if self.vgpu_type is not None:
            profile = model.vgpu_profile(self.vgpu_type)
            if profile.mig_backed != self.mig:
                raise ValueError('%s: %s is %sa MIG-backed type'
                                 % (self.name, self.vgpu_type,
                                    '' if profile.mig_backed else 'not '))
        if self.vf_types not in VF_TYPINGS:
            raise ValueError('%s: vf_types %r is not one of %s'
                             % (self.name, self.vf_types,
                                ', '.join(VF_TYPINGS)))
        if self.vf_types == ON_DEMAND and path != VFIO:
            raise ValueError('%s: only vendor-VFIO VFs (path vfio) get '
                             'their type on demand' % self.name)
        if self.mixed_size and (path != VFIO or self.vf_types != ON_DEMAND):
            raise ValueError('%s: mixed-size vGPUs need vfio VFs typed '
                             'on demand' % self.name)
        if not 1 <= self.gpus <= 16:
            raise ValueError('%s: 1 to 16 GPUs per host' % self.name)
        if self.partitions is not None and path != PASSTHROUGH:
            raise ValueError('%s: NVSwitch partitions are for whole GPUs '
                             '(passthrough) only' % self.name)
        if self.rdma is not None and (
                len(self.rdma.gpu_switches) != self.gpus or self.gpus > 8
                or len(self.rdma.nic_switches) > 8):
            raise ValueError('%s: an RDMA layout names each GPU\'s switch '
                             '(at most 8 GPUs and 8 NICs)' % self.name)

    def numa_of(self, index):
        return self.numa[index] if self.numa else index * 2 // self.gpus

    @property
    def sriov(self):
        return self.path in (VF_MDEV, VFIO)

    def vf_count(self):
        """VFs of each GPU, all usable (``[mdev_*]`` / ``device_spec``)."""
        if not self.sriov:
            return 0
        return self.vfs or self.profile().max_instances

    def profile(self):
        return _CATALOG.model(self.model).vgpu_profile(self.vgpu_type)


_CATALOG = catalog_mod.load_catalog()


def mdev_type_id(profile):
    """The fake mdev type id of a catalog vGPU type (nvidia-<n>)."""
    return 'nvidia-%d' % (600 + _CATALOG.vgpu_profile_names().index(profile))


def profile_of_type(type_id):
    return _CATALOG.vgpu_profile_names()[int(type_id.split('-')[1]) - 600]


def pci_address(bus, slot, function):
    return '0000:%02x:%02x.%x' % (bus, slot, function)


def libvirt_name(address):
    """libvirt node device name of a PCI address (pci_0000_41_00_4)."""
    return 'pci_' + re.sub('[:.]', '_', address)


def _address(libvirt_name):
    return '{}:{}:{}.{}'.format(*libvirt_name[4:].split('_'))


def _address_xml(address):
    domain, bus, rest = address.split(':')
    slot, function = rest.split('.')
    return ("<address domain='0x%s' bus='0x%s' slot='0x%s' "
            "function='0x%s'/>" % (domain, bus, slot, function))


class GpuState:
    """One physical GPU of a fake host, as its driver keeps it.

    ``address``: the PF; ``vfs``: its VFs' addresses (SR-IOV paths).
    ``gpu_instances``: mdev UUID -> the MIG slot (``host.Slot``) of the
    GPU instance that backs it, on a GPU in MIG mode.
    """

    def __init__(self, spec, index, address, vfs):
        self.spec = spec
        self.index = index
        self.address = address
        self.vfs = tuple(vfs)
        self.model = _CATALOG.model(spec.model)
        self.connection = None  # the host's fake libvirt, once it runs
        self.gpu_instances = {}
        # VF address -> the vGPU type it was given at a guest's start, on
        # a mixed-size host in the harness's reports (the agent reads it
        # from sysfs); whoever plays the qemu hook keeps it.
        self.vf_types = {}

    def functions(self):
        return (self.address,) + self.vfs

    def mdevs(self):
        """``[(mdev UUID, parent address)]`` of the mdevs on this GPU."""
        if self.connection is None:
            return []
        parents = {libvirt_name(a): a for a in self.functions()}
        found = []
        for name, mdev in list(self.connection.mdev_info.devices.items()):
            parent = re.search(r'<parent>(.*?)</parent>', mdev.xml).group(1)
            if parent in parents:
                found.append((name[len('mdev_'):].replace('_', '-'),
                              parents[parent]))
        return sorted(found)

    def available(self, parent):
        """availableInstances of the vGPU type on mdev parent ``parent``.

        On a PF: the type's maximum less the mdevs made. On a VF: one, if
        the VF has no mdev yet and the GPU still has room for one more of
        the type (and, in MIG mode, a free place for its GPU instance).
        """
        mdevs = self.mdevs()
        room = self.spec.profile().max_instances - len(mdevs)
        if parent == self.address:
            return max(room, 0)
        if room <= 0 or any(p == parent for _u, p in mdevs):
            return 0
        if self.spec.mig and not self.free_gpu_instances():
            return 0
        return 1

    def layout(self, index=None):
        """This GPU as the core sees it, with its GPU instances."""
        index = self.index if index is None else index
        gpu = host_mod.Gpu(index, self.model, mig_enabled=True,
                           vgpu_types=[self.spec.vgpu_type])
        for slot in self.gpu_instances.values():
            gpu.take(host_mod.Slot(index, slot.kind, slot.detail))
        return gpu

    def free_gpu_instances(self):
        request = request_mod.GpuRequest(host_mod.VGPU, self.spec.vgpu_type)
        return fragmentation.unit_slots(self.layout(), request)

    def carve(self, mdev_uuid):
        """Make the GPU instance behind a new MIG-backed vGPU.

        Which start slice: the one nova-gpu's core chooses on this GPU's
        own layout (``PlacementEngine.evaluate`` on this GPU alone), as
        the host's agent carves it; never what a scheduler decided.
        """
        host = host_mod.Host(self.spec.name, [self.layout(0)])
        request = request_mod.GpuRequest(host_mod.VGPU, self.spec.vgpu_type)
        choice = engine_mod.PlacementEngine().evaluate(host, request, (0,))
        if choice is None:
            raise RuntimeError('%s GPU %d: no room for a GPU instance of %s'
                               % (self.spec.name, self.index,
                                  self.spec.vgpu_type))
        (slot,) = choice.placement.slots
        self.gpu_instances[mdev_uuid] = host_mod.Slot(self.index, slot.kind,
                                                      slot.detail)
        return self.gpu_instances[mdev_uuid]


class FakeGpu(fakelibvirt.FakePCIDevice):
    """One PCI function of an NVIDIA GPU: its PF or one of its VFs.

    ``dev_type``: ``MDEV_TYPES`` (a PF with mdev types: pf_mdev), ``PF``
    (an SR-IOV PF, or a PF for passthrough with no VFs) or ``VF``. ``mdev``:
    the function lists the GPU's vGPU type as an mdev type (PF of
    pf_mdev, VFs of vf_mdev). Vendor-VFIO VFs list no mdev type: their
    type is preset (``nvidia/current_vgpu_type``) and they are plain PCI
    devices to libvirt and Nova.
    """

    def __init__(self, state, dev_type, address, parent=None, mdev=False,
                 driver='nvidia', iommu_group=40):
        self.gpu_state = state
        self.gpu_model = state.model
        self.gpu_profile = (state.model.vgpu_profile(state.spec.vgpu_type)
                            if state.spec.vgpu_type else None)
        self.mdev = mdev
        self.fn_address = address
        bus, slot, function = (int(p, 16) for p in
                               re.split('[:.]', address)[1:])
        parent_tuple = (tuple(int(p, 16) for p in
                              re.split('[:.]', parent)[1:])
                        if parent else None)
        super().__init__(
            dev_type, bus=bus, slot=slot, function=function,
            iommu_group=iommu_group, numa_node=state.spec.numa_of(
                state.index),
            vf_ratio=len(state.vfs) if dev_type in ('PF', 'VF') else None,
            parent=parent_tuple, vend_id=NVIDIA_VENDOR,
            vend_name='NVIDIA Corporation',
            prod_id=self.gpu_model.pci_device_ids[0],
            prod_name=(self.gpu_model.nvml_names or (state.model.name,))[0],
            driver_name=driver)

    def generate_xml(self, skip_capability=False):
        super().generate_xml(skip_capability=True)
        if skip_capability:
            return
        state = self.gpu_state
        caps = []
        if self.dev_type == 'PF':
            caps.append("<capability type='virt_functions' maxCount='%d'>"
                        "%s</capability>" % (len(state.vfs), ''.join(
                            _address_xml(a) for a in state.vfs)))
        elif self.dev_type == 'VF':
            caps.append("<capability type='phys_function'>%s</capability>"
                        % _address_xml(state.address))
        if self.mdev:
            self.is_capable_of_mdevs = True
            caps.append(
                "<capability type='mdev_types'><type id='%s'>"
                "<name>NVIDIA %s</name><deviceAPI>vfio-pci</deviceAPI>"
                "<availableInstances>@AVAILABLE@</availableInstances>"
                "</type></capability>" % (mdev_type_id(self.gpu_profile.name),
                                          self.gpu_profile.name))
        self.pci_device = self.pci_device.replace(
            '</vendor>', '</vendor>' + ''.join(caps), 1)

    @property
    def address(self):
        return self.fn_address

    def XMLDesc(self, flags):
        if not self.mdev:
            return self.pci_device
        return self.pci_device.replace(
            '@AVAILABLE@', str(self.gpu_state.available(self.fn_address)))


def _host_devices(spec, host_index):
    """The GPUs of ``spec`` (GpuState each) and their libvirt devices."""
    info = fakelibvirt.HostPCIDevicesInfo(num_pci=0, num_pfs=0, num_vfs=0)
    gpus = []
    group = itertools.count(40)
    for g in range(spec.gpus):
        bus = 0x10 * (host_index + 1) + g
        pf = pci_address(bus, 0, 0)
        vfs = [pci_address(bus, (FIRST_VF_FUNCTION + n) // 8,
                           (FIRST_VF_FUNCTION + n) % 8)
               for n in range(spec.vf_count())]
        state = GpuState(spec, g, pf, vfs)
        gpus.append(state)
        if spec.path == PF_MDEV:
            info.devices[libvirt_name(pf)] = FakeGpu(
                state, 'MDEV_TYPES', pf, mdev=True, iommu_group=next(group))
            continue
        info.devices[libvirt_name(pf)] = FakeGpu(
            state, 'PF', pf, iommu_group=next(group),
            driver='vfio-pci' if spec.path == PASSTHROUGH else 'nvidia')
        for vf in vfs:
            info.devices[libvirt_name(vf)] = FakeGpu(
                state, 'VF', vf, parent=pf, mdev=spec.path == VF_MDEV,
                iommu_group=next(group),
                driver='nvidia' if spec.path == VF_MDEV else 'nvidia-vfio')
    if spec.rdma is not None:
        for pf, vfs, switch in spec.rdma.nics(host_index):
            bus = int(pf.split(':')[1], 16)
            numa = spec.numa_of(spec.rdma.gpu_switches.index(switch)) if (
                switch in spec.rdma.gpu_switches) else 0
            info.devices[libvirt_name(pf)] = fakelibvirt.FakePCIDevice(
                'PF', bus, 0, 0, next(group), numa, vf_ratio=len(vfs),
                vend_id=MELLANOX_VENDOR, vend_name='Mellanox Technologies',
                prod_id=CX7_PF, prod_name='MT2910 Family [ConnectX-7]',
                driver_name='mlx5_core')
            for vf in vfs:
                slot, function = (int(p, 16) for p in
                                  re.split('[:.]', vf)[2:])
                info.devices[libvirt_name(vf)] = fakelibvirt.FakePCIDevice(
                    'VF', bus, slot, function, next(group), numa,
                    vf_ratio=len(vfs), parent=(bus, 0, 0),
                    vend_id=MELLANOX_VENDOR,
                    vend_name='Mellanox Technologies', prod_id=CX7_VF,
                    prod_name='ConnectX Family mlx5Gen Virtual Function',
                    driver_name='mlx5_core')
    return gpus, info


def _path_file_key(spec):
    """The key of ``service_conf.PATH_FILES`` for a host's path."""
    if spec.path == VF_MDEV and spec.mig:
        return 'mig_vgpu'
    return spec.path


def _host_addresses(hosts):
    """({mdev type id: [addresses]}, [(path, PCI address)]) of ``hosts``.

    What each host's nova.conf lists, as generations.rst tells operators:
    the PFs (PF mdev) or VFs (SR-IOV + mdev) per enabled type, the
    vendor-VFIO VFs and the passthrough PFs in ``device_spec``.
    """
    by_type = collections.defaultdict(list)
    device_specs = []
    for i, spec in enumerate(hosts):
        for state in _host_devices(spec, i)[0]:
            if spec.path == PF_MDEV:
                by_type[mdev_type_id(spec.vgpu_type)].append(state.address)
            elif spec.path == VF_MDEV:
                by_type[mdev_type_id(spec.vgpu_type)].extend(state.vfs)
            elif spec.path == VFIO:
                device_specs.extend((VFIO, vf) for vf in state.vfs)
            else:
                device_specs.append((PASSTHROUGH, state.address))
        if spec.rdma is not None:
            device_specs.extend((RDMA_NIC_PATH, vf) for _pf, vfs, _sw
                                in spec.rdma.nics(i) for vf in vfs)
    return dict(by_type), device_specs


# Tries to enter a cell before giving up (Nova's fixture alone: 3).
CELL_SWITCH_TRIES = 20


class _PatientTargetCell:
    """``nova.context.target_cell`` of Nova's test fixture, retried.

    Nova's ``CellDatabases`` fixture switches one global database state
    between cells and, when concurrent requests keep switching it under
    it, gives up after three tries: the context manager does not yield
    (``RuntimeError: generator didn't yield``) before its body ran. Under
    tens of concurrent boots that is the harness failing, not Nova, so
    entering is tried again, a little later each time.
    """

    def __init__(self, target_cell, context, cell_mapping):
        self._target_cell = target_cell
        self._args = (context, cell_mapping)
        self._entered = None

    def __enter__(self):
        for attempt in range(CELL_SWITCH_TRIES):
            manager = self._target_cell(*self._args)
            try:
                result = manager.__enter__()
            except RuntimeError as e:
                if ("didn't yield" not in str(e)
                        or attempt == CELL_SWITCH_TRIES - 1):
                    raise
                time.sleep(0.01 * (attempt + 1))
                continue
            self._entered = manager
            return result

    def __exit__(self, *exc_info):
        return self._entered.__exit__(*exc_info)


class _ReaderPreferringLock:
    """``fasteners.ReaderWriterLock``'s interface, readers never wait on a
    writer that only waits.

    Nova's ``CellDatabases`` fixture guards its one global database state
    with a writer-preferring lock, and its ``DatabaseWriteLock`` fixture
    serialises database writers with another lock. With native threads
    (Nova 34's default mode) a thread inside a database write that enters
    a cell waits for the cell lock behind a queued writer, while the
    writer waits for a reader that waits for that database write: the
    whole cloud stops (seen under concurrent boots, NoValidHost ones
    burying their instances in cell0). Readers first breaks the cycle; as
    there, a reader cannot become a writer, a writer may read, both nest.
    """

    def __init__(self):
        self._cond = threading.Condition()
        self._readers = collections.Counter()   # thread -> depth
        self._writer = None
        self._writer_depth = 0

    @contextlib.contextmanager
    def read_lock(self):
        me = threading.get_ident()
        with self._cond:
            while self._writer not in (None, me):
                self._cond.wait()
            self._readers[me] += 1
        try:
            yield self
        finally:
            with self._cond:
                self._readers[me] -= 1
                if not self._readers[me]:
                    del self._readers[me]
                self._cond.notify_all()

    @contextlib.contextmanager
    def write_lock(self):
        me = threading.get_ident()
        with self._cond:
            if me in self._readers and self._writer != me:
                raise RuntimeError('Reader %s to writer privilege '
                                   'escalation not allowed' % me)
            while self._writer not in (None, me) or set(self._readers) - {
                    me}:
                self._cond.wait()
            self._writer = me
            self._writer_depth += 1
        try:
            yield self
        finally:
            with self._cond:
                self._writer_depth -= 1
                if not self._writer_depth:
                    self._writer = None
                self._cond.notify_all()


def _patient_cell_switching(case):
    import nova.context
    target_cell = nova.context.target_cell
    case.useFixture(fixtures.MonkeyPatch(
        'nova.context.target_cell',
        lambda context, cell_mapping: _PatientTargetCell(
            target_cell, context, cell_mapping)))


class _ToServer:
    """A SchedulerAPI whose RPC client sends to one scheduler ``server``."""

    class _Client:
        def __init__(self, client, server):
            self._client = client
            self._server = server

        def prepare(self, **kw):
            return self._client.prepare(server=self._server, **kw)

        def __getattr__(self, name):
            return getattr(self._client, name)

    def __init__(self, api, server):
        self.client = self._Client(api.client, server)


def _round_robin(case, servers):
    """Hand scheduling requests to the schedulers in turn.

    RabbitMQ gives a queue's messages to its consumers in turn; Nova's
    fake transport gives each to whichever listener polls first, which
    here is always the first scheduler. Each ``select_destinations`` call
    is sent to the next scheduler by name instead.
    """
    from nova.scheduler import rpcapi
    real = rpcapi.SchedulerAPI.select_destinations
    turn = itertools.cycle(servers)

    def select_destinations(api, *args, **kwargs):
        return real(_ToServer(api, next(turn)), *args, **kwargs)
    case.useFixture(fixtures.MonkeyPatch(
        'nova.scheduler.rpcapi.SchedulerAPI.select_destinations',
        select_destinations))


def _gpu_plugins(service):
    """The GpuFilter and GPU weigher objects of a nova-scheduler service."""
    from nova_gpu.scheduler import filters as filters_mod
    from nova_gpu.scheduler import weighers as weighers_mod
    hm = service.manager.host_manager
    return [obj for obj in list(hm.enabled_filters) + list(hm.weighers)
            if isinstance(obj, (filters_mod.GpuFilter,
                                weighers_mod._GpuWeigher))]


def _own_view(service):
    """The GPU view ``service`` owns (one per scheduler service), or None
    for stock Nova (nothing reads a view).
    """
    if not _gpu_plugins(service):
        return None
    return view_mod.of_service(service.manager)


def _held(device, instance):
    """A report device with the Nova instance holding it, as the agent
    names it (the libvirt domain's UUID).
    """
    if instance:
        device['instance'] = instance
    return device


@dataclasses.dataclass(frozen=True, order=True)
class GuestDevice:
    """A GPU device of a guest, as the host shows it."""

    host: str
    gpu: int                # GPU index on the host (PCI order)
    gpu_address: str        # the GPU's PF
    path: str               # PF mdev, VF mdev, MIG-backed VF, ...
    function: str           # mdev parent, or the PCI function passed
    mdev: str = None        # mdev UUID (mdev paths)
    vgpu_type: str = None
    mig: tuple = None       # (MIG profile, start slice) of a MIG-backed VF


def _partitions_held(table, raw):
    """``table`` as a report lists it, a partition active while one guest
    holds exactly its GPUs (the qemu hook activated it).
    """
    held = collections.defaultdict(set)
    for gpu in raw:
        for device in gpu['devices']:
            if device.get('instance'):
                held[device['instance']].add(gpu['index'])
    sets = {frozenset(gpus) for gpus in held.values()}
    listed = report_mod.partitions_to_list(table)
    for entry in listed:
        entry['active'] = entry['supported'] and frozenset(
            entry['gpus']) in sets
    return listed


def hostdev_refs(domain_xml):
    """(mdev UUIDs, PCI addresses) a domain XML's hostdevs reference."""
    root = etree.fromstring(domain_xml.encode())
    uuids, addresses = set(), set()
    for hostdev in root.iter('hostdev'):
        addr = hostdev.find('source/address')
        if addr is None:
            continue
        if hostdev.get('type') == 'mdev':
            uuids.add(addr.get('uuid').lower())
        elif hostdev.get('type') == 'pci':
            addresses.add('%04x:%02x:%02x.%x' % tuple(
                int(addr.get(k), 0)
                for k in ('domain', 'bus', 'slot', 'function')))
    return uuids, addresses


def hostdev_xml(domain_xml):
    """The domain's ``<hostdev>`` elements, as text."""
    root = etree.fromstring(domain_xml.encode())
    return [etree.tostring(h, encoding='unicode').strip()
            for h in root.iter('hostdev')]


class GpuCloudTestCase(test_vgpu.VGPUTestBase):
    """Nova + Placement in process with the ``HOSTS`` GPU hosts started.

    Each Nova service starts from its own files of ``etc/nova``
    (:mod:`nova_gpu.tests.harness.service_conf`): nova-scheduler from
    ``SCHEDULER_FILES`` (``()``: stock Nova), every service with the PCI
    file where a host uses a PCI path, nova-compute with its hosts' path
    files. ``NOVA_CONF`` (group -> option -> value) is what the test sets
    on top, for every service.
    """

    HOSTS = ()
    NOVA_CONF = HARNESS_CONF
    SCHEDULER_FILES = service_conf.SERVICE_FILES[service_conf.SCHEDULER]
    # nova-scheduler services started, each with its own GPU view fed by
    # the same reports (as several scheduler hosts in production).
    SCHEDULERS = 1
    # [DEFAULT] max_concurrent_builds of the computes (None: Nova's 10).
    # 1 builds one instance at a time: for tests of several vGPUs of one
    # mdev provider, where Nova's libvirt driver can give one mdev to two
    # concurrent builds (Nova's race, not the scheduling a test checks).
    MAX_CONCURRENT_BUILDS = None
    # The agents' provider configs also give the GPU quota classes
    # ([gpu_agent] quota_inventory, nova_gpu.core.quota).
    GPU_QUOTA = False

    # -- nova.conf, service by service --------------------------------------

    def _service_values(self):
        """{service: {(group, option): value}} of this cloud's files."""
        if getattr(self, '_by_service', None) is not None:
            return self._by_service
        paths = sorted({_path_file_key(spec) for spec in self.HOSTS}
                       | ({RDMA_NIC_PATH} if any(
                           spec.rdma for spec in self.HOSTS) else set()))
        pci = any(spec.path in (VFIO, PASSTHROUGH) or spec.rdma
                  for spec in self.HOSTS)
        mdev, specs = _host_addresses(self.HOSTS)
        by_service = {}
        for service in service_conf.SERVICES:
            values = service_conf.merge(service_conf.service_files(
                service, self.SCHEDULER_FILES, pci=pci, paths=paths))
            if service == service_conf.COMPUTE:
                values = service_conf.host_values(values, mdev, specs)
            by_service[service] = values
        self._by_service = by_service
        return by_service

    def use_service_conf(self, service):
        """The process's CONF as ``service`` (or, None, all) reads it."""
        by_service = self._service_values()
        values = dict(service_conf.union(by_service) if service is None
                      else by_service[service])
        values.update(self._overlay())
        self._conf_applied = service_conf.apply(
            self, values, getattr(self, '_conf_applied', set()))

    def _overlay(self):
        """{(group, option): value} the test sets on every service."""
        overlay = {(group, option): value
                   for group, options in self.NOVA_CONF.items()
                   for option, value in options.items()}
        overlay.update(getattr(self, '_test_conf', {}))
        return overlay

    def flags_for_every_service(self, group, **options):
        """Set options on every service from now on, over their files.

        ``flags`` would last only until the next service starts with its
        own files.
        """
        self._test_conf = dict(getattr(self, '_test_conf', {}))
        self._test_conf.update(((group, k), v) for k, v in options.items())
        self.flags(group=group, **options)

    def _setup_conductor_service(self):
        # Runs before any service starts: process-wide settings first.
        self.flags(api_paste_config=os.path.join(
            sys.prefix, 'etc', 'nova', 'api-paste.ini'), group='wsgi')
        if self.MAX_CONCURRENT_BUILDS is not None:
            self.flags(max_concurrent_builds=self.MAX_CONCURRENT_BUILDS)
        service_conf.union(self._service_values())  # runnable in one process
        self.use_service_conf(service_conf.CONDUCTOR)
        return super()._setup_conductor_service()

    def _setup_compute_service(self):
        # Nova's _setup_services starts the API right after this (its
        # computes start in setUp): nova-api's files, and its start-time
        # check (nova/api/openstack/wsgi_app.py, _setup_service).
        result = super()._setup_compute_service()
        from nova.pci import request
        self.use_service_conf(service_conf.API)
        request.get_alias_from_config()
        return result

    @property
    def _current_host(self):
        """The host whose driver is making an mdev, per thread.

        Nova's ``VGPUTestBase`` notes it in one attribute of the test just
        before the driver calls ``_create_mdev``; with builds on several
        hosts at once in native threads, one build's note names another
        host and its mdev lands in that host's fake libvirt. The note is
        kept per thread (green thread under eventlet) instead.
        """
        return getattr(self._thread_hosts(), 'name', 'host1')

    @_current_host.setter
    def _current_host(self, name):
        self._thread_hosts().name = name

    def _thread_hosts(self):
        return self.__dict__.setdefault('_hosts_by_thread',
                                        threading.local())

    def _setup_scheduler_service(self):
        self.use_service_conf(service_conf.SCHEDULER)
        self._generations = itertools.count(1)
        # As nova-gpu-scheduler runs it: Nova's scheduler service with
        # nova-gpu's manager (with stock filters it acts as Nova's).
        first = self.start_service('scheduler',
                                   manager=scheduler_manager.MANAGER)
        self.schedulers = [first]
        # The view the first scheduler service owns (stock Nova: one fed
        # with reports that nothing reads).
        self.gpu_view = view_mod.of_service(first.manager)
        self.gpu_views = [self.gpu_view]
        for n in range(1, self.SCHEDULERS):
            # Nova's start_service allows one scheduler; the fixture under
            # it does not mind. Both consume the same RPC topic.
            service = self.useFixture(nova_fixtures.ServiceFixture(
                'scheduler', host='scheduler-%d' % n,
                manager=scheduler_manager.MANAGER)).service
            self.addCleanup(service.stop)
            self.schedulers.append(service)
            view = _own_view(service)
            if view is not None:
                self.gpu_views.append(view)
        if len(self.schedulers) > 1:
            _round_robin(self, [s.host for s in self.schedulers])
        return first

    def setUp(self):
        if not green.is_green():
            # Before Nova's setUp makes its CellDatabases fixture; under
            # eventlet (no preemption) Nova's own lock cannot meet it.
            self.useFixture(fixtures.MockPatchObject(
                sys.modules['nova.tests.fixtures.nova'], 'ReaderWriterLock',
                _ReaderPreferringLock))
        super().setUp()
        _patient_cell_switching(self)
        # Nova's CastAsCallFixture turns nova-api's cast to the conductor
        # into a call that waits for the whole build: scheduling (with
        # nova-gpu-scheduler's retries of claims other schedulers took,
        # up to [gpu_scheduler] claim_retry_seconds) and the compute's
        # build. In production that cast returns at once; here a loaded
        # 2-core machine running concurrent boots can take longer than
        # the 60 s default, and the POST would fail with MessagingTimeout.
        self.flags(rpc_response_timeout=300)
        # Nova's fake libvirt lists mdevs as a live view of its dict; in
        # native threading a build creating an mdev while another claim
        # lists them fails the listing ("dictionary changed size during
        # iteration"). libvirt's listDevices returns a list.
        self.useFixture(fixtures.MonkeyPatch(
            'nova.tests.fixtures.libvirt.HostMdevDevicesInfo.get_all_devices',
            lambda info: list(info.devices)))
        # Nova's PCI code reads the host's sysfs for these (network PFs):
        # hardware this machine does not have, as in Nova's own PCI tests.
        self.useFixture(fixtures.MockPatch(
            'nova.pci.utils.is_physical_function', return_value=False))
        self.useFixture(fixtures.MockPatch(
            'nova.pci.utils.get_function_by_ifname',
            return_value=(None, False)))
        self._host_specs = {}
        self._gpus = {}  # hostname -> [GpuState], PCI order
        self._pci_infos = {}
        self._rp_uuids = {}  # provider name -> UUID, see _provider_get
        self.path_names = flavor_mod.PathNames.from_conf()
        # instance UUID -> {nodename: the view's Decision}, for ranked_first
        self._decisions = collections.defaultdict(dict)
        for view in self._views():
            self._record_decisions(view)
        for i, spec in enumerate(self.HOSTS):
            self._gpus[spec.name], self._pci_infos[spec.name] = (
                _host_devices(spec, i))
        for spec in self.HOSTS:
            self.add_gpu_host(spec)
        self.sync_gpu_reports()

    @property
    def uses_plugin(self):
        """nova-scheduler runs nova-gpu (False: the stock Nova cloud)."""
        return bool(self.SCHEDULER_FILES)

    def add_gpu_host(self, spec):
        """Start nova-compute on the GPU host ``spec`` (one of HOSTS)."""
        self._host_specs[spec.name] = spec
        # nova-compute's files (every host's addresses: one process runs
        # every compute, as each host's own nova.conf would hold its own).
        self.use_service_conf(service_conf.COMPUTE)
        if self.uses_plugin:
            # The provider config nova-gpu-agent writes on the host, which
            # nova-compute reads when it starts (the set traits of GPUs
            # that stand for themselves; agent.provider_config).
            self.flags(provider_config_location=self._provider_config(spec),
                       group='compute')
        self.start_compute(
            hostname=spec.name, pci_info=self._pci_infos[spec.name],
            libvirt_version=self.FAKE_LIBVIRT_VERSION,
            qemu_version=self.FAKE_QEMU_VERSION)
        # Every service runs: the union of their files.
        self.use_service_conf(None)
        compute = self.computes[spec.name]
        conn = compute.driver._host.get_connection()
        for state in self._gpus[spec.name]:
            state.connection = conn
        return compute

    def _create_mdev(self, dev_name, mdev_type, uuid=None):
        """The host's driver makes an mdev (Nova's fake, plus MIG).

        On a GPU in MIG mode, the vGPU manager puts a MIG-backed vGPU on
        a GPU instance; the host carves it here, from its own layout
        (``GpuState.carve``).
        """
        uuid = super()._create_mdev(dev_name, mdev_type, uuid)
        address = _address(dev_name)
        for state in self._gpus.get(self._current_host, ()):
            if state.spec.mig and address in state.vfs:
                state.carve(uuid)
        return uuid

    # -- the agent's part -------------------------------------------------

    def _provider_config(self, spec):
        """Write host ``spec``'s provider config as the agent would;
        return its directory.
        """
        gpus = [{'index': state.index, 'traits': (),
                 'providers': self.providers_of_gpu(spec.name, state)}
                for state in self._gpus[spec.name]]
        root = getattr(self, '_provider_config_root', None)
        if root is None:
            root = self._provider_config_root = self.useFixture(
                fixtures.TempDir()).path
        directory = os.path.join(root, spec.name)
        quota_root = None
        if self.GPU_QUOTA:
            model = _CATALOG.model(spec.model)
            quota_root = provider_config.root_entry(
                spec.name, quota_mod.host_inventory(
                    (model, [p['kind'] for p in g['providers']])
                    for g in gpus))
        provider_config.write_document(
            provider_config.document_of(gpus, root=quota_root),
            os.path.join(directory, 'nova-gpu.yaml'))
        return directory

    def set_gpu_health(self, hostname, index, health):
        """What the agent's NVML health pass says of a GPU
        (``core.health.Health``; None: healthy), in its next reports.
        """
        self._health = dict(getattr(self, '_health', {}))
        self._health[(hostname, index)] = health

    def keep_gpu_heads(self, hostnames=None):
        """What nova-gpu-agent's cycle writes to Placement: the set traits
        of one free VF per GPU whose VFs are providers
        (``agent.placement.PlacementClient.keep_heads``, through
        openstacksdk against this cloud's Placement, as the agent).
        """
        if not self.uses_plugin:
            return
        for hostname in hostnames or self._host_specs:
            if self._host_specs[hostname].path != VF_MDEV:
                continue
            report = {'gpus': [
                {'index': state.index,
                 'providers': self.providers_of_gpu(hostname, state)}
                for state in self._gpus[hostname]]}
            client = self._agent_placement()
            found = client.providers(
                [p['name'] for g in report['gpus'] for p in g['providers']])
            client.keep_heads(report, found)

    def _agent_placement(self):
        client = getattr(self, '_agent_placement_client', None)
        if client is None:
            endpoint = self.placement.fixture.endpoint
            conn = openstack.connection.Connection(
                session=ks_session.Session(
                    auth=token_endpoint.Token(endpoint, 'admin')),
                placement_endpoint_override=endpoint)
            client = self._agent_placement_client = (
                agent_placement.PlacementClient(conn))
        return client

    def gpu_states(self, hostname):
        """The host's GPUs (GpuState), in PCI order = report index."""
        return self._gpus[hostname]

    def providers_of_gpu(self, hostname, state):
        """Every provider Nova makes for GPU ``state``, as report dicts.

        Names come from the core's contract (``core.report``), which
        follows Nova: mdev parents in nova/virt/libvirt/driver.py, PCI
        devices in nova/compute/pci_placement_translator.py.
        """
        spec = state.spec
        names = self.path_names
        node = hostname  # the fake hypervisor's hostname and node name
        if spec.path == PF_MDEV:
            return [report_mod.provider_dict(
                report_mod.mdev_provider_name(node, state.address),
                report_mod.PF_MDEV, state.address, report_mod.VGPU_RC,
                spec.vgpu_type)]
        if spec.path == VF_MDEV:
            on_vf = {parent: uuid for uuid, parent in state.mdevs()}
            result = []
            for vf in state.vfs:
                slot = state.gpu_instances.get(on_vf.get(vf))
                result.append(report_mod.provider_dict(
                    report_mod.mdev_provider_name(node, vf),
                    report_mod.VF_MDEV, vf, report_mod.VGPU_RC,
                    spec.vgpu_type, mig=slot.detail[:2] if slot else None))
            return result
        if spec.path == VFIO:
            pool_type = spec.vgpu_type
            if spec.mixed_size:
                # The agent's pool type: the one type its typed VFs hold,
                # None while none or several are set.
                held = set(state.vf_types.values())
                pool_type = held.pop() if len(held) == 1 else None
            return [report_mod.provider_dict(
                report_mod.pci_provider_name(node, state.address),
                report_mod.PCI_POOL, state.address, names.vfio_rc,
                pool_type, vfs=state.vfs)]
        return [report_mod.provider_dict(
            report_mod.pci_provider_name(node, state.address),
            report_mod.PCI_DEVICE, state.address, names.whole_rc)]

    def _domain_devices(self, hostname):
        """{mdev UUID or PCI address: domain UUID} of the host's guests."""
        conn = self.computes[hostname].driver._host.get_connection()
        used = {}
        for dom in conn.listAllDomains(
                fakelibvirt.VIR_CONNECT_LIST_DOMAINS_ACTIVE
                | fakelibvirt.VIR_CONNECT_LIST_DOMAINS_INACTIVE):
            uuids, addresses = hostdev_refs(dom.XMLDesc(0))
            for ref in uuids | addresses:
                used[ref] = dom.UUIDString()
        return used

    @staticmethod
    def _idle_mdevs(state, used):
        """Time-sliced mdevs no guest holds, as the agent lists them."""
        if state.spec.path not in (PF_MDEV, VF_MDEV):
            return []
        return [{'uuid': uuid, 'detail': state.spec.vgpu_type}
                for uuid, _parent in state.mdevs()
                if uuid not in state.gpu_instances
                and uuid.lower() not in used]

    def _gpu_devices(self, state, used):
        """The GPU's devices in use, as the agent reads them."""
        spec = state.spec
        if spec.path in (PF_MDEV, VF_MDEV):
            # An mdev counts only while a guest holds it: Nova gives an
            # idle one to the next guest of its type, and in MIG mode the
            # GPU instance behind it with it (the agent reports those
            # under idle_mdevs and idle_gpu_instances, as room).
            devices = []
            for uuid, _parent in state.mdevs():
                slot = state.gpu_instances.get(uuid)
                if slot is not None and uuid.lower() in used:
                    devices.append(_held({'kind': host_mod.MIG,
                                          'detail': list(slot.detail),
                                          'uuid': uuid},
                                         used[uuid.lower()]))
                elif uuid.lower() in used:
                    devices.append(_held({'kind': host_mod.VGPU,
                                          'detail': spec.vgpu_type,
                                          'uuid': uuid}, used[uuid.lower()]))
            return devices
        if spec.path == VFIO and spec.mixed_size:
            # VFs typed on demand: a typed VF is a vGPU in use, of the
            # type it was given (``[gpu_agent] vf_types_on_demand``).
            return [_held({'kind': host_mod.VGPU,
                           'detail': state.vf_types[vf], 'vf': vf},
                          used.get(vf))
                    for vf in state.vfs if vf in state.vf_types]
        if spec.path == VFIO:
            return [_held({'kind': host_mod.VGPU, 'detail': spec.vgpu_type,
                           'vf': vf}, used[vf])
                    for vf in state.vfs if vf in used]
        return ([_held({'kind': host_mod.WHOLE}, used[state.address])]
                if state.address in used else [])

    def gpu_report(self, hostname):
        """The GPU report nova-gpu-agent would publish for ``hostname``."""
        spec = self._host_specs[hostname]
        conn = self.computes[hostname].driver._host.get_connection()
        info = conn.host_info
        cells = info.cpu_nodes
        used = self._domain_devices(hostname)
        raw = []
        for state in self._gpus[hostname]:
            i = state.index
            peers = [j for pair in spec.nvlink if i in pair
                     for j in pair if j != i]
            raw.append({
                'index': i, 'address': state.address,
                'model': state.model.name, 'numa_node': spec.numa_of(i),
                'pcie_switch': None, 'nvlink_peers': sorted(peers),
                'mig_enabled': spec.mig,
                'vgpu_types': [spec.vgpu_type] if spec.vgpu_type else None,
                'providers': self.providers_of_gpu(hostname, state),
                'devices': self._gpu_devices(state, used),
                'idle_mdevs': self._idle_mdevs(state, used),
                'idle_gpu_instances': [
                    {'detail': list(state.gpu_instances[uuid].detail)}
                    for uuid, _parent in state.mdevs()
                    if uuid in state.gpu_instances
                    and uuid.lower() not in used]})
            if spec.mixed_size:
                # As the agent reports a GPU in mixed-size mode whose VFs
                # list every time-sliced type as creatable: every such
                # type, and the scheduler's fit rule decides.
                raw[-1]['mixed_size'] = True
                raw[-1]['vgpu_types'] = sorted(
                    name for name, profile in
                    state.model.vgpu_profiles.items()
                    if not profile.mig_backed)
            health = getattr(self, '_health', {}).get((hostname, i))
            if health is not None:
                raw[-1]['health'] = health.to_dict()
        extra = {}
        if spec.partitions is not None:
            extra['partitions'] = _partitions_held(spec.partitions, raw)
        if spec.rdma is not None:
            extra['pcie'] = self._pcie_tree(hostname, used)
        return {
            'version': report_mod.VERSION, 'host': hostname,
            'nodename': hostname, 'generation': next(self._generations),
            'cpu_milli': info.cpus * 1000,
            'memory_mib': info.kB_mem // 1024,
            'numa_cells': [{'id': n, 'cpu_milli': info.cpus * 1000 // cells,
                            'memory_mib': info.kB_mem // 1024 // cells}
                           for n in range(cells)],
            'gpus': raw, **extra}

    def rdma_nics(self, hostname):
        """``[(PF address, [VF addresses], switch)]`` of a gpu:rdma host."""
        spec = self._host_specs[hostname]
        return spec.rdma.nics(self.HOSTS.index(spec))

    def _pcie_tree(self, hostname, used):
        """The report's ``pcie``, as ``agent.pcie`` reads it on the host:
        a VF a domain holds is used (the agent sees it bound to vfio-pci).
        """
        layout = self._host_specs[hostname].rdma
        switch, root = layout.switch_id, layout.roots.__getitem__
        return {
            'gpus': [{'index': i, 'switch': switch(s), 'root': root(s)}
                     for i, s in enumerate(layout.gpu_switches)],
            'switches': [{'id': switch(s), 'root': r, 'acs_redirect': False,
                          'device': '1000:c030'}
                         for s, r in enumerate(layout.roots)],
            'nics': [{'address': pf, 'switch': switch(s), 'root': root(s),
                      'vfs': len(vfs),
                      'vfs_used': sum(1 for vf in vfs if vf in used),
                      'provider': report_mod.pci_provider_name(hostname, pf),
                      'device': '%s:%s' % (MELLANOX_VENDOR, CX7_PF)}
                     for pf, vfs, s in self.rdma_nics(hostname)]}

    def _provider_get(self, provider_name, what):
        """GET ``/resource_providers/<uuid>/<what>`` of a named provider;
        None while Placement has no such provider.

        The name's UUID is remembered: reports are built often (every
        state change, and in the reliability runs many times a second).
        """
        for _attempt in range(2):
            uuid = self._rp_uuids.get(provider_name)
            if uuid is None:
                rps = self.placement.get(
                    '/resource_providers?name=%s' % provider_name).body[
                    'resource_providers']
                if not rps:
                    return None
                uuid = self._rp_uuids[provider_name] = rps[0]['uuid']
            resp = self.placement.get('/resource_providers/%s/%s'
                                      % (uuid, what))
            if resp.status == 200:
                return resp.body
            # Deleted and made again (a compute restarted): look it up.
            self._rp_uuids.pop(provider_name, None)
        return None

    def _views(self):
        """Every scheduler's GPU view (``gpu_view`` is the first one's)."""
        return [self.gpu_view] + getattr(self, 'gpu_views', [])[1:]

    def sync_gpu_reports(self, hostnames=None):
        """Publish every host's report (or ``hostnames``') to the
        schedulers' views.
        """
        self.keep_gpu_heads(hostnames)
        endpoints = [listener.ReportEndpoint(view)
                     for view in self._views()]
        for hostname in hostnames or self._host_specs:
            report = self.gpu_report(hostname)
            for endpoint in endpoints:
                endpoint.info({}, '%s.%s' % (report_mod.PUBLISHER,
                                             hostname),
                              report_mod.EVENT_TYPE, report, {})

    def _wait_for_state_change(self, server, expected_status, *args,
                               **kwargs):
        server = super()._wait_for_state_change(server, expected_status,
                                                *args, **kwargs)
        # The agent reports after every device change.
        self.sync_gpu_reports()
        return server

    # -- helpers for tests and the demo -----------------------------------

    def create_gpu_flavor(self, extra_specs, memory_mb=2048, vcpu=2,
                          name=None, **kw):
        """A flavor with ``gpu:`` extra specs plus the Placement/PCI keys
        of its path (``flavor.placement_extra_specs``).

        ``kw``: more of ``_create_flavor``'s arguments (disk, ephemeral...).
        """
        specs = dict(extra_specs)
        if not any(k.startswith('resources') or k == grammar.ALIAS_KEY
                   for k in specs):
            parsed = flavor_mod.parse(specs, vcpus=vcpu, memory_mb=memory_mb)
            specs.update(flavor_mod.placement_extra_specs(
                parsed, sets=self.uses_plugin))
        return self._create_flavor(memory_mb=memory_mb, vcpu=vcpu,
                                   name=name, extra_spec=specs, **kw)

    def boot(self, flavor_id, expected_state='ACTIVE', **kw):
        return self._create_server(image_uuid=IMAGE, flavor_id=flavor_id,
                                   networks='none',
                                   expected_state=expected_state, **kw)

    def _gpu_classes(self):
        names = self.path_names
        return {report_mod.VGPU_RC, names.vfio_rc, names.whole_rc}

    def gpu_providers_of(self, server):
        """Names of the GPU providers holding the server's devices."""
        allocations = self._get_allocations_by_server_uuid(server['id'])
        classes = self._gpu_classes()
        names = []
        for rp_uuid, alloc in allocations.items():
            if classes & set(alloc['resources']):
                names.append(self.placement.get(
                    '/resource_providers/%s' % rp_uuid).body['name'])
        return sorted(names)

    def _provider_gpus(self):
        """Provider name -> (hostname, GPU index), every host's."""
        found = {}
        for hostname, gpus in self._gpus.items():
            for state in gpus:
                for p in self.providers_of_gpu(hostname, state):
                    found[p['name']] = (hostname, state.index)
        return found

    def gpu_index(self, provider_name):
        """GPU index (PCI order) of a GPU provider of any kind."""
        return self._provider_gpus()[provider_name][1]

    def gpus_of(self, server):
        """Sorted GPU indices of the server's GPU allocations."""
        where = self._provider_gpus()
        return sorted(where[p][1] for p in self.gpu_providers_of(server))

    def provider_name(self, hostname, index):
        """The provider of GPU ``index`` on a host whose GPUs have one
        (pf_mdev: the PF; vfio: the VF pool; passthrough: the PF).
        """
        (provider,) = self.providers_of_gpu(
            hostname, self._gpus[hostname][index])
        return provider['name']

    def vgpu_usage(self, hostname):
        """GPU index -> (used, total) over every provider of the GPU."""
        classes = self._gpu_classes()
        result = {}
        for state in self._gpus[hostname]:
            used = total = 0
            for p in self.providers_of_gpu(hostname, state):
                inventory = self._provider_get(p['name'], 'inventories')
                usages = self._provider_get(p['name'], 'usages')
                for rc in classes:
                    if inventory and rc in inventory['inventories']:
                        total += inventory['inventories'][rc]['total']
                        used += usages['usages'].get(rc, 0)
            result[state.index] = (used, total)
        return result

    def domain_xml(self, server):
        """The domain XML Nova's libvirt driver defined for ``server``."""
        host = self.admin_api.get_server(server['id'])[
            'OS-EXT-SRV-ATTR:host']
        conn = self.computes[host].driver._host.get_connection()
        return conn.lookupByUUIDString(server['id']).XMLDesc(0)

    def guest_devices(self, server):
        """What the guest got, read from the domain XML Nova wrote and the
        host's devices: one GuestDevice per GPU device, by GPU index.
        """
        host = self.admin_api.get_server(server['id'])[
            'OS-EXT-SRV-ATTR:host']
        xml = self.domain_xml(server)
        uuids, addresses = hostdev_refs(xml)
        result = []
        for state in self._gpus[host]:
            spec = state.spec
            for uuid, parent in state.mdevs():
                if uuid in uuids:
                    slot = state.gpu_instances.get(uuid)
                    result.append(GuestDevice(
                        host, state.index, state.address,
                        'MIG-backed VF' if slot else
                        'VF mdev' if parent != state.address else 'PF mdev',
                        parent, uuid, spec.vgpu_type,
                        slot.detail[:2] if slot else None))
            for fn in state.functions():
                if fn in addresses:
                    result.append(GuestDevice(
                        host, state.index, state.address,
                        'passthrough' if fn == state.address
                        else 'vendor-VFIO VF', fn, None, spec.vgpu_type,
                        None))
        return sorted(result)

    def _record_decisions(self, view):
        """Keep every Decision ``view`` gives, by instance and host."""
        decide = view.decide

        def recording(request, nodename, *args, **kwargs):
            decision = decide(request, nodename, *args, **kwargs)
            if request.instance_uuid:
                self._decisions[request.instance_uuid][nodename] = decision
            return decision
        view.decide = recording

    def ranked_first(self, server):
        """GPU indices the plugin ranked first for ``server`` on the host
        it landed on (its last scheduling pass), or None.
        """
        host = self.admin_api.get_server(server['id'])[
            'OS-EXT-SRV-ATTR:host']
        decision = self._decisions.get(server['id'], {}).get(host)
        if decision is None or decision.ranked is None:
            return None
        return tuple(decision.ranked.gpus)


def start_cloud(hosts, nova_conf=None, mixins=(), scheduler_files=None,
                gpu_quota=False):
    """Start the cloud outside a test runner; call ``.doCleanups()`` to stop.

    Returns the running GpuCloudTestCase: use ``create_gpu_flavor``,
    ``boot``, ``gpu_providers_of``, ``api`` and ``placement`` on it.
    ``mixins``: classes put before GpuCloudTestCase, e.g.
    ``(harness.agent_process.AgentReportsMixin,)``: a real nova-gpu-agent
    process per GPU host reports over RabbitMQ (MIG hosts are still
    reported by the harness) instead of ``sync_gpu_reports``. The caller
    imports them: agent_process builds on this module, not the reverse.
    ``scheduler_files``: nova-scheduler's files (``()``: stock Nova).
    ``gpu_quota``: the hosts offer the GPU quota classes (``GPU_QUOTA``).
    """
    attrs = {'HOSTS': tuple(hosts), 'runTest': lambda self: None,
             'GPU_QUOTA': gpu_quota}
    if nova_conf is not None:
        attrs['NOVA_CONF'] = nova_conf
    if scheduler_files is not None:
        attrs['SCHEDULER_FILES'] = tuple(scheduler_files)
    bases = tuple(mixins) + (GpuCloudTestCase,)
    case = type('GpuCloud', bases, attrs)()
    case.useFixture(fixtures.EnvironmentVariable('OS_TEST_TIMEOUT', '0'))
    try:
        case.setUp()
    except BaseException:
        # Nova's fixtures patch the process (Placement's client, the
        # database, the RPC): undo them, or the caller's next cloud (or
        # the next test of the worker) starts on a half-patched process.
        case.doCleanups()
        raise
    return case
