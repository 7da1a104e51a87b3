"""Flavors as the reclaimer reads them: the core's grammar.

The ``gpu:`` extra-spec grammar is ``nova_gpu.core.flavor``, the one the
scheduler filter and the Nova API validator use, so the reclaimer reads a
flavor exactly as the scheduler does. What configuration adds is passed
in: the catalog (``[gpu] catalog_files``) and the ``[gpu_scheduler]``
names (``flavor.PathNames.from_options``), read from the reclaimer's own
configuration file, which must agree with the schedulers' on them.
"""

from nova_gpu.core import exceptions
from nova_gpu.core import flavor


def is_spot(extra_specs):
    """True only for a valid ``gpu:preemptible=true``; a bad value counts
    as on-demand (never evicted on a guess).
    """
    try:
        return bool(flavor.preemptible(extra_specs or {}))
    except exceptions.GpuError:
        return False


def requests_of(extra_specs, catalog, names, vcpus=0, memory_mb=0):
    """The GpuRequests a flavor may be served with, most preferred first
    (empty: no GPU, or a flavor the grammar refuses). ``names``: a
    ``flavor.PathNames``.
    """
    try:
        spec = flavor.parse(extra_specs or {}, catalog, vcpus, memory_mb,
                            names=names)
    except exceptions.GpuError:
        return ()
    return tuple(spec.alternatives) if spec is not None else ()
