"""A stand-in for the ``pynvml`` module on hosts without NVIDIA GPUs.

Only the functions the agent calls are implemented, with pynvml's own
signatures, constants, structures and exception classes, so the agent code
runs unchanged. Two host shapes:

* ``hgx_h100()``: 8 x "NVIDIA H100 80GB HBM3" on two NUMA nodes (4 + 4,
  each pair behind one PCIe switch), every GPU with 18 NVLinks spread over
  4 NVSwitches (5/4/4/5 links), as on a DGX/HGX H100 board;
* ``a100_mig()``: one "NVIDIA A100-SXM4-40GB" in MIG mode with a 3g.20gb
  instance at slice 0 and a 2g.10gb instance at slice 4 (profile ids and
  sizes as `nvidia-smi mig -lgip` prints them for that GPU).

vGPU type ids are illustrative (they differ per driver release).
"""

import ctypes
import json
import os
import types

import pynvml

# DGX H100 GPU bus ids; NUMA 0 holds the first four.
H100_BUS = ['1b', '43', '52', '61', '9d', 'c3', 'd1', 'df']
NVSWITCH_BUS = ['05', '06', '07', '08']
H100_LINKS_PER_SWITCH = [5, 4, 4, 5]
H100_VGPU_TYPES = {1061: 'NVIDIA H100XM-10C', 1062: 'NVIDIA H100XM-20C',
                   1063: 'NVIDIA H100XM-40C', 1064: 'NVIDIA H100XM-80C'}

# A100-SXM4-40GB GPU instance profiles: NVML profile -> (id, compute
# slices, memory size MB, memory slices)
A100_GI_PROFILES = {
    pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE: (19, 1, 4864, 1),
    pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1: (20, 1, 4864, 1),
    pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2: (15, 1, 9856, 2),
    pynvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE: (14, 2, 9856, 2),
    pynvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE: (9, 3, 19968, 4),
    pynvml.NVML_GPU_INSTANCE_PROFILE_4_SLICE: (5, 4, 19968, 4),
    pynvml.NVML_GPU_INSTANCE_PROFILE_7_SLICE: (0, 7, 40192, 8),
}


class FakeGpu:
    def __init__(self, bus_id, name, memory_mib, numa=0, mig=False,
                 links=(), vgpu_types=None):
        self.bus_id = bus_id
        self.name = name
        self.memory_mib = memory_mib
        self.numa = numa
        self.mig = mig
        self.links = list(links)  # remote bus id per link
        self.vgpu_types = dict(vgpu_types or {})
        self.gis = {}  # gi id -> dict(profile, start, size, cis)
        self.next_gi = 1
        # MIG mode after the next reset where a switch waits for one
        # (None: as ``mig``); ``needs_reset``: NVML cannot reset this GPU
        # itself (a switch stays pending); ``mig_capable`` False: NVML
        # answers NotSupported.
        self.pending = None
        self.needs_reset = False
        self.mig_capable = True
        self.vgpus = {}  # vGPU instance id -> GPU instance id it runs on
        # Health counters (nvml.h): volatile uncorrectable ECC errors,
        # retired pages pending, remapped rows (corr, unc, pending,
        # failure), clock event reasons. ``health_counters`` False: the
        # GPU has none of them (NVML_ERROR_NOT_SUPPORTED, as on a T4 or
        # with ECC off).
        self.ecc_volatile = 0
        self.retired_pending = False
        self.remap = (0, 0, False, False)
        self.clock_reasons = 0
        self.health_counters = True
        self.events_supported = 0x8 | 0x2  # Xid critical, double-bit ECC
        # Use of each GPU instance (MIG): the share of time its engines
        # were busy over the last pass (0-100, NVML GPM's graphics
        # activity) and the frame buffer it uses (MiB). GPM (GPU
        # Performance Monitoring) exists from Hopper on.
        self.gi_util = {}
        self.gi_memory_used = {}
        self.gpm = any(g in name for g in ('H100', 'H200', 'B200'))
        # NVML's vGPU heterogeneous mode (mixed-size vGPUs, R550 on): 1
        # on, 0 off, None: the call is NotSupported (no such mode).
        self.heterogeneous = None
        # nvmlDeviceGetUtilizationRates (percent of the last sample
        # period); NVML answers NotSupported on a GPU in MIG mode.
        self.utilization = 0


class FakePynvml(types.SimpleNamespace):
    """Behaves like the pynvml module for the calls the agent makes."""

    def __init__(self, gpus=(), library_missing=False, state_file=None):
        super().__init__()
        for name in dir(pynvml):
            if name.startswith(('NVML_', 'NVMLError', 'c_nvml')):
                setattr(self, name, getattr(pynvml, name))
        self.gpus = list(gpus)
        self.library_missing = library_missing
        self.fail_compute_instance = False
        self.calls = []
        self._gi_handles = {}
        self.vgpu_listing_fails = False
        # With a state file the GPU instances live there, as they live in
        # the driver: a process killed mid-change leaves them, and the next
        # process sees them (crash tests).
        self.state_file = state_file
        if state_file and os.path.exists(state_file):
            self._sync()

    # -- health: events and counters, as nvml.h documents them ----------

    def nvmlEventSetCreate(self):
        return {'queue': [], 'devices': {}}

    def nvmlDeviceGetSupportedEventTypes(self, dev):
        return dev.events_supported

    def nvmlDeviceRegisterEvents(self, dev, types_, event_set):
        if types_ & ~dev.events_supported:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        event_set['devices'][id(dev)] = types_
        self.event_sets = getattr(self, 'event_sets', [])
        if event_set not in self.event_sets:
            self.event_sets.append(event_set)

    def raise_event(self, dev, event_type, data=0):
        """The driver posts an event (an Xid, a double-bit ECC error) to
        every set the GPU registered it in.
        """
        for event_set in getattr(self, 'event_sets', ()):
            if event_set['devices'].get(id(dev), 0) & event_type:
                event = pynvml.c_nvmlEventData_t()
                event.eventType = event_type
                event.eventData = data
                event_set['queue'].append((dev, event))

    def nvmlEventSetWait_v2(self, event_set, timeout_ms):
        # nvmlEventSetWait_v2: NVML_ERROR_TIMEOUT when nothing arrived in
        # timeout_ms (0: return at once).
        if not event_set['queue']:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)
        dev, event = event_set['queue'].pop(0)
        # The device handle of the event: the GPU's own handle.
        return types.SimpleNamespace(device=dev, eventType=event.eventType,
                                     eventData=event.eventData,
                                     gpuInstanceId=0, computeInstanceId=0)

    def _counters(self, dev):
        if not dev.health_counters:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetTotalEccErrors(self, dev, error_type, counter_type):
        self._counters(dev)
        if (error_type, counter_type) != (
                pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                pynvml.NVML_VOLATILE_ECC):
            return 0
        return dev.ecc_volatile

    def nvmlDeviceGetRetiredPagesPendingStatus(self, dev):
        self._counters(dev)
        return (pynvml.NVML_FEATURE_ENABLED if dev.retired_pending
                else pynvml.NVML_FEATURE_DISABLED)

    def nvmlDeviceGetRemappedRows(self, dev):
        self._counters(dev)
        return dev.remap

    def nvmlDeviceGetCurrentClocksEventReasons(self, dev):
        self._counters(dev)
        return dev.clock_reasons

    def reset_counters(self, dev):
        """What a GPU reset does to them: volatile counts and pending
        flags back to zero (aggregate ones, not modelled, stay).
        """
        dev.ecc_volatile = 0
        dev.retired_pending = False
        corr, unc, _pending, failure = dev.remap
        dev.remap = (corr, unc, False, failure)

    def fail(self, name, error, address=None):
        """Make NVML call ``name`` raise ``NVMLError(error)``, for the GPU
        at PCI ``address`` (``0000:52:00.0``) only when given (its handle,
        or its index for ``nvmlDeviceGetHandleByIndex``): a GPU fallen
        off the bus (``NVML_ERROR_GPU_IS_LOST``), a driver fault.
        """
        # The call as it stands: faults on other GPUs stay.
        real = getattr(self, name)

        def failing(*args):
            target = args[0] if args else None
            if isinstance(target, int) and name.endswith('ByIndex'):
                target = self.gpus[target]
            bus_id = getattr(target, 'bus_id', '').lower()
            if address is None or bus_id[-12:] == address.lower():
                raise pynvml.NVMLError(error)
            return real(*args)
        setattr(self, name, failing)

    def lose(self, address):
        """The GPU at PCI ``address`` falls off the bus: NVML still lists
        it (count, handle, PCI address) and every other question about it
        raises ``NVML_ERROR_GPU_IS_LOST``.
        """
        for name in dir(type(self)):
            if name.startswith('nvmlDevice') and name not in (
                    'nvmlDeviceGetCount', 'nvmlDeviceGetHandleByIndex',
                    'nvmlDeviceGetPciInfo'):
                self.fail(name, pynvml.NVML_ERROR_GPU_IS_LOST, address)

    def _sync(self):
        if not self.state_file:
            return
        try:
            with open(self.state_file) as f:
                state = json.load(f)
        except FileNotFoundError:
            return
        for dev, st in zip(self.gpus, state):
            dev.gis = {int(k): v for k, v in st['gis'].items()}
            dev.next_gi = st['next_gi']
            dev.vgpus = {int(k): v for k, v in st['vgpus'].items()}
            if 'mig' in st:
                dev.mig, dev.pending = st['mig'], st.get('pending')

    def _flush(self):
        if not self.state_file:
            return
        tmp = self.state_file + '.tmp'
        with open(tmp, 'w') as f:
            json.dump([{'gis': d.gis, 'next_gi': d.next_gi,
                        'vgpus': d.vgpus, 'mig': d.mig,
                        'pending': d.pending} for d in self.gpus], f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.state_file)

    # -- vGPUs on MIG (what the driver reports of running guests) -----------

    def start_vgpu_on(self, dev, gi_id, mdev=None):
        """A guest's vGPU now runs on GPU instance ``gi_id`` (as mdev
        ``mdev``, its UUID, where given). vGPU instance ids are unique on
        the host, as NVML's are.
        """
        self._sync()
        vgpu = max([v for g in self.gpus for v in g.vgpus] + [0]) + 1
        dev.vgpus[vgpu] = gi_id
        if mdev:
            dev.vgpu_mdevs = dict(getattr(dev, 'vgpu_mdevs', {}))
            dev.vgpu_mdevs[vgpu] = mdev
        self._flush()
        return vgpu

    def nvmlDeviceGetActiveVgpus(self, dev):
        if self.vgpu_listing_fails:
            raise pynvml.NVMLError_NotSupported()
        self._sync()
        return sorted(dev.vgpus)

    def nvmlVgpuInstanceGetMdevUUID(self, vgpu):
        # The mdev a vGPU instance runs as (KVM hosts), where recorded.
        for dev in self.gpus:
            uuid = getattr(dev, 'vgpu_mdevs', {}).get(vgpu)
            if uuid:
                return uuid
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)

    def nvmlVgpuInstanceGetGpuInstanceId(self, vgpu):
        for dev in self.gpus:
            if vgpu in dev.vgpus:
                return dev.vgpus[vgpu]
        raise pynvml.NVMLError_NotFound()

    # -- MIG devices and GPM (per GPU instance use) -------------------------

    def nvmlDeviceGetMaxMigDeviceCount(self, dev):
        if not dev.mig:
            return 0
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, dev, index):
        """A MIG device per compute instance; NVML_ERROR_NOT_FOUND where
        there is none at ``index`` (nvml.h).
        """
        self._sync()
        found = [(gi_id, n) for gi_id, gi in sorted(dev.gis.items())
                 for n in range(gi['cis'])]
        if not dev.mig or not 0 <= index < len(found):
            raise pynvml.NVMLError_NotFound()
        return types.SimpleNamespace(parent=dev, gi_id=found[index][0])

    def nvmlDeviceGetGpuInstanceId(self, mig):
        if not hasattr(mig, 'gi_id'):
            raise pynvml.NVMLError_InvalidArgument()  # not a MIG device
        return mig.gi_id

    def mig_memory_info(self, mig):
        """``nvmlDeviceGetMemoryInfo`` of a MIG device: its instance's."""
        dev = mig.parent
        total = dev.gis[mig.gi_id]['size'] * dev.memory_mib // 8
        return types.SimpleNamespace(
            total=total * 2 ** 20,
            used=dev.gi_memory_used.get(mig.gi_id, 0) * 2 ** 20)

    def nvmlGpmQueryDeviceSupport(self, dev):
        return types.SimpleNamespace(version=1,
                                     isSupportedDevice=int(dev.gpm))

    def nvmlGpmSampleAlloc(self):
        self.gpm_samples = getattr(self, 'gpm_samples', {})
        self.gpm_next = getattr(self, 'gpm_next', 0) + 1
        self.gpm_samples[self.gpm_next] = None
        return ctypes.cast(ctypes.c_void_p(self.gpm_next),
                           pynvml.c_nvmlGpmSample_t)

    def _sample_key(self, sample):
        key = ctypes.cast(sample, ctypes.c_void_p).value
        if key not in getattr(self, 'gpm_samples', {}):
            raise pynvml.NVMLError_InvalidArgument()  # freed or foreign
        return key

    def nvmlGpmSampleFree(self, sample):
        del self.gpm_samples[self._sample_key(sample)]

    def nvmlGpmMigSampleGet(self, dev, gi_id, sample):
        """NVML_ERROR_NOT_SUPPORTED before Hopper (nvml.h, GPM)."""
        if not dev.gpm:
            raise pynvml.NVMLError_NotSupported()
        if gi_id not in dev.gis:
            raise pynvml.NVMLError_NotFound()
        self.gpm_samples[self._sample_key(sample)] = (
            id(dev), gi_id, dev.gi_util.get(gi_id, 0))
        return sample

    def nvmlGpmMetricsGet(self, metrics):
        """Each metric between ``sample1`` and ``sample2`` (taken of the
        same instance, in that order); here the activity the later one
        recorded.
        """
        first = self.gpm_samples[self._sample_key(metrics.sample1)]
        second = self.gpm_samples[self._sample_key(metrics.sample2)]
        if first is None or second is None or first[:2] != second[:2]:
            raise pynvml.NVMLError_InvalidArgument()
        for i in range(metrics.numMetrics):
            m = metrics.metrics[i]
            if m.metricId == pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL:
                m.value, m.nvmlReturn = float(second[2]), pynvml.NVML_SUCCESS
            else:
                m.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
        return metrics

    # -- init ---------------------------------------------------------------

    def nvmlInit(self):
        if self.library_missing:
            raise pynvml.NVMLError_LibraryNotFound()

    def nvmlShutdown(self):
        pass

    # -- system (driver versions) -------------------------------------------

    # A vGPU 17 host: R550 manager, vGPU versions 0x10000..0x110000 (the
    # values are illustrative; only their order is compared). Set
    # ``driver_version`` None for a driver that does not answer.
    driver_version = b'550.54.14'
    vgpu_versions = ((0x10000, 0x110000), (0x10000, 0x110000))

    def nvmlSystemGetDriverVersion(self):
        if self.driver_version is None:
            raise pynvml.NVMLError_NotSupported()
        return self.driver_version

    def nvmlGetVgpuVersion(self):
        if self.vgpu_versions is None:
            raise pynvml.NVMLError_NotSupported()
        return [tuple(r) for r in self.vgpu_versions]

    # -- devices ------------------------------------------------------------

    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index):
        if not 0 <= index < len(self.gpus):
            raise pynvml.NVMLError_InvalidArgument()
        return self.gpus[index]

    def nvmlDeviceGetPciInfo(self, dev):
        return types.SimpleNamespace(busId=dev.bus_id.encode())

    def nvmlDeviceGetName(self, dev):
        return dev.name

    def nvmlDeviceGetMemoryInfo(self, dev):
        if hasattr(dev, 'gi_id'):
            return self.mig_memory_info(dev)
        return types.SimpleNamespace(total=dev.memory_mib * 2 ** 20)

    def nvmlDeviceGetUtilizationRates(self, dev):
        if hasattr(dev, 'gi_id') or dev.mig:
            raise pynvml.NVMLError_NotSupported()
        return types.SimpleNamespace(gpu=dev.utilization, memory=0)

    def nvmlDeviceGetNumaNodeId(self, dev):
        return dev.numa

    def nvmlDeviceGetVgpuHeterogeneousMode(self, dev):
        if dev.heterogeneous is None:
            raise pynvml.NVMLError_NotSupported()
        return dev.heterogeneous

    def nvmlDeviceGetMigMode(self, dev):
        if not dev.mig_capable:
            raise pynvml.NVMLError_NotSupported()
        self._sync()

        def mode(on):
            return pynvml.NVML_DEVICE_MIG_ENABLE if on else \
                pynvml.NVML_DEVICE_MIG_DISABLE
        pending = dev.mig if dev.pending is None else dev.pending
        return [mode(dev.mig), mode(pending)]

    def nvmlDeviceSetMigMode(self, dev, mode):
        """As the driver: refused while GPU instances or vGPUs exist; the
        GPU is reset to activate the mode unless ``needs_reset``.
        """
        if not dev.mig_capable:
            raise pynvml.NVMLError_NotSupported()
        self.calls.append(('set_mig_mode', mode))
        self._sync()
        if dev.gis or dev.vgpus:
            raise pynvml.NVMLError_InUse()
        on = mode == pynvml.NVML_DEVICE_MIG_ENABLE
        if dev.needs_reset and on != dev.mig:
            dev.pending = on
            self._flush()
            return pynvml.NVML_ERROR_RESET_REQUIRED
        dev.mig, dev.pending = on, None
        self._flush()
        return pynvml.NVML_SUCCESS

    def reset_gpu(self, dev):
        """``nvidia-smi -r``: a pending MIG mode takes effect."""
        self._sync()
        if dev.pending is not None:
            dev.mig, dev.pending = dev.pending, None
        dev.gis.clear()
        self._flush()

    def nvmlDeviceGetNvLinkState(self, dev, link):
        if link >= len(dev.links):
            raise pynvml.NVMLError_InvalidArgument()
        return pynvml.NVML_FEATURE_ENABLED

    def nvmlDeviceGetNvLinkRemotePciInfo(self, dev, link):
        return types.SimpleNamespace(busId=dev.links[link].encode())

    def nvmlDeviceGetTopologyCommonAncestor(self, a, b):
        ia, ib = self.gpus.index(a), self.gpus.index(b)
        if ia // 2 == ib // 2:  # a pair behind one PCIe switch
            return pynvml.NVML_TOPOLOGY_SINGLE
        if a.numa == b.numa:
            return pynvml.NVML_TOPOLOGY_NODE
        return pynvml.NVML_TOPOLOGY_SYSTEM

    def nvmlDeviceGetSupportedVgpus(self, dev):
        if dev.mig:
            return []
        return list(dev.vgpu_types)

    def nvmlDeviceGetCreatableVgpus(self, dev):
        return self.nvmlDeviceGetSupportedVgpus(dev)

    def nvmlVgpuTypeGetName(self, type_id):
        for dev in self.gpus:
            if type_id in dev.vgpu_types:
                return dev.vgpu_types[type_id]
        raise pynvml.NVMLError_InvalidArgument()

    # -- MIG ------------------------------------------------------------------

    def _profile(self, dev, profile):
        if not dev.mig or profile not in A100_GI_PROFILES:
            raise pynvml.NVMLError_NotSupported()
        gid, slices, mem, _ = A100_GI_PROFILES[profile]
        return types.SimpleNamespace(id=gid, sliceCount=slices,
                                     memorySizeMB=mem)

    def nvmlDeviceGetGpuInstanceProfileInfo(self, dev, profile):
        return self._profile(dev, profile)

    def _gi_handle(self, dev, gi_id):
        key = (id(dev), gi_id)
        handle = ctypes.cast(ctypes.c_void_p(len(self._gi_handles) + 16),
                             pynvml.c_nvmlGpuInstance_t)
        self._gi_handles[ctypes.cast(handle, ctypes.c_void_p).value] = key
        return handle

    def _gi(self, handle):
        dev_id, gi_id = self._gi_handles[
            ctypes.cast(handle, ctypes.c_void_p).value]
        dev = next(d for d in self.gpus if id(d) == dev_id)
        return dev, gi_id

    def nvmlDeviceGetGpuInstances(self, dev, profile_id, handles, count):
        self._sync()
        found = [g for g, gi in sorted(dev.gis.items())
                 if gi['profile_id'] == profile_id]
        for i, gi_id in enumerate(found):
            handles[i] = self._gi_handle(dev, gi_id)
        count._obj.value = len(found)

    def nvmlGpuInstanceGetInfo(self, handle):
        dev, gi_id = self._gi(handle)
        gi = dev.gis[gi_id]
        return types.SimpleNamespace(
            id=gi_id, profileId=gi['profile_id'],
            placement=types.SimpleNamespace(start=gi['start'],
                                            size=gi['size']))

    def nvmlDeviceGetGpuInstanceById(self, dev, gi_id):
        self._sync()
        if gi_id not in dev.gis:
            raise pynvml.NVMLError_NotFound()
        return self._gi_handle(dev, gi_id)

    def add_gi(self, dev, profile, start):
        gid, _, _, size = A100_GI_PROFILES[profile]
        mask = ((1 << size) - 1) << start
        for gi in dev.gis.values():
            if gi['mask'] & mask:
                raise pynvml.NVMLError_InsufficientResources()
        gi_id = dev.next_gi
        dev.next_gi += 1
        dev.gis[gi_id] = dict(profile_id=gid, start=start, size=size,
                              mask=mask, cis=0)
        return gi_id

    def nvmlDeviceCreateGpuInstanceWithPlacement(self, dev, profile_id,
                                                 placement):
        self.calls.append(('create_gi', profile_id, placement.start,
                           placement.size))
        profile = next(p for p, v in A100_GI_PROFILES.items()
                       if v[0] == profile_id)
        if A100_GI_PROFILES[profile][3] != placement.size:
            raise pynvml.NVMLError_InvalidArgument()
        self._sync()
        gi_id = self.add_gi(dev, profile, placement.start)
        self._flush()
        return self._gi_handle(dev, gi_id)

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(self, gi, profile,
                                                     engine):
        return types.SimpleNamespace(id=profile)

    def nvmlGpuInstanceCreateComputeInstance(self, gi, profile_id):
        if self.fail_compute_instance:
            raise pynvml.NVMLError_InsufficientResources()
        dev, gi_id = self._gi(gi)
        self._sync()
        dev.gis[gi_id]['cis'] += 1
        self._flush()

    def nvmlGpuInstanceGetComputeInstances(self, gi, profile_id, cis, count):
        dev, gi_id = self._gi(gi)
        self._sync()
        n = dev.gis[gi_id]['cis']
        index = self.gpus.index(dev)
        for i in range(n):
            cis[i] = ctypes.cast(
                ctypes.c_void_p((index * 1000 + gi_id) * 100 + i + 1),
                pynvml.c_nvmlComputeInstance_t)
        count._obj.value = n

    def nvmlComputeInstanceDestroy(self, ci):
        value = ctypes.cast(ci, ctypes.c_void_p).value - 1
        index, gi_id = divmod(value // 100, 1000)
        self.calls.append(('destroy_ci',))
        self._sync()
        gi = self.gpus[index].gis.get(gi_id)
        if gi and gi['cis']:
            gi['cis'] -= 1
            self._flush()

    def nvmlGpuInstanceDestroy(self, gi):
        dev, gi_id = self._gi(gi)
        self.calls.append(('destroy_gi', gi_id))
        self._sync()
        if dev.gis.get(gi_id, {}).get('cis'):
            raise pynvml.NVMLError_InUse()  # compute instances first
        if gi_id in dev.vgpus.values():
            raise pynvml.NVMLError_InUse()
        del dev.gis[gi_id]
        self._flush()


def hgx_h100():
    gpus = []
    for i, bus in enumerate(H100_BUS):
        links = []
        for sw, n in zip(NVSWITCH_BUS, H100_LINKS_PER_SWITCH):
            links += ['00000000:%s:00.0' % sw.upper()] * n
        gpus.append(FakeGpu('00000000:%s:00.0' % bus.upper(),
                            'NVIDIA H100 80GB HBM3', 81559, numa=i // 4,
                            links=links, vgpu_types=H100_VGPU_TYPES))
    return FakePynvml(gpus)


def a100_mig(state_file=None):
    gpu = FakeGpu('00000000:07:00.0', 'NVIDIA A100-SXM4-40GB', 40960,
                  mig=True)
    fake = FakePynvml([gpu], state_file=state_file)
    if state_file and os.path.exists(state_file):
        return fake  # the instances made before are in the state file
    fake.add_gi(gpu, pynvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE, 0)
    fake.add_gi(gpu, pynvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE, 4)
    fake._flush()
    return fake


def hgx_h100_sysfs(fs):
    """The sysfs side of ``hgx_h100``: each pair behind one PCIe switch."""
    for i, bus in enumerate(H100_BUS):
        b = int(bus, 16)
        bridges = ['0000:%02x:01.0' % (b - 3), '0000:%02x:00.0' % (b - 2),
                   '0000:%02x:%02x.0' % (b - 1, i % 2)]
        if i % 2:
            prev = int(H100_BUS[i - 1], 16)
            bridges = ['0000:%02x:01.0' % (prev - 3),
                       '0000:%02x:00.0' % (prev - 2),
                       '0000:%02x:01.0' % (prev - 1)]
        fs.add_pci('0000:%s:00.0' % bus, '0x2330', numa_node=i // 4,
                   bridges=bridges)
