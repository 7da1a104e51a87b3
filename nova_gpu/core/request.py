"""What a guest asks for: a GPU request, independent of how it was spelt."""

import dataclasses

from nova_gpu.core import exceptions
from nova_gpu.core import host as host_mod
from nova_gpu.core import rdma as rdma_mod

TOPOLOGIES = ('any', 'numa', 'nvlink')
NUMA_AFFINITY = ('none', 'prefer', 'require')


@dataclasses.dataclass(frozen=True)
class GpuRequest:
    """A request for GPU devices plus the CPU and memory that go with them.

    ``kind`` is one of ``host.KINDS``. ``profile`` names the vGPU profile
    (VGPU; None means whatever vGPU type the GPU is set up for) or the MIG
    profile (MIG). ``milli`` is the share of one GPU for SHARE. ``count`` is
    the number of devices. ``models`` restricts the GPU models allowed.
    ``topology`` asks that all devices sit on one NUMA node ('numa') or
    form an NVLink-connected set ('nvlink'). ``numa_affinity`` asks that
    the GPUs' NUMA node can also hold ``cpu_milli`` and ``memory_mib``.
    """

    kind: str
    profile: str = None
    count: int = 1
    milli: int = 0
    cpu_milli: int = 0
    memory_mib: int = 0
    models: frozenset = None
    topology: str = 'any'
    numa_affinity: str = 'none'
    rdma: str = None

    def __post_init__(self):
        if self.kind not in host_mod.KINDS:
            raise exceptions.InvalidRequest(
                'unknown request kind %r (allowed: %s)'
                % (self.kind, ', '.join(host_mod.KINDS)))
        if not isinstance(self.count, int) or self.count < 1:
            raise exceptions.InvalidRequest(
                'count must be a positive integer, got %r' % (self.count,))
        if self.kind == host_mod.SHARE:
            if not 0 < self.milli <= host_mod.MILLI:
                raise exceptions.InvalidRequest(
                    'a GPU share must be 1..1000 milli, got %r'
                    % (self.milli,))
        elif self.milli:
            raise exceptions.InvalidRequest(
                'milli is only meaningful for share requests')
        if self.kind == host_mod.MIG and not self.profile:
            raise exceptions.InvalidRequest('a MIG request needs a profile')
        if self.kind in (host_mod.WHOLE, host_mod.SHARE) and self.profile:
            raise exceptions.InvalidRequest(
                'a %s request takes no profile' % self.kind)
        if self.topology not in TOPOLOGIES:
            raise exceptions.InvalidRequest(
                'unknown topology %r (allowed: %s)'
                % (self.topology, ', '.join(TOPOLOGIES)))
        if self.numa_affinity not in NUMA_AFFINITY:
            raise exceptions.InvalidRequest(
                'unknown NUMA affinity %r (allowed: %s)'
                % (self.numa_affinity, ', '.join(NUMA_AFFINITY)))
        if self.rdma is not None and self.rdma not in rdma_mod.SCOPES:
            raise exceptions.InvalidRequest(
                'unknown RDMA locality %r (allowed: %s)'
                % (self.rdma, ', '.join(rdma_mod.SCOPES)))
        if self.cpu_milli < 0 or self.memory_mib < 0:
            raise exceptions.InvalidRequest(
                'CPU and memory must not be negative')
        if self.models is not None:
            object.__setattr__(self, 'models', frozenset(self.models))
            if not self.models:
                raise exceptions.InvalidRequest('an empty model list '
                                                'admits no GPU')

    @property
    def gpu_milli(self):
        """Total GPU capacity asked, in milli (for demand accounting)."""
        if self.kind == host_mod.SHARE:
            return self.milli * self.count
        if self.kind == host_mod.WHOLE:
            return host_mod.MILLI * self.count
        return 0

    def key(self):
        return dataclasses.astuple(self)
