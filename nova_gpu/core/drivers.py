"""NVIDIA driver compatibility between a vGPU host and a guest.

A vGPU guest runs NVIDIA's guest driver of some release branch (R535,
R550, ...); the host runs the NVIDIA vGPU manager of some branch. The
release notes' "Compatibility Requirements for the NVIDIA vGPU Manager and
Guest VM Driver" > "Compatible NVIDIA vGPU Manager and Guest VM Driver
Releases" list what NVIDIA supports (vGPU 15 for Linux with KVM lists the
first two; the vGPU 19 release notes, VMware vSphere and XenServer
editions, list all three):

* "NVIDIA vGPU Manager with guest VM drivers from the same release" (and,
  vGPU 15, "from different releases within the same major release
  branch");
* "NVIDIA vGPU Manager from a later major release branch with guest VM
  drivers from the previous branch";
* "NVIDIA vGPU Manager from a later long-term support branch with guest
  VM drivers from the previous long-term support branch".

A guest driver newer than the manager is never supported. Live migration
also needs the two managers' vGPU version ranges (``nvmlGetVgpuVersion``)
to overlap.

The one rule serves the scheduler filter (``GpuDriverFilter``), the move
planner (``compatibility_rule`` for its ``compatible`` hook) and a live
migration pre-check (``migration_problem``). Hosts that report nothing
about their driver, and guests that name no branch, are compatible:
the rule only refuses what it knows to be wrong.
"""

import dataclasses
import re

from nova_gpu.core import exceptions

# Image property naming the guest's driver branch, e.g. "R550" or "550".
IMAGE_PROPERTY = 'nvidia_guest_driver_branch'

# Main branches of NVIDIA vGPU software, oldest first (vGPU 13 = R470,
# 14 = R510, 15 = R525, 16 = R535, 17 = R550, 18 = R570, 19 = R580,
# 20 = R595). Only the order matters: the previous main branch of R550 is
# R535, that of R595 is R580. A branch not listed has no known
# predecessor: only its own guests are supported (add a newer branch here
# when NVIDIA ships it, or its hosts refuse the previous branch's guests).
# Checked: 15 = R525 (15.0 is 525.60.12), 16 = R535 (long-term support)
# and 17 = R550 (production) in NVIDIA's vGPU release notes and lifecycle
# table, 19 = R580 (19.0 is 580.65.05); 20 = R595 from NVIDIA's vGPU
# branch table (docs.nvidia.com/vgpu, "vGPU Software Release" / "Driver
# Branch"), with R595 a production branch in NVIDIA's data-center driver
# table ("Supported Drivers and CUDA Toolkit Versions") and vGPU 20.x
# documents published (Management SDK User Guide, "v20.0 through 20.1");
# 13, 14 and 18 from NVIDIA's driver numbering only.
MAIN_BRANCHES = ('R470', 'R510', 'R525', 'R535', 'R550', 'R570', 'R580',
                 'R595')
# The long-term support branches among them, oldest first: NVIDIA's vGPU
# branch table ("vGPU Branch Type") lists vGPU 13 (R470), vGPU 16 (R535)
# and vGPU 19 (R580) as Long-Term Support, and the data-center driver
# table lists R535 and R580 as long-term support branches. So an R535
# manager takes R470 guests and an R580 manager R535 guests (third rule).
LONG_TERM_BRANCHES = ('R470', 'R535', 'R580')

_BRANCH = re.compile(r'[Rr]?([0-9]{3,4})')
_VERSION = re.compile(r'([0-9]{3,4})(\.[0-9]{1,4}){1,3}')
MAX_VGPU_VERSION = 2 ** 32 - 1  # an unsigned int in NVML


def parse_branch(value):
    """'R550', 'r550' or '550' -> 'R550'; anything else is refused."""
    if not isinstance(value, str) or not _BRANCH.fullmatch(value.strip()):
        raise exceptions.InvalidRequest(
            'NVIDIA driver branch must look like R550 or 550, got %r'
            % (value,))
    return 'R%s' % _BRANCH.fullmatch(value.strip()).group(1)


def branch_of(driver_version):
    """'550.54.14' (``nvmlSystemGetDriverVersion``) -> 'R550'."""
    if (not isinstance(driver_version, str)
            or not _VERSION.fullmatch(driver_version.strip())):
        raise exceptions.InvalidRequest(
            'NVIDIA driver version must look like 550.54.14, got %r'
            % (driver_version,))
    return 'R%s' % driver_version.strip().split('.')[0]


def guest_branches(host_branch):
    """Guest driver branches a vGPU manager of ``host_branch`` supports,
    oldest first: its own, the previous main branch's and, for a
    long-term support branch, the previous long-term support branch's.
    """
    host_branch = parse_branch(host_branch)
    found = {host_branch}
    for branches in (MAIN_BRANCHES, LONG_TERM_BRANCHES):
        if host_branch in branches:
            i = branches.index(host_branch)
            if i:
                found.add(branches[i - 1])
    return tuple(sorted(found, key=lambda b: int(b[1:])))


@dataclasses.dataclass(frozen=True)
class DriverInfo:
    """What a host's agent reports about its NVIDIA driver."""

    driver_version: str
    guest_branches: tuple
    vgpu_versions: tuple = None  # (min, max) of nvmlGetVgpuVersion

    @property
    def branch(self):
        return branch_of(self.driver_version)

    @classmethod
    def build(cls, driver_version, guest=None, vgpu_versions=None):
        """Validated; ``guest`` defaults to ``guest_branches(branch)``."""
        branch = branch_of(driver_version)
        guest = (guest_branches(branch) if guest is None
                 else tuple(sorted({parse_branch(b) for b in guest})))
        if not guest:
            raise exceptions.InvalidRequest(
                'a vGPU manager supports at least one guest branch')
        if vgpu_versions is not None:
            low, high = vgpu_versions
            for v in (low, high):
                if (isinstance(v, bool) or not isinstance(v, int)
                        or not 0 <= v <= MAX_VGPU_VERSION):
                    raise exceptions.InvalidRequest(
                        'vGPU versions must be integers in 0..%d, got %r'
                        % (MAX_VGPU_VERSION, v))
            if low > high:
                raise exceptions.InvalidRequest(
                    'vGPU version range %d..%d is empty' % (low, high))
            vgpu_versions = (low, high)
        return cls(driver_version.strip(), guest, vgpu_versions)


def host_problem(info, guest_branch):
    """Why a guest of ``guest_branch`` cannot run on a host, or None.

    ``info`` None (the host reports no driver) and ``guest_branch`` None
    (the image names none) are compatible.
    """
    if info is None or guest_branch is None:
        return None
    if guest_branch in info.guest_branches:
        return None
    return ('guest driver branch %s is not supported by the vGPU manager '
            '%s (supports %s)' % (guest_branch, info.driver_version,
                                  ', '.join(info.guest_branches)))


def migration_problem(source, destination, guest_branch):
    """Why a guest cannot live-migrate from ``source`` to ``destination``.

    The destination must support the guest's branch, and the managers'
    vGPU version ranges must overlap (when both are known).
    """
    problem = host_problem(destination, guest_branch)
    if problem:
        return problem
    if (source is not None and destination is not None
            and source.vgpu_versions and destination.vgpu_versions):
        (slo, shi), (dlo, dhi) = source.vgpu_versions, \
            destination.vgpu_versions
        if shi < dlo or dhi < slo:
            return ('vGPU version ranges do not overlap: %#x..%#x (%s) '
                    'and %#x..%#x (%s)' % (slo, shi, source.driver_version,
                                           dlo, dhi,
                                           destination.driver_version))
    return None


def compatibility_rule(infos):
    """``compatible(server, host_name)`` for ``moves.MovePlanner``.

    ``infos`` maps host names to ``DriverInfo`` (hosts absent: unknown,
    compatible); a server's ``driver_branch`` is its guest's branch.
    """
    def compatible(server, host_name):
        return migration_problem(infos.get(server.host),
                                 infos.get(host_name),
                                 server.driver_branch) is None
    return compatible
