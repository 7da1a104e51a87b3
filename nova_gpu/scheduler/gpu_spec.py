"""The ``gpu:`` flavor grammar with the scheduler's configuration.

The grammar itself (the keys, their values, the paths, the requests a
flavor makes) is the core's: ``nova_gpu.core.flavor``, documented there.
This module adds what comes from ``nova.conf`` and Nova: the catalog of
``[gpu] catalog_files``, the ``[gpu_scheduler]`` names (``PathNames.
from_conf``) and ``gpu:count`` limit, and the grammar.GpuSpec of a Nova
RequestSpec, memoised for the filter. The API validator
(``extra_specs``), the filters, the view and the tools call it; the names
of the grammar are the core module's, imported from there.
"""

import functools

from oslo_config import cfg
from oslo_log import log as logging

from nova_gpu import conf  # noqa: F401  (registers [gpu], [gpu_scheduler])
from nova_gpu.core import catalog as catalog_mod
from nova_gpu.core import exceptions
from nova_gpu.core import flavor as grammar

CONF = cfg.CONF
LOG = logging.getLogger(__name__)


class PathNames(grammar.PathNames):
    """``core.flavor.PathNames``, built from ``[gpu_scheduler]``."""

    @classmethod
    def from_conf(cls, vgpu_rc=None, whole_rc=None):
        return cls.from_options(CONF.gpu_scheduler, vgpu_rc, whole_rc)


@functools.lru_cache(maxsize=8)
def _load(paths):
    return catalog_mod.load_catalog(list(paths))


def default_catalog():
    """The catalog of ``[gpu] catalog_files`` (loaded once per set)."""
    return _load(tuple(CONF.gpu.catalog_files))


def max_count():
    """The ``gpu:count`` limit: ``[gpu_scheduler] max_gpu_count``, at most
    ``grammar.MAX_COUNT``.
    """
    return grammar.max_count(CONF.gpu_scheduler.max_gpu_count)


def validate_value(key, value, catalog=None):
    """``core.flavor.validate_value`` with ``[gpu] catalog_files`` (by
    default) and the ``[gpu_scheduler]`` limit.
    """
    return grammar.validate_value(key, value, catalog or default_catalog(),
                                  PathNames.from_conf())


def placement_extra_specs(spec, vgpu_rc=None, whole_rc=None, names=None,
                          sets=True):
    """``core.flavor.placement_extra_specs``; ``names`` default to the
    ``[gpu_scheduler]`` options.
    """
    return grammar.placement_extra_specs(
        spec, names or PathNames.from_conf(vgpu_rc, whole_rc), sets=sets)


def parse(extra_specs, catalog=None, vcpus=0, memory_mb=0,
          vgpu_rc=None, whole_rc=None, names=None):
    """``core.flavor.parse`` with ``[gpu] catalog_files`` and the
    ``[gpu_scheduler]`` names by default.
    """
    return grammar.parse(extra_specs, catalog or default_catalog(), vcpus,
                         memory_mb,
                         names or PathNames.from_conf(vgpu_rc, whole_rc))


def from_request_spec(spec_obj, catalog=None):
    """grammar.GpuSpec of a Nova RequestSpec (None: no GPU asked)."""
    flavor = spec_obj.flavor
    return parse_cached(tuple(sorted((flavor.extra_specs or {}).items())),
                        flavor.vcpus, flavor.memory_mb, catalog)


@functools.lru_cache(maxsize=1024)
def _parse_cached(items, vcpus, memory_mb, catalog, names):
    try:
        spec = grammar.parse(dict(items), catalog, vcpus, memory_mb,
                             names=names)
        if spec is not None and spec.advice:
            # Once per flavor content and process: the parse is memoised.
            LOG.warning('Flavor %s: %s', _flavor_keys(items), spec.advice)
        return spec
    except exceptions.GpuError as e:
        # Flavors created before the validator was enabled can still
        # carry bad values; the filter reports them per request.
        return grammar.GpuSpec((), True, False, 0, 0, names.vgpu_rc, str(e))


def _flavor_keys(items):
    """A flavor's gpu: keys, to name it in the log (no flavor id here)."""
    return ' '.join('%s=%s' % kv for kv in items
                    if kv[0].startswith(grammar.PREFIX)) or '(no gpu: keys)'


def parse_cached(items, vcpus, memory_mb, catalog=None):
    """``parse`` memoised on the flavor's content (flavors are few)."""
    return _parse_cached(items, vcpus, memory_mb,
                         catalog or default_catalog(),
                         PathNames.from_conf())
