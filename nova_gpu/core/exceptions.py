"""Exception types raised by the GPU core.

Every error carries a message that names what is wrong, so that callers
(the Nova API validator, the scheduler log, the CLI) can show it as-is.
"""


class GpuError(Exception):
    """Base class of every error raised by nova_gpu.core."""


class CatalogError(GpuError):
    """The GPU catalog file is malformed."""

    def __init__(self, source, entry, field, problem):
        self.source = source
        self.entry = entry
        self.field = field
        self.problem = problem
        where = str(source)
        if entry:
            where += ': entry %r' % entry
        if field:
            where += ', field %r' % field
        super().__init__('%s: %s' % (where, problem))


class UnknownModel(GpuError):
    """A GPU model name is not in the catalog."""

    def __init__(self, name, known=()):
        self.name = name
        msg = 'unknown GPU model %r' % name
        if known:
            msg += ' (known models: %s)' % ', '.join(sorted(known))
        super().__init__(msg)


class UnknownProfile(GpuError):
    """A vGPU or MIG profile name is not known for the model(s) asked."""

    def __init__(self, name, kind='vGPU', known=()):
        self.name = name
        msg = 'unknown %s profile %r' % (kind, name)
        if known:
            msg += ' (allowed: %s)' % ', '.join(sorted(known))
        super().__init__(msg)


class InvalidRequest(GpuError):
    """A GPU request is self-contradictory or out of range."""


class NoFit(GpuError):
    """A request cannot be placed on a host; ``reason`` says why."""

    def __init__(self, host, reason):
        self.host = host
        self.reason = reason
        super().__init__('%s: %s' % (host, reason))


class AllocationError(GpuError):
    """Allocate or free was asked something inconsistent with the state."""
