"""Read GPUs through NVML (pynvml) and create MIG instances.

NVML is optional: on a host without the NVIDIA driver ``nvmlInit`` raises
``NVMLError_LibraryNotFound`` and ``Nvml.available`` is False; discovery
then relies on sysfs and libvirt. ``lib`` is the pynvml module, replaced by
a fake in tests (the only place a fake stands in for it).
"""

import ctypes
import dataclasses
import functools

from oslo_log import log as logging

from nova_gpu.agent import errors
from nova_gpu.core import drivers as drivers_mod
from nova_gpu.core import exceptions

LOG = logging.getLogger(__name__)

MAX_GPU_INSTANCES = 8


@dataclasses.dataclass
class MigInstance:
    gi_id: int
    profile_id: int
    start: int
    size: int
    compute_slices: int
    memory_mib: int


@dataclasses.dataclass(frozen=True)
class UnreadableGpu:
    """A GPU NVML lists but cannot read now (``Nvml.read_gpus``)."""

    index: int  # NVML's
    address: str  # None when NVML could not even give it
    reason: str


@dataclasses.dataclass
class NvmlGpu:
    index: int
    address: str
    name: str
    memory_mib: int
    mig_enabled: bool = False
    # The MIG mode after the next GPU reset, where it differs from the
    # current one (a switch waiting for a reset); None otherwise.
    mig_pending: bool = None
    mig_instances: list = dataclasses.field(default_factory=list)
    nvlink_remotes: tuple = ()    # PCI addresses at the far end of links
    supported_vgpu_types: dict = dataclasses.field(default_factory=dict)
    creatable_vgpu_types: dict = dataclasses.field(default_factory=dict)
    numa_node: int = None
    pcie_group: str = None        # GPUs behind one PCIe switch share it
    # NVIDIA's mixed-size (heterogeneous) time-sliced vGPU mode is on
    # (vGPU 17+, ``nvidia-smi vgpu -shm 1``); False where NVML cannot say.
    mixed_size: bool = False


def normalise_bus_id(bus_id):
    """``00000000:3B:00.0`` (NVML) -> ``0000:3b:00.0`` (sysfs, libvirt)."""
    if isinstance(bus_id, bytes):
        bus_id = bus_id.decode()
    domain, _, rest = bus_id.strip().lower().partition(':')
    return '%04x:%s' % (int(domain, 16), rest)


def _text(value):
    return value.decode() if isinstance(value, bytes) else value


def _mig_profile_id(lib, compute_slices, memory_slices, media):
    """NVML GPU instance profile id for a catalog MIG profile shape."""
    if compute_slices == 1:
        if media:
            return lib.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1
        if memory_slices == 2:
            return lib.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2
        return lib.NVML_GPU_INSTANCE_PROFILE_1_SLICE
    name = 'NVML_GPU_INSTANCE_PROFILE_%d_SLICE' % compute_slices
    if not hasattr(lib, name):
        raise errors.NotFound('NVML has no GPU instance profile with %d '
                              'compute slices' % compute_slices)
    return getattr(lib, name)


class Nvml:
    def __init__(self, lib=None):
        if lib is None:
            try:
                import pynvml as lib
            except ImportError:
                lib = None
        self.lib = lib
        self.available = False
        self.reason = None
        if lib is None:
            self.reason = 'pynvml (nvidia-ml-py) is not installed'
            return
        try:
            lib.nvmlInit()
            self.available = True
        except lib.NVMLError_LibraryNotFound:
            self.reason = 'NVIDIA driver not installed (no libnvidia-ml)'
        except lib.NVMLError as e:
            self.reason = 'NVML cannot start: %s' % e
        if self.reason:
            LOG.info('NVML not used: %s', self.reason)

    def driver_info(self):
        """The vGPU manager's version and vGPU version range, or None.

        ``nvmlSystemGetDriverVersion`` names the host driver (on a vGPU
        host, the vGPU manager); ``nvmlGetVgpuVersion`` gives the preset
        and the administrator's range of vGPU versions, of which the
        current (administrator's) one decides migrations. Either may be
        missing (no driver, a driver without vGPU): None or no range.
        """
        if not self.available:
            return None
        lib = self.lib
        version = self._try(lib.nvmlSystemGetDriverVersion)
        if version is None:
            return None
        ranges = (self._try(lib.nvmlGetVgpuVersion)
                  if hasattr(lib, 'nvmlGetVgpuVersion') else None)
        current = tuple(ranges[1]) if ranges else None
        try:
            return drivers_mod.DriverInfo.build(_text(version),
                                                vgpu_versions=current)
        except exceptions.InvalidRequest as e:
            LOG.warning('NVIDIA driver not reported: %s', e)
            return None

    def close(self):
        if self.available:
            self.lib.nvmlShutdown()
            self.available = False

    def _try(self, fn, *args, default=None, lost_raises=False):
        """``fn(*args)``, or ``default`` when NVML cannot say; with
        ``lost_raises``, "GPU is lost" still raises (``_read_gpu``).
        """
        try:
            return fn(*args)
        except self.lib.NVMLError as e:
            if lost_raises and isinstance(e, self.lib.NVMLError_GpuIsLost):
                raise
            return default

    # What only refines a GPU's reading: left out when NVML cannot say,
    # but a lost GPU is not read at all.
    _refinement = functools.partialmethod(_try, lost_raises=True)

    def _count(self):
        """How many GPUs NVML lists; ``errors.Unavailable`` when it cannot
        say (the driver unloaded, say).
        """
        try:
            return self.lib.nvmlDeviceGetCount()
        except self.lib.NVMLError as e:
            raise errors.Unavailable('NVML cannot count the GPUs: %s'
                                     % e) from e

    def gpus(self):
        """The GPUs NVML reads (``read_gpus``), in NVML order."""
        return self.read_gpus()[0]

    def read_gpus(self):
        """``(gpus, unreadable)``: the GPUs NVML reads, in NVML order
        (``NvmlGpu``), and those it lists but cannot read now
        (``UnreadableGpu``: fallen off the bus, a driver fault).

        One GPU's fault leaves the others readable: the callers report,
        reconcile and carve the readable ones and leave the others alone.
        Raises ``errors.Unavailable`` when NVML cannot even count them.
        """
        if not self.available:
            return [], []
        lib = self.lib
        result, handles, unreadable = [], [], []
        for index in range(self._count()):
            address = None
            try:
                dev = lib.nvmlDeviceGetHandleByIndex(index)
                address = normalise_bus_id(
                    lib.nvmlDeviceGetPciInfo(dev).busId)
                result.append(self._read_gpu(index, dev, address))
                handles.append(dev)
            except lib.NVMLError as e:
                gone = isinstance(e, lib.NVMLError_GpuIsLost)
                unreadable.append(UnreadableGpu(index, address, str(e)))
                (LOG.error if gone else LOG.warning)(
                    'GPU %d (%s) cannot be read through NVML: %s; it is '
                    'left out until it can%s', index,
                    address or 'PCI address unknown', e,
                    ' (it needs a reset or a reboot)' if gone else '')
        self._pcie_groups(result, handles)
        return result, unreadable

    def _read_gpu(self, index, dev, address):
        """One GPU's ``NvmlGpu``; raises NVMLError when something the
        report must be right about cannot be read (its name, memory, MIG
        mode and instances), or when NVML finds the GPU lost. What only
        refines the report (NUMA node, NVLinks, vGPU types) is left out
        when NVML cannot say.
        """
        lib = self.lib
        gpu = NvmlGpu(
            index=index, address=address,
            name=_text(lib.nvmlDeviceGetName(dev)),
            memory_mib=lib.nvmlDeviceGetMemoryInfo(dev).total // 2 ** 20)
        try:
            mode = lib.nvmlDeviceGetMigMode(dev)
        except (lib.NVMLError_NotSupported,
                lib.NVMLError_FunctionNotFound):
            mode = None  # no MIG on this GPU or driver
        gpu.mig_enabled = bool(mode and mode[0] ==
                               lib.NVML_DEVICE_MIG_ENABLE)
        if mode and mode[1] != mode[0]:
            gpu.mig_pending = mode[1] == lib.NVML_DEVICE_MIG_ENABLE
        if gpu.mig_enabled:
            gpu.mig_instances = self.mig_instances(dev)
        gpu.nvlink_remotes = self._nvlink_remotes(dev)
        gpu.supported_vgpu_types = self._vgpu_types(
            dev, lib.nvmlDeviceGetSupportedVgpus)
        gpu.creatable_vgpu_types = self._vgpu_types(
            dev, lib.nvmlDeviceGetCreatableVgpus)
        gpu.numa_node = self._refinement(lib.nvmlDeviceGetNumaNodeId, dev)
        gpu.mixed_size = self._mixed_size(dev)
        return gpu

    def _mixed_size(self, dev):
        """The GPU runs vGPUs of several sizes (``Get`` of NVML's vGPU
        heterogeneous mode answers 1, as ``nvidia-smi vgpu -shm 1`` sets
        it); False before R550, on a GPU without the mode, or where NVML
        cannot say.
        """
        get = getattr(self.lib, 'nvmlDeviceGetVgpuHeterogeneousMode', None)
        if get is None:  # a pynvml older than R550's
            return False
        return self._refinement(get, dev) == 1

    def _pcie_groups(self, gpus, handles):
        """Group GPUs whose common PCIe ancestor is a switch (PIX/PXB)."""
        lib = self.lib
        group = list(range(len(gpus)))

        def find(i):
            while group[i] != i:
                i = group[i]
            return i
        for i in range(len(gpus)):
            for j in range(i + 1, len(gpus)):
                level = self._try(lib.nvmlDeviceGetTopologyCommonAncestor,
                                  handles[i], handles[j])
                if level is not None and level <= \
                        lib.NVML_TOPOLOGY_MULTIPLE:
                    group[find(j)] = find(i)
        for i, g in enumerate(gpus):
            members = [k for k in range(len(gpus)) if find(k) == find(i)]
            if len(members) > 1:
                g.pcie_group = 'nvml-switch-%d' % gpus[min(members)].index

    def _nvlink_remotes(self, dev):
        lib = self.lib
        remotes = set()
        for link in range(lib.NVML_NVLINK_MAX_LINKS):
            try:
                if lib.nvmlDeviceGetNvLinkState(dev, link) != \
                        lib.NVML_FEATURE_ENABLED:
                    continue
                info = lib.nvmlDeviceGetNvLinkRemotePciInfo(dev, link)
            except (lib.NVMLError_NotSupported,
                    lib.NVMLError_InvalidArgument):
                break
            except lib.NVMLError_GpuIsLost:
                raise
            except lib.NVMLError:
                continue
            remotes.add(normalise_bus_id(info.busId))
        return tuple(sorted(remotes))

    def _vgpu_types(self, dev, getter):
        ids = self._refinement(getter, dev, default=[]) or []
        names = {}
        for type_id in ids:
            name = self._refinement(self.lib.nvmlVgpuTypeGetName, type_id)
            if name is None:
                LOG.debug('vGPU type %s has no name in NVML; left out',
                          type_id)
                continue
            names[int(type_id)] = _text(name)
        return names

    def _handle(self, index):
        if not self.available:
            raise errors.Unavailable('NVML is not available: %s'
                                     % self.reason)
        try:
            return self.lib.nvmlDeviceGetHandleByIndex(index)
        except self.lib.NVMLError as e:
            raise errors.NotFound('GPU %d: %s' % (index, e)) from e

    def address(self, index):
        """PCI address of GPU ``index`` (journal entries name GPUs by it:
        indexes can change across reboots).
        """
        dev = self._handle(index)
        try:
            return normalise_bus_id(self.lib.nvmlDeviceGetPciInfo(dev).busId)
        except self.lib.NVMLError as e:
            raise errors.Unavailable('GPU %d: NVML cannot give its PCI '
                                     'address: %s' % (index, e)) from e

    def index_of(self, address):
        """Index of the GPU at PCI ``address``, or None when NVML lists
        none there. Raises ``errors.Unavailable`` when it cannot tell: a
        GPU NVML cannot give the address of may be that one.
        """
        if not self.available:
            return None
        unknown = None
        for index in range(self._count()):
            try:
                if self.address(index) == address:
                    return index
            except errors.AgentError as e:
                unknown = e
        if unknown is not None:
            raise errors.Unavailable('cannot tell whether NVML lists GPU %s: '
                                     '%s' % (address, unknown))
        return None

    def mig_enabled(self, index):
        mode = self.mig_mode(index)
        return bool(mode and mode[0])

    def mig_mode(self, index):
        """``(current, pending)`` MIG mode of GPU ``index``, True for
        enabled; None when the GPU has no MIG mode (NVML: not supported).
        Raises ``errors.Unavailable`` when NVML cannot tell (a GPU lost,
        a driver fault): a GPU carved into MIG instances must not be
        taken for one without MIG.

        The pending mode is the one the GPU takes at its next reset
        (``nvmlDeviceGetMigMode``).
        """
        lib = self.lib
        dev = self._handle(index)
        try:
            current, pending = lib.nvmlDeviceGetMigMode(dev)
        except (lib.NVMLError_NotSupported, lib.NVMLError_FunctionNotFound):
            return None
        except lib.NVMLError as e:
            raise errors.Unavailable('GPU %d: NVML cannot read its MIG mode: '
                                     '%s' % (index, e)) from e
        return (current == lib.NVML_DEVICE_MIG_ENABLE,
                pending == lib.NVML_DEVICE_MIG_ENABLE)

    def set_mig_mode(self, index, enabled):
        """Switch GPU ``index`` into (or out of) MIG mode; the
        ``(current, pending)`` mode after it.

        ``nvmlDeviceSetMigMode`` "may unbind or reset the device to
        activate the requested mode"; where the reset cannot be done it
        reports NVML_ERROR_RESET_REQUIRED as the activation status and the
        mode stays pending (current != pending) until the GPU is reset or
        the host rebooted. The caller checks the mode returned. NVML's
        refusal (the GPU is in use, no MIG support) raises AgentError
        (InUse for NVML_ERROR_IN_USE) and changes nothing.
        """
        lib = self.lib
        dev = self._handle(index)
        mode = lib.NVML_DEVICE_MIG_ENABLE if enabled else \
            lib.NVML_DEVICE_MIG_DISABLE
        try:
            status = lib.nvmlDeviceSetMigMode(dev, mode)
        except lib.NVMLError_InUse as e:
            raise errors.InUse('GPU %d: NVML refuses to change its MIG mode '
                               'while it is in use (%s)' % (index, e)) from e
        except lib.NVMLError as e:
            raise errors.AgentError('GPU %d: cannot %s MIG mode: %s' % (
                index, 'enable' if enabled else 'disable', e)) from e
        if status not in (None, lib.NVML_SUCCESS):
            LOG.warning('GPU %d: MIG mode %s, activation status %s%s',
                        index, 'enabled' if enabled else 'disabled',
                        status, ' (a GPU reset is required)'
                        if status == lib.NVML_ERROR_RESET_REQUIRED else '')
        now = self.mig_mode(index)
        if now is None:
            raise errors.AgentError('GPU %d: MIG mode cannot be read back '
                                    'after setting it' % index)
        return now

    def mig_instances_of(self, index):
        try:
            return self.mig_instances(self._handle(index))
        except self.lib.NVMLError as e:
            raise errors.Unavailable('GPU %d: cannot list its MIG '
                                     'instances: %s' % (index, e)) from e

    def mig_in_use(self, index):
        """GPU instance ids of GPU ``index`` that a vGPU runs on.

        None when NVML cannot tell (no vGPU support in the driver, an
        error): the caller must then treat every instance as in use.
        """
        lib = self.lib
        dev = self._handle(index)
        try:
            vgpus = lib.nvmlDeviceGetActiveVgpus(dev)
            return {int(lib.nvmlVgpuInstanceGetGpuInstanceId(v))
                    for v in vgpus}
        except (lib.NVMLError, AttributeError) as e:
            LOG.debug('GPU %d: cannot list the vGPUs on MIG instances: %s',
                      index, e)
            return None

    def mig_vgpu_mdevs(self, index):
        """``{GPU instance id: mdev UUID}`` of the vGPUs running on GPU
        ``index``'s MIG instances (``nvmlDeviceGetActiveVgpus``,
        ``nvmlVgpuInstanceGetGpuInstanceId``,
        ``nvmlVgpuInstanceGetMdevUUID``); None when NVML cannot tell.
        """
        lib = self.lib
        try:
            dev = self._handle(index)
            result = {}
            for v in lib.nvmlDeviceGetActiveVgpus(dev):
                uuid = _text(lib.nvmlVgpuInstanceGetMdevUUID(v))
                if uuid:
                    result[int(lib.nvmlVgpuInstanceGetGpuInstanceId(v))] = (
                        uuid)
            return result
        except (lib.NVMLError, AttributeError, errors.AgentError) as e:
            LOG.debug('GPU %d: cannot map the vGPUs on MIG instances to '
                      'their mdevs: %s', index, e)
            return None

    def mig_instances(self, dev):
        """The GPU instances on ``dev``, by start slice.

        A profile the GPU does not offer has none; NVML failing to list
        the instances of one it offers raises: a list missing instances
        would show their slices free.
        """
        lib = self.lib
        found = []
        absent = (lib.NVMLError_NotSupported, lib.NVMLError_InvalidArgument)
        for profile in range(lib.NVML_GPU_INSTANCE_PROFILE_COUNT):
            # A profile this GPU or driver does not know: whatever NVML
            # answers (but a lost GPU), it has no instances.
            info = self._refinement(lib.nvmlDeviceGetGpuInstanceProfileInfo,
                                    dev, profile)
            if info is None:
                continue
            handles = (lib.c_nvmlGpuInstance_t * MAX_GPU_INSTANCES)()
            count = ctypes.c_uint(0)
            try:
                lib.nvmlDeviceGetGpuInstances(dev, info.id, handles,
                                              ctypes.byref(count))
            except absent:
                continue
            for i in range(count.value):
                gi = lib.nvmlGpuInstanceGetInfo(handles[i])
                found.append(MigInstance(
                    gi_id=gi.id, profile_id=gi.profileId,
                    start=gi.placement.start, size=gi.placement.size,
                    compute_slices=info.sliceCount,
                    memory_mib=info.memorySizeMB))
        return sorted(found, key=lambda m: m.start)

    def create_mig(self, index, profile, start, on_gpu_instance=None):
        """Create a GPU instance of catalog ``profile`` at ``start`` plus one
        compute instance spanning it; return the GPU instance id.

        If the compute instance cannot be made the GPU instance is
        destroyed again, so no half-made device is left.
        ``on_gpu_instance(gi_id)`` is called between the two steps (the
        device manager journals the id).
        """
        lib = self.lib
        dev = self._handle(index)
        media = profile.name.endswith('+me')
        profile_id = _mig_profile_id(lib, profile.compute_slices,
                                     profile.memory_slices, media)
        info = lib.nvmlDeviceGetGpuInstanceProfileInfo(dev, profile_id)
        placement = lib.c_nvmlGpuInstancePlacement_t(
            start, profile.memory_slices)
        try:
            gi = lib.nvmlDeviceCreateGpuInstanceWithPlacement(
                dev, info.id, placement)
        except lib.NVMLError_InsufficientResources as e:
            raise errors.NoCapacity(
                'GPU %d: no room for MIG %s at slice %d (%s)'
                % (index, profile.name, start, e)) from e
        except lib.NVMLError as e:
            raise errors.AgentError('GPU %d: cannot create MIG %s at slice '
                                    '%d: %s' % (index, profile.name, start,
                                                e)) from e
        if on_gpu_instance is not None:
            on_gpu_instance(lib.nvmlGpuInstanceGetInfo(gi).id)
        try:
            ci_profile = getattr(lib, 'NVML_COMPUTE_INSTANCE_PROFILE_%d_SLICE'
                                 % profile.compute_slices)
            ci_info = lib.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                gi, ci_profile,
                lib.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
            lib.nvmlGpuInstanceCreateComputeInstance(gi, ci_info.id)
        except (lib.NVMLError, AttributeError) as e:
            lib.nvmlGpuInstanceDestroy(gi)
            raise errors.AgentError(
                'GPU %d: MIG %s created but its compute instance failed (%s);'
                ' the GPU instance was destroyed again'
                % (index, profile.name, e)) from e
        return lib.nvmlGpuInstanceGetInfo(gi).id

    def destroy_mig(self, index, gi_id):
        lib = self.lib
        dev = self._handle(index)
        try:
            gi = lib.nvmlDeviceGetGpuInstanceById(dev, gi_id)
        except lib.NVMLError as e:
            raise errors.NotFound('GPU %d has no MIG GPU instance %d (%s)'
                                  % (index, gi_id, e)) from e
        cis = (lib.c_nvmlComputeInstance_t * MAX_GPU_INSTANCES)()
        count = ctypes.c_uint(0)
        for ci_profile in range(lib.NVML_COMPUTE_INSTANCE_PROFILE_COUNT):
            try:
                info = lib.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                    gi, ci_profile,
                    lib.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
                lib.nvmlGpuInstanceGetComputeInstances(
                    gi, info.id, cis, ctypes.byref(count))
            except lib.NVMLError:
                continue
            for i in range(count.value):
                lib.nvmlComputeInstanceDestroy(cis[i])
        lib.nvmlGpuInstanceDestroy(gi)
