"""Errors of the compute agent; each message names what went wrong."""

from nova_gpu.core import exceptions


class AgentError(exceptions.GpuError):
    """Base class of compute agent errors."""


class NotFound(AgentError):
    """A GPU, parent device, type or device does not exist on this host."""


class NoCapacity(AgentError):
    """The parent has no instances of the type left."""


class InUse(AgentError):
    """A device is referenced by a libvirt domain and must not change."""


class Unavailable(AgentError):
    """A host service (libvirtd, mdevctl, NVML) cannot be reached."""


class InvalidName(AgentError):
    """A name from config, a flavor or sysfs is not acceptable in XML."""


class ResetRequired(AgentError):
    """A GPU's MIG mode was changed but is pending until a GPU reset."""
