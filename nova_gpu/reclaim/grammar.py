"""The flavor grammar, loaded by entry point.

The ``gpu:`` extra-spec grammar is the scheduler adapter's
(``nova_gpu.scheduler.flavor``); the reclaimer must read flavors exactly
as the scheduler does, but adapters do not import each other (the
layering rule, doc/source/architecture.rst). So the grammar is found
through the ``nova_gpu.flavor_grammar`` entry point group (setup.cfg
names ``nova_gpu.scheduler.flavor`` as ``gpu``): the same code, no import
dependency, and a test may hand in its own.

A grammar gives ``parse(extra_specs, vcpus=, memory_mb=)`` (a spec whose
``alternatives`` are GpuRequests, most preferred first, or None) and
``preemptible(extra_specs)``.
"""

from importlib import metadata

from nova_gpu.core import exceptions

GROUP = 'nova_gpu.flavor_grammar'
NAME = 'gpu'


def load(name=NAME):
    found = [ep for ep in metadata.entry_points(group=GROUP)
             if ep.name == name]
    if not found:
        raise exceptions.InvalidRequest(
            'no flavor grammar %r in entry point group %s: is nova-gpu '
            'installed (pip install nova-gpu)?' % (name, GROUP))
    return found[0].load()


def is_spot(grammar):
    """``is_spot(extra_specs)``: True only for a valid
    ``gpu:preemptible=true``; a bad value counts as on-demand (never
    evicted on a guess).
    """
    def check(extra_specs):
        try:
            return bool(grammar.preemptible(extra_specs or {}))
        except exceptions.GpuError:
            return False
    return check


def requests_of(grammar, extra_specs, vcpus=0, memory_mb=0):
    """The GpuRequests a flavor may be served with (empty: no GPU, or a
    flavor the grammar refuses).
    """
    try:
        spec = grammar.parse(extra_specs or {}, vcpus=vcpus,
                             memory_mb=memory_mb)
    except exceptions.GpuError:
        return ()
    return tuple(spec.alternatives) if spec is not None else ()
