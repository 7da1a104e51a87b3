"""Flavor extra specs in the ``gpu:`` namespace, turned into GPU requests.

This is the one place that reads the grammar; the API validator
(``extra_specs``) and the scheduler filter both call it, so a flavor the API
accepts is a flavor the scheduler understands.

Grammar (values are case-sensitive except units)::

    gpu:profile=<vGPU type>        e.g. A100-10C, H100XM-3-40C (MIG-backed)
    gpu:mig=<MIG profile>          e.g. 3g.40gb (with gpu:model to pin one)
    gpu:memory=<size>              e.g. 20GB, 20480MB: smallest device that
                                   has at least this much GPU memory
    gpu:compute=<share>            e.g. 0.25 or 25%: with gpu:memory, the
                                   device must also have this share of one
                                   GPU's compute
    gpu:kind=vgpu|mig|whole        what to serve gpu:memory with (default
                                   vgpu); whole alone asks passthrough GPUs
    gpu:count=<1..16>              devices, each on its own physical GPU
    gpu:model=<model>[,<model>..]  allowed GPU models (catalog names/aliases)
    gpu:topology=any|numa|nvlink   all devices on one NUMA node / NVLinked

GB and MB are binary here (1GB = 1024MB), as in NVIDIA's profile names
(3g.20gb has 20480 MiB). The Placement side stays Nova's own:
``placement_extra_specs`` gives the ``resources*`` keys a flavor needs
(``resources:VGPU=1``, or ``resourcesN:VGPU=1`` groups with
``group_policy=isolate`` for several devices).
"""

import dataclasses
import functools
import re

from oslo_config import cfg

from nova_gpu import conf  # noqa: F401  (registers [gpu], [gpu_scheduler])
from nova_gpu.core import catalog as catalog_mod
from nova_gpu.core import exceptions
from nova_gpu.core import host as host_mod
from nova_gpu.core import request as request_mod

CONF = cfg.CONF

PREFIX = 'gpu:'
KINDS = ('vgpu', 'mig', 'whole')
MAX_COUNT = 16
_SIZE = re.compile(r'^\s*(\d+(?:\.\d+)?)\s*(mb|mib|gb|gib|tb|tib)\s*$',
                   re.IGNORECASE)
_SHARE = re.compile(r'^\s*(\d+(?:\.\d+)?)\s*(%?)\s*$')
_RESOURCES = re.compile(r'^resources([A-Za-z0-9_-]*):(.+)$')
_UNIT_MIB = {'mb': 1, 'mib': 1, 'gb': 1024, 'gib': 1024,
             'tb': 1024 * 1024, 'tib': 1024 * 1024}


class ExtraSpecError(exceptions.InvalidRequest):
    """A ``gpu:`` extra spec is wrong; the message names key and remedy."""

    def __init__(self, key, value, problem, allowed=None):
        self.key = key
        self.value = value
        msg = '%s=%s: %s' % (key, value, problem)
        if allowed:
            msg += ' (allowed: %s)' % ', '.join(allowed)
        super().__init__(msg)


@dataclasses.dataclass(frozen=True)
class GpuSpec:
    """What a flavor asks of the GPU plugin.

    ``alternatives`` are GpuRequests that would each satisfy the flavor,
    most preferred first (one, unless the flavor asks by need).
    ``explicit`` says the flavor has ``gpu:`` keys (stock vGPU flavors do
    not). ``units`` and ``groups`` are what the flavor asks of Placement in
    ``resource_class``; ``per_model`` indexes the alternatives by GPU model
    so that a host only looks at those of the models it has.
    """

    alternatives: tuple
    explicit: bool
    need_based: bool
    units: int
    groups: int
    resource_class: str
    problem: str = None
    sizes: tuple = ()  # device memory (MiB) of each need-based alternative

    @functools.cached_property
    def per_model(self):
        index = {}
        for alt in self.alternatives:
            for model in alt.models or ('*',):
                index.setdefault(model, []).append(alt)
        return index

    @functools.cached_property
    def key(self):
        """Hashable identity of what is asked (computed once)."""
        return (tuple(a.key() for a in self.alternatives), self.units,
                self.groups)


@functools.lru_cache(maxsize=8)
def _load(paths):
    return catalog_mod.load_catalog(list(paths))


def default_catalog():
    """The catalog of ``[gpu] catalog_files`` (loaded once per set)."""
    return _load(tuple(CONF.gpu.catalog_files))


# -- one key at a time (API validation) ----------------------------------

def validate_value(key, value, catalog=None):
    """Check one ``gpu:`` extra spec; return its parsed value."""
    catalog = catalog or default_catalog()
    name = key[len(PREFIX):] if key.startswith(PREFIX) else key
    parser = _PARSERS.get(name)
    if parser is None:
        raise ExtraSpecError(key, value, 'unknown GPU extra spec',
                             [PREFIX + k for k in sorted(_PARSERS)])
    if not isinstance(value, str):
        value = str(value)
    return parser(catalog, PREFIX + name, value)


def _profile(catalog, key, value):
    try:
        return catalog.vgpu_profile(value.strip())
    except exceptions.UnknownProfile:
        raise ExtraSpecError(key, value, 'unknown vGPU profile',
                             catalog.vgpu_profile_names()) from None


def _mig(catalog, key, value):
    value = value.strip()
    if value not in catalog.mig_profile_names():
        raise ExtraSpecError(key, value, 'unknown MIG profile',
                             catalog.mig_profile_names())
    return value


def _count(catalog, key, value):
    try:
        count = int(value)
    except ValueError:
        count = 0
    if not 1 <= count <= MAX_COUNT:
        raise ExtraSpecError(key, value, 'must be an integer from 1 to %d'
                             % MAX_COUNT)
    return count


def _models(catalog, key, value):
    names = [v.strip() for v in value.split(',') if v.strip()]
    if not names:
        raise ExtraSpecError(key, value, 'names no GPU model',
                             sorted(catalog.models))
    result = []
    for name in names:
        try:
            result.append(catalog.model(name).name)
        except exceptions.UnknownModel:
            raise ExtraSpecError(key, value, 'unknown GPU model %r' % name,
                                 sorted(catalog.models)) from None
    return frozenset(result)


def _topology(catalog, key, value):
    if value not in request_mod.TOPOLOGIES:
        raise ExtraSpecError(key, value, 'unknown topology',
                             request_mod.TOPOLOGIES)
    return value


def _memory(catalog, key, value):
    match = _SIZE.match(value)
    if not match or float(match.group(1)) <= 0:
        raise ExtraSpecError(key, value, 'expected a positive size with a '
                             'unit, e.g. 20GB or 20480MB')
    return int(float(match.group(1)) * _UNIT_MIB[match.group(2).lower()])


def _compute(catalog, key, value):
    match = _SHARE.match(value)
    if match:
        share = float(match.group(1)) / (100 if match.group(2) else 1)
        if 0 < share <= 1:
            return max(1, int(round(share * host_mod.MILLI)))
    raise ExtraSpecError(key, value, 'expected a share of one GPU in (0, 1] '
                         'or (0%, 100%], e.g. 0.25 or 25%')


def _kind(catalog, key, value):
    if value not in KINDS:
        raise ExtraSpecError(key, value, 'unknown kind', KINDS)
    return value


_PARSERS = {
    'profile': _profile, 'mig': _mig, 'count': _count, 'model': _models,
    'topology': _topology, 'memory': _memory, 'compute': _compute,
    'kind': _kind,
}
KEYS = tuple(PREFIX + k for k in sorted(_PARSERS))


# -- the whole flavor (scheduler) ----------------------------------------

def placement_units(extra_specs, resource_class):
    """``(total units, number of groups)`` of ``resource_class`` asked."""
    total = groups = 0
    for key, value in extra_specs.items():
        match = _RESOURCES.match(key)
        if match and match.group(2) == resource_class:
            try:
                amount = int(value)
            except (TypeError, ValueError):
                continue
            if amount > 0:
                total += amount
                groups += 1
    return total, groups


def placement_extra_specs(spec, vgpu_rc='VGPU', whole_rc='PGPU'):
    """The ``resources*`` extra specs Nova needs for ``spec``."""
    kind = spec.alternatives[0].kind
    count = spec.alternatives[0].count
    rc = whole_rc if kind == host_mod.WHOLE else vgpu_rc
    if kind == host_mod.WHOLE or count == 1:
        return {'resources:%s' % rc: str(count)}
    result = {'resources%d:%s' % (i, rc): '1' for i in range(1, count + 1)}
    result['group_policy'] = 'isolate'
    return result


def parse(extra_specs, catalog=None, vcpus=0, memory_mb=0,
          vgpu_rc='VGPU', whole_rc='PGPU'):
    """GpuSpec of a flavor, or None when it asks for no GPU at all.

    Raises ExtraSpecError when a ``gpu:`` key is wrong or the keys
    contradict each other.
    """
    catalog = catalog or default_catalog()
    values = {}
    for key, value in extra_specs.items():
        if key.startswith(PREFIX):
            values[key[len(PREFIX):]] = validate_value(key, value, catalog)
    kind = values.get('kind')
    rc = whole_rc if kind == 'whole' else vgpu_rc
    units, groups = placement_units(extra_specs, rc)
    if not values and not units:
        return None
    affinity, cpu_milli, memory_mib = _numa(extra_specs, values, vcpus,
                                            memory_mb)
    common = dict(count=values.get('count', 1),
                  topology=values.get('topology', 'any'),
                  numa_affinity=affinity, cpu_milli=cpu_milli,
                  memory_mib=memory_mib)
    models = values.get('model')
    if not values:
        # A stock vGPU flavor: whatever type each GPU is set up for.
        if groups == 1 and units > 1:
            # Several vGPUs in one group may share a physical GPU, which a
            # GpuRequest (one device per GPU) cannot say: left to Nova.
            return None
        common['count'] = groups if groups > 1 else units
        alts = (request_mod.GpuRequest(host_mod.VGPU, **common),)
        return GpuSpec(alts, False, False, units, groups, rc, sizes=(0,))
    _exclusive(values)
    if 'profile' in values:
        alts = (_profile_request(values, models, common),)
    elif 'mig' in values:
        alts = (_mig_request(catalog, values, models, common),)
    elif 'memory' in values:
        sized = _by_need(catalog, values, models, common)
        alts = tuple(req for _size, req in sized)
        sizes = tuple(size for size, _req in sized)
    elif kind == 'whole':
        alts = (request_mod.GpuRequest(host_mod.WHOLE, models=models,
                                       **common),)
    else:
        alts = (request_mod.GpuRequest(host_mod.VGPU, models=models,
                                       **common),)
    if 'memory' not in values:
        sizes = (0,) * len(alts)
    problem = None
    if units != common['count']:
        problem = ('flavor asks %d GPU device(s) with gpu: extra specs but '
                   '%d %s from Placement; set %s'
                   % (common['count'], units, rc, ', '.join(
                       '%s=%s' % kv for kv in sorted(placement_extra_specs(
                           GpuSpec(alts, True, False, 0, 0, rc), vgpu_rc,
                           whole_rc).items()))))
    return GpuSpec(alts, True, 'memory' in values, units, groups, rc,
                   problem, sizes)


def _exclusive(values):
    named = [k for k in ('profile', 'mig', 'memory') if k in values]
    if len(named) > 1:
        raise ExtraSpecError(PREFIX + named[1], values[named[1]],
                             'cannot be combined with %s%s'
                             % (PREFIX, named[0]))
    if 'compute' in values and 'memory' not in values:
        raise ExtraSpecError(PREFIX + 'compute', values['compute'],
                             'only applies together with gpu:memory')
    kind = values.get('kind')
    if kind and named and named[0] != 'memory':
        raise ExtraSpecError(PREFIX + 'kind', kind, 'only applies together '
                             'with gpu:memory or alone')


def _numa(extra_specs, values, vcpus, memory_mb):
    dedicated = extra_specs.get('hw:cpu_policy') == 'dedicated'
    try:
        nodes = int(extra_specs.get('hw:numa_nodes', 0))
    except ValueError:
        nodes = 0
    if not dedicated and not nodes:
        return 'none', 0, 0
    affinity = 'require' if values.get('topology') == 'numa' else 'prefer'
    # The GPUs' node must hold one guest cell: all of it unless split.
    per_cell = max(nodes, 1)
    return (affinity, vcpus * host_mod.MILLI // per_cell,
            memory_mb // per_cell)


def _profile_request(values, models, common):
    model, profile = values['profile']
    if models is not None and model.name not in models:
        raise ExtraSpecError(PREFIX + 'profile', profile.name,
                             'is a %s profile, not one of gpu:model %s'
                             % (model.name, ','.join(sorted(models))))
    return request_mod.GpuRequest(host_mod.VGPU, profile.name,
                                  models=frozenset([model.name]), **common)


def _mig_request(catalog, values, models, common):
    name = values['mig']
    having = frozenset(m.name for m in catalog.models.values()
                       if m.mig and name in m.mig.profiles)
    allowed = having if models is None else having & models
    if not allowed:
        raise ExtraSpecError(PREFIX + 'mig', name,
                             'no model of gpu:model offers it',
                             sorted(having))
    return request_mod.GpuRequest(host_mod.MIG, name, models=allowed,
                                  **common)


def _by_need(catalog, values, models, common):
    """Every device that meets the need, smallest first."""
    need_mib = values['memory']
    need_milli = values.get('compute', 0)
    kind = values.get('kind', 'vgpu')
    found = []
    for model in catalog.models.values():
        if models is not None and model.name not in models:
            continue
        one = frozenset([model.name])
        if kind == 'whole':
            if model.framebuffer_mib >= need_mib:
                found.append((model.framebuffer_mib, host_mod.MILLI,
                              request_mod.GpuRequest(
                                  host_mod.WHOLE, models=one, **common)))
            continue
        for profile in model.vgpu_profiles.values():
            if profile.framebuffer_mib < need_mib:
                continue
            if profile.mig_backed:
                mig = model.mig.profiles[profile.mig_profile]
                share = (mig.compute_slices * host_mod.MILLI
                         // model.mig.compute_slices)
                req = (request_mod.GpuRequest(host_mod.MIG, mig.name,
                                              models=one, **common)
                       if kind == 'mig' else
                       request_mod.GpuRequest(host_mod.VGPU, profile.name,
                                              models=one, **common))
            elif kind == 'mig':
                continue
            else:
                share = host_mod.MILLI // profile.max_instances
                req = request_mod.GpuRequest(host_mod.VGPU, profile.name,
                                             models=one, **common)
            if share >= need_milli:
                found.append((profile.framebuffer_mib, -share, req))
    if not found:
        raise ExtraSpecError(
            PREFIX + 'memory', '%dMB' % need_mib,
            'no %s device of %s has that much memory%s'
            % (kind, 'gpu:model ' + ','.join(sorted(models)) if models
               else 'any known model',
               ' and %.0f%% compute' % (need_milli / 10.0)
               if need_milli else ''))
    found.sort(key=lambda f: (f[0], f[1], sorted(f[2].models),
                              f[2].profile or ''))
    seen, result = set(), []
    for size, _share, req in found:
        if req.key() not in seen:
            seen.add(req.key())
            result.append((size, req))
    return result


def from_request_spec(spec_obj, catalog=None):
    """GpuSpec of a Nova RequestSpec (None: no GPU asked)."""
    flavor = spec_obj.flavor
    return parse_cached(tuple(sorted((flavor.extra_specs or {}).items())),
                        flavor.vcpus, flavor.memory_mb, catalog)


@functools.lru_cache(maxsize=1024)
def _parse_cached(items, vcpus, memory_mb, catalog, vgpu_rc, whole_rc):
    try:
        return parse(dict(items), catalog, vcpus, memory_mb, vgpu_rc,
                     whole_rc)
    except exceptions.GpuError as e:
        # Flavors created before the validator was enabled can still
        # carry bad values; the filter reports them per request.
        return GpuSpec((), True, False, 0, 0, vgpu_rc, str(e))


def parse_cached(items, vcpus, memory_mb, catalog=None):
    """``parse`` memoised on the flavor's content (flavors are few)."""
    opts = CONF.gpu_scheduler
    return _parse_cached(items, vcpus, memory_mb,
                         catalog or default_catalog(),
                         opts.vgpu_resource_class,
                         opts.whole_gpu_resource_class)
