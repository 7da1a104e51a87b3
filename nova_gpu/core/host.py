"""Hosts, their GPUs and topology, and the allocation state of each GPU.

A GPU serves one kind of tenancy at a time: whole-GPU passthrough,
time-sliced vGPUs, MIG instances (only while MIG mode is on) or fractional
shares (container-style GPU sharing, used by the trace simulator). Capacity
is accounted in thousandths of a GPU ("milli") so that every kind can be
compared and fragmentation measured on one scale.
"""

import dataclasses
import functools
import typing

from nova_gpu.core import exceptions
from nova_gpu.core import mixed_size as mixed_mod

MILLI = 1000

WHOLE = 'whole'
SHARE = 'share'
VGPU = 'vgpu'
MIG = 'mig'
KINDS = (WHOLE, SHARE, VGPU, MIG)


class Slot(typing.NamedTuple):
    """One unit of an assignment: what is taken on which GPU.

    ``detail`` is the milli share (SHARE), the vGPU profile name (VGPU), or
    ``(mig_profile, start_slice, vgpu_profile_or_None)`` (MIG).
    """

    gpu: int
    kind: str
    detail: object = None


@functools.lru_cache(maxsize=4096)
def _peers(peers):
    """One frozenset per distinct NVLink peer set (GPUs share them: 10,000
    hosts of one server type have 8 distinct sets between them).
    """
    return peers


@functools.lru_cache(maxsize=4096)
def _backing(profiles):
    """One frozenset per distinct set of MIG profiles under enabled
    vGPU types (as ``_peers``: hosts of one server type share them).
    """
    return profiles


def _mig_backing(model, vgpu_types):
    """MIG profiles under the MIG-backed types of ``vgpu_types``, or None
    when the GPU lists no enabled types (any type of the model).
    """
    if not vgpu_types:
        return None
    profiles = model.vgpu_profiles
    return _backing(frozenset(
        profiles[name].mig_profile for name in vgpu_types
        if name in profiles and profiles[name].mig_backed))


class Gpu:
    """A physical GPU: identity, topology and allocation state."""

    __slots__ = ('index', 'model', 'address', 'numa_node', 'pcie_switch',
                 'nvlink_peers', 'mig_enabled', 'vgpu_types',
                 'whole', 'share_milli', 'vgpus', 'vgpu_fb_mib',
                 'mig_mask', 'mig_compute', 'mig_instances', 'mig_backing',
                 'quarantine', 'mixed_size')

    def __init__(self, index, model, address='', numa_node=0,
                 pcie_switch=None, nvlink_peers=(), mig_enabled=False,
                 vgpu_types=None, mixed_size=False):
        if mig_enabled and not model.mig_capable:
            raise exceptions.InvalidRequest(
                'GPU %d: %s does not support MIG' % (index, model.name))
        if mixed_size and (mig_enabled or not mixed_mod.supported(model)):
            raise exceptions.InvalidRequest(
                'GPU %d: %s has no mixed-size vGPU mode%s'
                % (index, model.name, ' with MIG on' if mig_enabled else ''))
        self.index = index
        self.model = model
        self.address = address
        self.numa_node = numa_node
        self.pcie_switch = pcie_switch
        self.nvlink_peers = _peers(frozenset(nvlink_peers))
        self.mig_enabled = mig_enabled
        # vGPU types the operator enabled on this GPU (None: any in catalog)
        self.vgpu_types = tuple(vgpu_types) if vgpu_types else None
        # MIG profiles a guest may be given here (``serves_mig``), derived
        # from ``vgpu_types`` once: the fit checks ask it for every GPU.
        self.mig_backing = _mig_backing(model, self.vgpu_types)
        self.whole = False
        self.share_milli = 0
        self.vgpus = {}
        self.vgpu_fb_mib = 0
        self.mig_mask = 0
        self.mig_compute = 0
        self.mig_instances = {}
        # Why the GPU takes no new guest (core.health), or None.
        self.quarantine = None
        # NVIDIA's mixed-size time-sliced mode (core.mixed_size): vGPUs of
        # several types share the GPU by placement slots.
        self.mixed_size = bool(mixed_size)

    # -- capacity ---------------------------------------------------------

    @property
    def used_milli(self):
        if self.whole:
            return MILLI
        if self.share_milli:
            return self.share_milli
        if self.vgpus:
            if self.mixed_size:
                return -(-mixed_mod.used_slots(self.model, self.vgpu_counts())
                         * MILLI // mixed_mod.grid(self.model))
            if self.model.time_sliced_mixing:
                return -(-self.vgpu_fb_mib * MILLI
                         // self.model.framebuffer_mib)
            name, count = next(iter(self.vgpus.items()))
            return -(-count * MILLI
                     // self.model.vgpu_profiles[name].max_instances)
        if self.mig_mask:
            slices = self.model.mig.memory_slices
            return bin(self.mig_mask).count('1') * MILLI // slices
        return 0

    @property
    def free_milli(self):
        return MILLI - self.used_milli

    @property
    def is_free(self):
        return not (self.whole or self.share_milli or self.vgpus
                    or self.mig_mask)

    def fit_key(self):
        """Everything that decides what fits on this GPU, hashable.

        Two GPUs with equal keys accept exactly the same devices; the
        engine memoises per-GPU fragmentation on it.
        """
        return (self.model.name, self.mig_enabled, self.vgpu_types,
                self.mixed_size, self.quarantine is not None, self.whole,
                self.share_milli,
                tuple(self.vgpus.items()) if self.vgpus else (),
                self.mig_mask, self.mig_compute)

    def snapshot(self):
        """Hashable allocation state, for tests and caches."""
        return (self.whole, self.share_milli,
                tuple(sorted(self.vgpus.items())), self.mig_mask,
                tuple(sorted(self.mig_instances.items())))

    def copy(self):
        """An independent copy (same identity, own allocation state)."""
        gpu = Gpu.__new__(Gpu)
        for attr in Gpu.__slots__:
            setattr(gpu, attr, getattr(self, attr))
        gpu.vgpus = dict(self.vgpus)
        gpu.mig_instances = dict(self.mig_instances)
        return gpu

    def identity(self):
        """Hashable: everything but the allocation state (``snapshot``)."""
        return (self.index, self.model.name, self.address, self.numa_node,
                self.pcie_switch, self.nvlink_peers, self.mig_enabled,
                self.vgpu_types, self.quarantine, self.mixed_size)

    # -- what fits --------------------------------------------------------

    def serves_model(self, allowed):
        """This GPU is one of the ``allowed`` models (None: any), by name
        or alias. The one model rule of every fit check.
        """
        model = self.model
        return (allowed is None or model.name in allowed
                or any(a in allowed for a in model.aliases))

    def fits_share(self, milli):
        return (not self.mig_enabled and not self.whole and not self.vgpus
                and self.share_milli + milli <= MILLI)

    def fits_whole(self):
        return not self.mig_enabled and self.is_free

    def vgpu_enabled(self, profile):
        """``profile`` is a vGPU type of this GPU that the operator enabled.

        The one rule for time-sliced and MIG-backed types alike: the
        model must have the type and, where the GPU lists its enabled
        types (``vgpu_types``), the type must be one of them. A GPU set up
        for A100-2-10C does not serve A100-3-20C even though both are
        MIG-backed and a 3g.20gb instance would fit.
        """
        return (profile.name in self.model.vgpu_profiles
                and (not self.vgpu_types or profile.name in self.vgpu_types))

    def fits_vgpu(self, profile):
        """At least one vGPU of ``profile`` (either kind) fits here."""
        if profile.mig_backed:
            backing = self._vgpu_backing(profile)
            return backing is not None and self.fits_mig(backing)
        return self.vgpu_room(profile) > 0

    def vgpu_mig_starts(self, profile):
        """Free start slices for the GPU instance of a MIG-backed vGPU."""
        backing = self._vgpu_backing(profile)
        return () if backing is None else self.mig_starts(backing)

    def _vgpu_backing(self, profile):
        """MIG profile under an enabled MIG-backed ``profile``, or None."""
        if not (profile.mig_backed and self.vgpu_enabled(profile)
                and self.model.mig):
            return None
        return self.model.mig.profiles.get(profile.mig_profile)

    def vgpu_room(self, profile):
        """How many more vGPUs of ``profile`` (time-sliced) fit here."""
        if (self.mig_enabled or self.whole or self.share_milli
                or profile.mig_backed or not self.vgpu_enabled(profile)):
            return 0
        if self.mixed_size:
            return mixed_mod.room(self.model, self.vgpu_counts(), profile)
        if self.model.time_sliced_mixing:
            by_fb = ((self.model.framebuffer_mib - self.vgpu_fb_mib)
                     // profile.framebuffer_mib)
            return min(by_fb,
                       profile.max_instances - self.vgpus.get(profile.name,
                                                              0))
        if self.vgpus and profile.name not in self.vgpus:
            return 0
        return profile.max_instances - self.vgpus.get(profile.name, 0)

    def vgpu_counts(self):
        """The vGPUs held, as sorted ``(type, count)`` pairs."""
        return tuple(sorted(self.vgpus.items()))

    def serves_mig(self, mig_profile):
        """A guest asking a MIG instance of ``mig_profile`` may get one here.

        The one rule for bare MIG asks (``gpu:mig``, ``gpu:kind=mig``), as
        ``vgpu_enabled`` is for vGPU types: MIG mode must be on and, where
        the GPU lists its enabled types (``vgpu_types``), one of them must
        be MIG-backed by ``mig_profile``. A guest reaches a GPU instance
        only through the vGPU type of the VF Nova hands it, so a GPU set
        up for A100-2-10C would give a 3g.20gb ask a 2g.10gb-backed vGPU.
        """
        backing = self.mig_backing
        return self.mig_enabled and (backing is None
                                     or mig_profile.name in backing)

    def mig_offers(self, mig_profile):
        """Free start slices a guest's ``mig_profile`` ask may take here:
        ``mig_starts`` where ``serves_mig``.
        """
        if not self.serves_mig(mig_profile):
            return ()
        return self.mig_starts(mig_profile)

    def mig_starts(self, mig_profile):
        """Free start slices for ``mig_profile`` on this GPU.

        What the GPU could make now, whatever vGPU types are enabled (the
        agent's MIG commands, the layout planner, and ``take``, which
        accounts the GPU instances a report lists); what a guest may be
        given is ``mig_offers``.
        """
        if not self.mig_enabled:
            return ()
        spec = self.model.mig
        if (mig_profile.name not in spec.profiles
                or self.mig_compute + mig_profile.compute_slices
                > spec.compute_slices):
            return ()
        used = self.mig_mask
        return tuple(s for s, mask in mig_profile.placements
                     if not used & mask)

    def fits_mig(self, mig_profile):
        """At least one instance of ``mig_profile`` fits and a guest may
        be given it (``serves_mig``; no tuple built).
        """
        if (not self.serves_mig(mig_profile) or self.mig_compute
                + mig_profile.compute_slices > self.model.mig.compute_slices):
            return False
        used = self.mig_mask
        for _start, mask in mig_profile.placements:
            if not used & mask:
                return True
        return False

    # -- state changes ----------------------------------------------------

    def take(self, slot):
        if slot.kind == WHOLE:
            if not self.fits_whole():
                raise exceptions.AllocationError(
                    'GPU %d is not free for passthrough' % self.index)
            self.whole = True
        elif slot.kind == SHARE:
            if slot.detail <= 0 or not self.fits_share(slot.detail):
                raise exceptions.AllocationError(
                    'GPU %d cannot take a %r milli share (used %d)'
                    % (self.index, slot.detail, self.used_milli))
            self.share_milli += slot.detail
        elif slot.kind == VGPU:
            profile = self.model.vgpu_profile(slot.detail)
            if profile.mig_backed or self.vgpu_room(profile) < 1:
                raise exceptions.AllocationError(
                    'GPU %d has no room for vGPU %s'
                    % (self.index, slot.detail))
            self.vgpus[profile.name] = self.vgpus.get(profile.name, 0) + 1
            self.vgpu_fb_mib += profile.framebuffer_mib
        elif slot.kind == MIG:
            name, start, vgpu = slot.detail
            profile = self.model.mig_profile(name)
            if vgpu is not None:
                self._check_mig_vgpu(vgpu, name)
            if start not in self.mig_starts(profile):
                raise exceptions.AllocationError(
                    'GPU %d: MIG %s cannot start at slice %r'
                    % (self.index, name, start))
            self.mig_mask |= profile.mask(start)
            self.mig_compute += profile.compute_slices
            self.mig_instances[start] = slot.detail
        else:
            raise exceptions.AllocationError('unknown slot kind %r'
                                             % slot.kind)

    def _check_mig_vgpu(self, vgpu, mig_name):
        """A MIG slot's vGPU type is enabled here and backed by its MIG."""
        profile = self.model.vgpu_profile(vgpu)
        if profile.mig_profile != mig_name:
            raise exceptions.AllocationError(
                'GPU %d: vGPU %s is not backed by MIG %s'
                % (self.index, vgpu, mig_name))
        if not self.vgpu_enabled(profile):
            raise exceptions.AllocationError(
                'GPU %d: vGPU type %s is not enabled (enabled: %s)'
                % (self.index, vgpu, ', '.join(self.vgpu_types)))

    def give_back(self, slot):
        if slot.kind == WHOLE:
            if not self.whole:
                raise exceptions.AllocationError(
                    'GPU %d is not assigned whole' % self.index)
            self.whole = False
        elif slot.kind == SHARE:
            if not 0 < slot.detail <= self.share_milli:
                raise exceptions.AllocationError(
                    'GPU %d holds no %r milli share' % (self.index,
                                                        slot.detail))
            self.share_milli -= slot.detail
        elif slot.kind == VGPU:
            count = self.vgpus.get(slot.detail, 0)
            if not count:
                raise exceptions.AllocationError(
                    'GPU %d holds no vGPU %s' % (self.index, slot.detail))
            if count == 1:
                del self.vgpus[slot.detail]
            else:
                self.vgpus[slot.detail] = count - 1
            self.vgpu_fb_mib -= self.model.vgpu_profiles[
                slot.detail].framebuffer_mib
        elif slot.kind == MIG:
            name, start, _vgpu = slot.detail
            if self.mig_instances.get(start) != slot.detail:
                raise exceptions.AllocationError(
                    'GPU %d holds no MIG %s at slice %r'
                    % (self.index, name, start))
            profile = self.model.mig_profile(name)
            del self.mig_instances[start]
            self.mig_mask &= ~profile.mask(start)
            self.mig_compute -= profile.compute_slices
        else:
            raise exceptions.AllocationError('unknown slot kind %r'
                                             % slot.kind)


@dataclasses.dataclass
class NumaCell:
    """CPU and memory of one NUMA node; used for GPU/CPU affinity."""

    id: int
    cpu_milli: int
    memory_mib: int
    cpu_used: int = 0
    memory_used: int = 0

    def fits(self, cpu_milli, memory_mib):
        return (self.cpu_used + cpu_milli <= self.cpu_milli
                and self.memory_used + memory_mib <= self.memory_mib)


class Assignment(typing.NamedTuple):
    """A decision: the slots taken on one host, and the NUMA cell charged.

    Not to be confused with OpenStack Placement (the service), which this
    project only talks to through its resource providers.
    """

    host: str
    slots: tuple
    numa_node: typing.Optional[int] = None
    cpu_milli: int = 0
    memory_mib: int = 0

    @property
    def gpus(self):
        return tuple(sorted({s.gpu for s in self.slots}))


class Host:
    """A compute host: GPUs, CPU and memory, with allocation state."""

    def __init__(self, name, gpus, cpu_milli=0, memory_mib=0, cells=None,
                 partitions=None, pcie=None):
        self.name = name
        self.gpus = list(gpus)
        for i, gpu in enumerate(self.gpus):
            if gpu.index != i:
                raise exceptions.InvalidRequest(
                    '%s: GPU indices must be 0..%d in order'
                    % (name, len(self.gpus) - 1))
        self.cpu_milli = cpu_milli
        self.memory_mib = memory_mib
        self.cpu_used = 0
        self.memory_used = 0
        self.cells = {c.id: c for c in (cells or ())}
        # NVSwitch partitions (a core.partitions.PartitionTable) of a host
        # in Shared NVSwitch mode; None where whole GPUs go in any set.
        self.partitions = partitions
        # The PCIe tree with the RDMA NICs (a core.rdma.PcieTree), or None
        # where the agent reports none (no gpu:rdma request fits).
        self.pcie = pcie

    @property
    def cpu_free(self):
        return self.cpu_milli - self.cpu_used

    @property
    def memory_free(self):
        return self.memory_mib - self.memory_used

    def snapshot(self):
        return (self.cpu_used, self.memory_used,
                tuple((c.cpu_used, c.memory_used)
                      for _, c in sorted(self.cells.items())),
                tuple(g.snapshot() for g in self.gpus))

    def content(self):
        """Hashable: everything about this host but its name. Two hosts
        with equal content are interchangeable (they may share one Host).
        """
        return (self.cpu_milli, self.memory_mib,
                tuple((c.id, c.cpu_milli, c.memory_mib)
                      for _, c in sorted(self.cells.items())),
                tuple(g.identity() for g in self.gpus), self.snapshot(),
                self.partitions, self.pcie)

    def copy(self, name=None):
        """An independent copy, named ``name`` (default: the same)."""
        host = Host(name or self.name, [g.copy() for g in self.gpus],
                    self.cpu_milli, self.memory_mib,
                    [dataclasses.replace(c) for c in self.cells.values()],
                    self.partitions, self.pcie)
        host.cpu_used = self.cpu_used
        host.memory_used = self.memory_used
        return host

    def allocate(self, assignment):
        """Apply ``assignment``; all or nothing."""
        if assignment.host != self.name:
            raise exceptions.AllocationError(
                'assignment for %s applied to %s' % (assignment.host,
                                                     self.name))
        if (self.cpu_used + assignment.cpu_milli > self.cpu_milli
                or self.memory_used + assignment.memory_mib
                > self.memory_mib):
            raise exceptions.AllocationError(
                '%s: not enough CPU or memory' % self.name)
        cell = self._cell(assignment)
        if cell and not cell.fits(assignment.cpu_milli, assignment.memory_mib):
            raise exceptions.AllocationError(
                '%s: NUMA node %d cannot hold the CPU and memory'
                % (self.name, cell.id))
        done = []
        try:
            for slot in assignment.slots:
                self._gpu(slot).take(slot)
                done.append(slot)
        except exceptions.GpuError:
            for slot in reversed(done):
                self.gpus[slot.gpu].give_back(slot)
            raise
        self.cpu_used += assignment.cpu_milli
        self.memory_used += assignment.memory_mib
        if cell:
            cell.cpu_used += assignment.cpu_milli
            cell.memory_used += assignment.memory_mib

    def free(self, assignment):
        """Undo ``allocate(assignment)`` exactly; all or nothing."""
        if assignment.host != self.name:
            raise exceptions.AllocationError(
                'assignment for %s freed on %s' % (assignment.host, self.name))
        if (assignment.cpu_milli > self.cpu_used
                or assignment.memory_mib > self.memory_used):
            raise exceptions.AllocationError(
                '%s: freeing more CPU or memory than is used' % self.name)
        cell = self._cell(assignment)
        done = []
        try:
            for slot in reversed(assignment.slots):
                self._gpu(slot).give_back(slot)
                done.append(slot)
        except exceptions.GpuError:
            for slot in reversed(done):
                self.gpus[slot.gpu].take(slot)
            raise
        self.cpu_used -= assignment.cpu_milli
        self.memory_used -= assignment.memory_mib
        if cell:
            cell.cpu_used -= assignment.cpu_milli
            cell.memory_used -= assignment.memory_mib

    def _gpu(self, slot):
        if not 0 <= slot.gpu < len(self.gpus):
            raise exceptions.AllocationError(
                '%s has no GPU %r' % (self.name, slot.gpu))
        return self.gpus[slot.gpu]

    def _cell(self, assignment):
        if assignment.numa_node is None:
            return None
        try:
            return self.cells[assignment.numa_node]
        except KeyError:
            raise exceptions.AllocationError(
                '%s has no NUMA node %r'
                % (self.name, assignment.numa_node)) from None
