"""Flavor extra specs in the ``gpu:`` namespace, turned into GPU requests.

This is the one place that reads the grammar: the Nova API validator
(``scheduler.extra_specs``), the scheduler filter (``scheduler.gpu_spec``,
which adds the configuration), the reclaimer and the compute agent's qemu
hook all call it, so a flavor the API accepts is a flavor each of them reads
the same way. It is the core's: no OpenStack and no configuration here. What
the ``[gpu_scheduler]`` options say (resource classes, aliases, default vGPU
backend, ``max_gpu_count``) comes in as a ``PathNames``, and the catalog as
an argument.

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
    gpu:count=<1..max_gpu_count>   devices, each on its own physical GPU
                                   (default limit 8, at most 8: see
                                   MAX_COUNT)
    gpu:model=<model>[,<model>..]  allowed GPU models (catalog names/aliases)
    gpu:topology=any|numa|nvlink   all devices on one NUMA node / NVLinked
    gpu:backend=mdev|vfio          how vGPUs are served where a cloud mixes
                                   paths (default [gpu_scheduler]
                                   vgpu_backend): mediated devices, or
                                   NVIDIA vendor-specific VFIO VFs
    gpu:preemptible=true|false     spot capacity: nova-gpu-reclaimer may
                                   evict the flavor's servers for on-demand
                                   ones (default false; asks no device)
    gpu:rdma=true|false            GPUDirect RDMA: each GPU gets one RDMA
                                   NIC function (a VF of the flavor's
                                   [gpu_scheduler] rdma_nic_alias) under
                                   the same PCIe switch or root complex
                                   ([gpu_scheduler] rdma_locality;
                                   core.rdma); default false

GB and MB are binary here (1GB = 1024MB), as in NVIDIA's profile names
(3g.20gb has 20480 MiB). The Placement side stays Nova's own, one form
per path (``placement_extra_specs`` gives the keys; see ``PATHS``):

* mdev vGPUs (PF or SR-IOV VF parents): ``resources:VGPU=1``, or
  ``resourcesN:VGPU=1`` groups with ``group_policy=isolate`` for several;
* vendor-VFIO vGPUs (PCI in Placement): ``pci_passthrough:alias=
  nvidia-vgpu:N``, plus ``group_policy=isolate`` for several (Nova makes
  one request group per device; isolate keeps them on distinct GPUs' pools);
* whole GPUs (passthrough, PCI in Placement): ``pci_passthrough:alias=
  nvidia-gpu:N`` (each GPU is a provider of one: N groups, N GPUs).

The alias names and resource classes are ``[gpu_scheduler]`` options
(defaults in ``core.report``), handed in as ``PathNames``.

Numbers are ASCII digits only and values printable ASCII. A key that looks
meant for this namespace but is not exactly one of ``KEYS`` (``GPU:count``,
`` gpu:count``, ``gpu :count``, ``gpu:Count``) is refused, by the API
validator and by ``parse``, never ignored.
"""

import dataclasses
import decimal
import functools
import math
import re

from nova_gpu.core import exceptions
from nova_gpu.core import gpu_sets
from nova_gpu.core import host as host_mod
from nova_gpu.core import rdma as rdma_mod
from nova_gpu.core import report as report_mod
from nova_gpu.core import request as request_mod

PREFIX = 'gpu:'
KINDS = ('vgpu', 'mig', 'whole')
BACKENDS = ('mdev', 'vfio')
ALIAS_KEY = 'pci_passthrough:alias'

# How a device reaches the guest, as the harness, the demo and the docs
# name the paths (the report's provider kinds say how Placement shows them).
PATH_MDEV = 'mdev'          # VGPU on a PF or VF mdev parent
PATH_VFIO = 'vfio'          # vendor-VFIO VF from a per-GPU PCI pool
PATH_PASSTHROUGH = 'passthrough'  # the whole GPU, PCI in Placement
PATHS = (PATH_MDEV, PATH_VFIO, PATH_PASSTHROUGH)


DEFAULT_MAX_COUNT = 8  # [gpu_scheduler] max_gpu_count's default


@dataclasses.dataclass(frozen=True)
class PathNames:
    """What configuration says of flavors (``[gpu_scheduler]``): the
    paths' resource classes and aliases, the default vGPU backend and the
    ``gpu:count`` limit. The defaults are the options' defaults; a
    service builds it from its options (``from_options``).
    """

    vgpu_rc: str = report_mod.VGPU_RC
    whole_rc: str = report_mod.WHOLE_GPU_RC
    vfio_rc: str = report_mod.VFIO_VGPU_RC
    whole_alias: str = report_mod.WHOLE_GPU_ALIAS
    vfio_alias: str = report_mod.VFIO_VGPU_ALIAS
    backend: str = 'mdev'  # vGPU path of flavors without gpu:backend
    max_gpu_count: int = DEFAULT_MAX_COUNT  # capped by MAX_COUNT
    # gpu:rdma=true: where each GPU's NIC function must be, and the PCI
    # alias of the NIC functions (VFs) in the flavor.
    rdma_locality: str = rdma_mod.DEFAULT_SCOPE
    rdma_alias: str = report_mod.RDMA_NIC_ALIAS

    @classmethod
    def from_options(cls, opts, vgpu_rc=None, whole_rc=None):
        """From an object with the ``[gpu_scheduler]`` options as
        attributes (``conf.gpu_scheduler``); ``vgpu_rc`` / ``whole_rc``
        override those resource classes.
        """
        return cls(vgpu_rc or opts.vgpu_resource_class,
                   whole_rc or opts.whole_gpu_resource_class,
                   opts.vfio_vgpu_resource_class, opts.whole_gpu_alias,
                   opts.vfio_vgpu_alias, opts.vgpu_backend,
                   opts.max_gpu_count, opts.rdma_locality,
                   opts.rdma_nic_alias)


MAX_COUNT = gpu_sets.MAX_COUNT
"""The most devices ``gpu:count`` can ever ask (``max_gpu_count`` caps).

Each device of a multi-GPU flavor is its own Placement request group: a
GPU provider holds one whole GPU or the vGPUs of one physical GPU, and
Placement never splits one group's amount of a resource class across
providers, so N devices on N distinct GPUs cannot be one group with a
count. Placement walks the cartesian product of the groups' providers and
only then drops the combinations that reuse a provider; the set traits of
``core.gpu_sets`` (one stand-in provider per GPU, group k on GPUs k to
G-N+k) keep that product at (G-N+1)**N per host of G GPUs, which is why
the flavors ask them (``placement_extra_specs``). Beyond 8 the hosts with
that many GPUs are rare and the traits per provider grow quadratically.
"""

# Values are printable ASCII; numbers are ASCII digits (Python's int() and
# float() would take Unicode digits, underscores, signs, 'inf' and 'nan').
_NOT_PRINTABLE = re.compile(r'[^\x20-\x7e]')
_COUNT = re.compile(r'[0-9]{1,4}')
_SIZE = re.compile(r'([0-9]{1,9}(?:\.[0-9]{1,9})?) ?(mb|mib|gb|gib|tb|tib)',
                   re.IGNORECASE | re.ASCII)
_SHARE = re.compile(r'([0-9]{1,3}(?:\.[0-9]{1,9})?)(%?)', re.ASCII)
# A key meant for this namespace: "gpu" in any case with spaces around,
# then a colon. Only the exact "gpu:<name>" keys are read.
_NEAR_KEY = re.compile(r'\s*gpu\s*:.*', re.IGNORECASE | re.DOTALL)
_RESOURCES = re.compile(r'^resources([A-Za-z0-9_-]*):(.+)$')
_UNIT_MIB = {'mb': 1, 'mib': 1, 'gb': 1024, 'gib': 1024,
             'tb': 1024 * 1024, 'tib': 1024 * 1024}
_SHOWN = 48  # characters of a bad value quoted back in an error
_SHOWN_KEY = 255  # keys in full: Nova's longest


def _show(text, limit=_SHOWN):
    """``text`` as an error message quotes it: visibly, and not too long."""
    text = str(text)
    if len(text) > limit:
        text = text[:limit] + '...'
    if _NOT_PRINTABLE.search(text) or text != text.strip() or not text:
        return ascii(text)
    return text


class ExtraSpecError(exceptions.InvalidRequest):
    """A ``gpu:`` extra spec is wrong; the message names key and remedy."""

    def __init__(self, key, value, problem, allowed=None):
        self.key = key
        self.value = value
        msg = '%s=%s: %s' % (_show(key, _SHOWN_KEY), _show(value), problem)
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
    path: str = PATH_MDEV  # one of PATHS
    # Schedulable but slow: what to change (logged once per flavor).
    advice: str = None

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


# -- one key at a time (API validation) ----------------------------------

def near_miss(key):
    """Whether ``key`` looks meant for the ``gpu:`` namespace but is not a
    ``gpu:`` key this module reads (other case, spaces, unknown name).
    """
    return bool(_NEAR_KEY.fullmatch(key)) and key not in KEYS


def _refuse_key(key, value):
    """Refuse a key this module does not read, saying what it meant."""
    guess = re.sub(r'\s', '', key).lower()
    meant = (' (did you mean %s?)' % guess) if guess in KEYS else ''
    if _NEAR_KEY.fullmatch(key) and not key.startswith(PREFIX):
        raise ExtraSpecError(
            key, value, 'not read: GPU extra specs start with exactly "%s" '
            '(lower case, no spaces)%s' % (PREFIX, meant))
    if meant:
        raise ExtraSpecError(key, value, 'not read: GPU extra spec names '
                             'are lower case, without spaces%s' % meant)
    raise ExtraSpecError(key, value, 'unknown GPU extra spec', KEYS)


def validate_value(key, value, catalog, names=None):
    """Check one ``gpu:`` extra spec; return its parsed value.

    A key that is not one this module reads (``gpu:colour``) or only looks
    like one (``GPU:count``, `` gpu:count``, ``gpu:Count``) is refused,
    with the key it probably meant. ``catalog``: the GPU catalog the
    names are looked up in; ``names``: a ``PathNames`` (its
    ``max_gpu_count`` bounds ``gpu:count``; default: the defaults).
    """
    names = names or _DEFAULT_NAMES
    name = key[len(PREFIX):] if key.startswith(PREFIX) else key
    parser = _PARSERS.get(name)
    if parser is None:
        _refuse_key(key, value)
    if not isinstance(value, str):
        value = str(value)
    bad = _NOT_PRINTABLE.search(value)
    if bad:
        raise ExtraSpecError(key, value, 'character %d is not printable '
                             'ASCII' % bad.start())
    return parser(catalog, PREFIX + name, value, names)


def _profile(catalog, key, value, names):
    try:
        return catalog.vgpu_profile(value.strip())
    except exceptions.UnknownProfile:
        raise ExtraSpecError(key, value, 'unknown vGPU profile',
                             catalog.vgpu_profile_names()) from None


def _mig(catalog, key, value, names):
    value = value.strip()
    if value not in catalog.mig_profile_names():
        raise ExtraSpecError(key, value, 'unknown MIG profile',
                             catalog.mig_profile_names())
    return value


def max_count(max_gpu_count=DEFAULT_MAX_COUNT):
    """The ``gpu:count`` limit: ``max_gpu_count`` (``[gpu_scheduler]``),
    at least 1 and at most ``MAX_COUNT`` (even where the option is not
    range-checked).
    """
    return max(1, min(max_gpu_count, MAX_COUNT))


def _count(catalog, key, value, names):
    count = int(value) if _COUNT.fullmatch(value) else 0
    limit = max_count(names.max_gpu_count)
    if not 1 <= count <= limit:
        raise ExtraSpecError(
            key, value, 'must be an integer from 1 to %d (ASCII digits): '
            'each device is one Placement request group, on its own GPU '
            '(limit: [gpu_scheduler] max_gpu_count, at most %d)'
            % (limit, MAX_COUNT))
    return count


def _models(catalog, key, value, names):
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


def _topology(catalog, key, value, names):
    if value not in request_mod.TOPOLOGIES:
        raise ExtraSpecError(key, value, 'unknown topology',
                             request_mod.TOPOLOGIES)
    return value


def _largest_mib(catalog):
    return max((m.framebuffer_mib for m in catalog.models.values()),
               default=0)


def _memory(catalog, key, value, names):
    match = _SIZE.fullmatch(value)
    if not match:
        raise ExtraSpecError(key, value, 'expected a positive size with a '
                             'unit, e.g. 20GB or 20480MB')
    exact = (decimal.Decimal(match.group(1))
             * _UNIT_MIB[match.group(2).lower()])
    # At least this much: a fraction of a MiB rounds up.
    mib = math.ceil(exact)
    if exact < 1:
        raise ExtraSpecError(key, value, 'is less than 1 MiB; expected a '
                             'positive size with a unit, e.g. 20GB')
    largest = _largest_mib(catalog)
    if mib > largest:
        raise ExtraSpecError(key, value, 'no GPU in the catalog has that '
                             'much memory (largest: %d MiB)' % largest)
    return mib


def _compute(catalog, key, value, names):
    match = _SHARE.fullmatch(value)
    if match:
        share = (decimal.Decimal(match.group(1))
                 / (100 if match.group(2) else 1))
        if 0 < share <= 1:
            # At least this share: never rounded down to nothing.
            return max(1, int(round(share * host_mod.MILLI)))
    raise ExtraSpecError(key, value, 'expected a share of one GPU in (0, 1] '
                         'or (0%, 100%], e.g. 0.25 or 25%')


def _kind(catalog, key, value, names):
    if value not in KINDS:
        raise ExtraSpecError(key, value, 'unknown kind', KINDS)
    return value


def _backend(catalog, key, value, names):
    if value not in BACKENDS:
        raise ExtraSpecError(key, value, 'unknown vGPU backend: mdev '
                             '(mediated devices, resources:VGPU) or vfio '
                             '(NVIDIA vendor-specific VFIO VFs, PCI in '
                             'Placement)', BACKENDS)
    return value


PREEMPTIBLE = PREFIX + 'preemptible'
BOOLEANS = ('true', 'false')


def _preemptible(catalog, key, value, names):
    # Exactly true or false: the reclaimer evicts a server on this value,
    # so nothing that merely looks true ("True", "yes", "1") is stored.
    if value not in BOOLEANS:
        raise ExtraSpecError(key, value, 'must be true (spot: servers of '
                             'this flavor may be evicted by '
                             'nova-gpu-reclaimer) or false', BOOLEANS)
    return value == 'true'


def preemptible(extra_specs):
    """Whether a flavor's servers are spot (``gpu:preemptible=true``).

    A bad value raises ExtraSpecError (the API validator refuses it).
    """
    value = (extra_specs or {}).get(PREEMPTIBLE)
    if value is None:
        return False
    # The value needs no catalog.
    return validate_value(PREEMPTIBLE, value, None)


def _rdma(catalog, key, value, names):
    # Exactly true or false, as gpu:preemptible: the locality comes from
    # [gpu_scheduler] rdma_locality (the operator knows the hardware).
    if value not in BOOLEANS:
        raise ExtraSpecError(key, value, 'must be true (each GPU with an '
                             'RDMA NIC function, pci_passthrough:alias '
                             '%s, under the same %s) or false'
                             % (names.rdma_alias, names.rdma_locality),
                             BOOLEANS)
    return names.rdma_locality if value == 'true' else None


_PARSERS = {
    'profile': _profile, 'mig': _mig, 'count': _count, 'model': _models,
    'topology': _topology, 'memory': _memory, 'compute': _compute,
    'kind': _kind, 'backend': _backend, 'preemptible': _preemptible,
    'rdma': _rdma,
}
# Keys that say how a server is treated, not which device it asks: they
# neither make a flavor's GPU request nor make a stock flavor "explicit".
_NOT_DEVICE = ('preemptible',)
KEYS = tuple(PREFIX + k for k in sorted(_PARSERS))
_DEFAULT_NAMES = PathNames()


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


def alias_counts(extra_specs):
    """``{alias name: devices}`` of a flavor's ``pci_passthrough:alias``
    (``name:count[,name:count...]``; a bad entry counts nothing here:
    Nova's own validator refuses it).
    """
    result = {}
    for part in str(extra_specs.get(ALIAS_KEY) or '').split(','):
        name, _sep, count = part.strip().partition(':')
        count = count.strip() or '1'
        if name and _COUNT.fullmatch(count):
            result[name.strip()] = result.get(name.strip(), 0) + int(count)
    return result


def placement_extra_specs(spec, names, sets=True):
    """The Placement / PCI extra specs Nova needs for ``spec``.

    One device: ``resources:VGPU=1`` (mdev vGPUs) or
    ``pci_passthrough:alias=<alias>:1`` (vendor-VFIO vGPUs, whole GPUs:
    PCI in Placement).

    N devices on N GPUs: N request groups of one device each, group k
    requiring ``core.gpu_sets.trait(N, k)`` so that Placement walks one
    stand-in provider per GPU and GPUs k to G-N+k only (see gpu_sets).
    mdev vGPUs: ``resourcesK:VGPU=1`` with ``traitK:<trait>=required``
    (K = k + 1) and ``group_policy=isolate`` (a PF mdev parent may carry
    two groups' traits and hold two vGPUs). PCI paths: one alias per
    device, ``gpu_sets.alias_name`` (whose ``traits`` is the group's
    trait); Nova makes one request group per alias device
    (``RequestSpec.generate_request_groups_from_pci_requests`` in
    nova/objects/request_spec.py, with ``[filter_scheduler]
    pci_in_placement``) with the alias's traits required. A whole GPU is
    a provider of one, so Nova's default ``group_policy=none``
    (``nova.scheduler.utils.resources_from_request_spec``) lands N groups
    on N GPUs; vendor-VFIO VFs of one GPU share a pool provider, so they
    need ``group_policy=isolate``. ``names``: a ``PathNames``.

    ``sets=False``: the same groups without set traits, as stock Nova
    clouds (no nova-gpu-agent keeping the traits) need them.

    ``gpu:rdma=true`` adds one RDMA NIC function per GPU to the aliases:
    ``<names.rdma_alias>:N`` (Nova makes one request group per device;
    Placement's allocation then names the NIC PF each VF comes from, and
    the compute claims the VF from that PF: ``core.rdma``).
    """
    result = _device_extra_specs(spec, names, sets)
    if spec.alternatives[0].rdma is not None:
        nics = '%s:%d' % (names.rdma_alias, spec.alternatives[0].count)
        result[ALIAS_KEY] = (result[ALIAS_KEY] + ',' + nics
                             if ALIAS_KEY in result else nics)
    return result


def _device_extra_specs(spec, names, sets):
    """``placement_extra_specs`` of the GPU devices alone."""
    count = spec.alternatives[0].count
    path = spec.path
    if path in (PATH_VFIO, PATH_PASSTHROUGH):
        alias = (names.whole_alias if path == PATH_PASSTHROUGH
                 else names.vfio_alias)
        if count == 1 or not sets:
            result = {ALIAS_KEY: '%s:%d' % (alias, count)}
            if path == PATH_VFIO and count > 1:
                result['group_policy'] = 'isolate'
            return result
        result = {ALIAS_KEY: ','.join(
            '%s:1' % gpu_sets.alias_name(alias, count, k)
            for k in range(count))}
        if path == PATH_VFIO:
            result['group_policy'] = 'isolate'
        return result
    rc = names.vgpu_rc
    if count == 1:
        return {'resources:%s' % rc: '1'}
    result = {}
    for k in range(count):
        result['resources%d:%s' % (k + 1, rc)] = '1'
        if sets:
            result['trait%d:%s' % (k + 1, gpu_sets.trait(count, k))] = (
                'required')
    result['group_policy'] = 'isolate'
    return result


def set_shape(extra_specs, names, path, count):
    """Whether a flavor's Nova keys ask the set traits for ``count``
    devices: ``'sets'`` (exactly those of ``placement_extra_specs``),
    ``'plain'`` (none: correct, but Placement walks every combination of
    providers, minutes per host for 8 devices) or ``'mixed'`` (some, not
    matching the count: Placement would find no candidate).
    """
    asked = []  # (count, k) of each device asked with a set trait
    if path in (PATH_VFIO, PATH_PASSTHROUGH):
        base = (names.whole_alias if path == PATH_PASSTHROUGH
                else names.vfio_alias)
        for name, units in alias_counts(extra_specs).items():
            parsed = gpu_sets.parse_alias(name)
            if parsed and parsed[0] == base:
                asked.extend([parsed[1:]] * units)
    else:
        for key, value in extra_specs.items():
            if key.startswith('trait') and value == 'required':
                parsed = gpu_sets.parse_trait(key.partition(':')[2])
                if parsed:
                    asked.append(parsed)
    if not asked:
        return 'plain'
    wanted = [(count, k) for k in range(count)] if count > 1 else []
    return 'sets' if sorted(asked) == wanted else 'mixed'


def rdma_units(extra_specs, names):
    """NIC functions a flavor asks through ``names.rdma_alias``."""
    return alias_counts(extra_specs).get(names.rdma_alias, 0)


def _alias_units(aliases, base):
    """Devices asked through alias ``base`` and its set aliases."""
    return sum(units for name, units in aliases.items()
               if name == base
               or (gpu_sets.parse_alias(name) or (None,))[0] == base)


def _path_of(values, extra_specs, names):
    """(path, resource class, units, groups) the flavor asks."""
    aliases = alias_counts(extra_specs)
    vgpu_units, vgpu_groups = placement_units(extra_specs, names.vgpu_rc)
    vfio_units = _alias_units(aliases, names.vfio_alias)
    whole_units = _alias_units(aliases, names.whole_alias)
    whole_res, whole_groups = placement_units(extra_specs, names.whole_rc)
    backend = values.get('backend')
    if values.get('kind') == 'whole' or (
            not values and (whole_units or whole_res)):
        if backend:
            raise ExtraSpecError(
                PREFIX + 'backend', backend, 'applies to vGPUs only: a '
                'whole GPU is passed through as a PCI device '
                '(%s=%s:N)' % (ALIAS_KEY, names.whole_alias))
        return (PATH_PASSTHROUGH, names.whole_rc, whole_units + whole_res,
                whole_units + whole_groups)
    if vgpu_units and vfio_units:
        raise ExtraSpecError(
            ALIAS_KEY, extra_specs.get(ALIAS_KEY), 'the flavor asks vGPUs '
            'both as mdevs (resources:%s) and as vendor-VFIO VFs (alias '
            '%s); one device is served by one path: keep one, or set '
            'gpu:backend' % (names.vgpu_rc, names.vfio_alias))
    if backend is None:
        backend = ('vfio' if vfio_units else 'mdev' if vgpu_units
                   else names.backend)
    if backend == 'vfio':
        if vgpu_units:
            raise ExtraSpecError(
                PREFIX + 'backend', backend, 'asks vendor-VFIO VFs but the '
                'flavor asks mdev vGPUs (resources:%s)' % names.vgpu_rc)
        return PATH_VFIO, names.vfio_rc, vfio_units, vfio_units
    if vfio_units:
        raise ExtraSpecError(
            PREFIX + 'backend', backend, 'asks mdev vGPUs but the flavor '
            'asks vendor-VFIO VFs (%s=%s:N)'
            % (ALIAS_KEY, names.vfio_alias))
    return PATH_MDEV, names.vgpu_rc, vgpu_units, vgpu_groups


def _device_values(extra_specs, catalog, names):
    """``{name: parsed value}`` of the flavor's ``gpu:`` keys that ask a
    device (every ``gpu:`` key validated).
    """
    values = {}
    for key, value in extra_specs.items():
        # A near miss (GPU:profile) is refused, not ignored: the flavor
        # may predate the API validator or use a microversion below 2.86.
        if key.startswith(PREFIX) or _NEAR_KEY.fullmatch(key):
            values[key[len(PREFIX):]] = validate_value(key, value, catalog,
                                                       names)
    for name in _NOT_DEVICE:
        values.pop(name, None)
    if values.get('rdma', True) is None:
        values.pop('rdma')  # gpu:rdma=false asks nothing
    return values


def parse(extra_specs, catalog, vcpus=0, memory_mb=0, names=None):
    """GpuSpec of a flavor, or None when it asks for no GPU at all.

    Raises ExtraSpecError when a ``gpu:`` key is wrong or the keys
    contradict each other (or ask a combination no path can serve).
    ``catalog``: the GPU catalog; ``names``: a ``PathNames`` (the
    ``[gpu_scheduler]`` options; default: their defaults).
    """
    names = names or _DEFAULT_NAMES
    values = _device_values(extra_specs, catalog, names)
    kind = values.get('kind')
    path, rc, units, groups = _path_of(values, extra_specs, names)
    if not values and not units:
        return None
    affinity, cpu_milli, memory_mib = _numa(extra_specs, values, vcpus,
                                            memory_mb)
    common = dict(count=values.get('count', 1),
                  topology=values.get('topology', 'any'),
                  numa_affinity=affinity, cpu_milli=cpu_milli,
                  memory_mib=memory_mib, rdma=values.get('rdma'))
    models = values.get('model')
    if not values:
        # A stock flavor: whatever type each GPU is set up for.
        if groups == 1 and units > 1:
            # Several vGPUs in one group may share a physical GPU, which a
            # GpuRequest (one device per GPU) cannot say: left to Nova.
            return None
        if path == PATH_VFIO and extra_specs.get('group_policy') != \
                'isolate' and units > 1:
            # Several VFs may come from one GPU's pool: left to Nova.
            return None
        common['count'] = groups if groups > 1 else units
        alts = (request_mod.GpuRequest(
            host_mod.WHOLE if path == PATH_PASSTHROUGH else host_mod.VGPU,
            **common),)
        return GpuSpec(alts, False, False, units, groups, rc, sizes=(0,),
                       path=path)
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
    problem = advice = None
    wanted = ', '.join('%s=%s' % kv for kv in sorted(placement_extra_specs(
        GpuSpec(alts, True, False, 0, 0, rc, path=path),
        names=names).items()))
    shape = set_shape(extra_specs, names, path, common['count'])
    if units != common['count']:
        problem = ('flavor asks %d GPU device(s) with gpu: extra specs but '
                   '%d %s from Placement; set %s'
                   % (common['count'], units, rc, wanted))
    elif common['rdma'] is not None and rdma_units(
            extra_specs, names) != common['count']:
        problem = ('flavor asks %d GPU(s) with gpu:rdma=true, one RDMA NIC '
                   'function each, but %d NIC function(s) (%s %s:N); set '
                   '%s' % (common['count'], rdma_units(extra_specs, names),
                           ALIAS_KEY, names.rdma_alias, wanted))
    elif shape == 'mixed':
        problem = ('flavor asks %d GPU devices but its set traits or '
                   'aliases are not those of %d devices; set %s'
                   % (common['count'], common['count'], wanted))
    elif shape == 'plain' and common['count'] > 1:
        advice = ('flavor asks %d GPU devices without set traits: '
                  'Placement walks every combination of providers (minutes '
                  'per 8-GPU host for 8 devices); set %s'
                  % (common['count'], wanted))
    return GpuSpec(alts, True, 'memory' in values, units, groups, rc,
                   problem, sizes, path, advice)


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


# -- one GPU's vGPU type (the compute agent) ------------------------------

def vgpu_types_for(extra_specs, catalog, model):
    """The vGPU types a flavor may be served with on a ``model`` GPU, in
    the scheduler's order of preference; () when the flavor names no vGPU
    type (a stock flavor, ``gpu:mig``, ``gpu:kind=mig|whole``).

    ``gpu:profile``: that type. ``gpu:memory`` (with ``gpu:compute``,
    ``gpu:model``): the model's types that meet the need, smallest first,
    then the larger compute share, then by name: ``parse``'s order of the
    alternatives, the one the scheduler ranks by (``ranking.sort_key``),
    so a vendor-VFIO VF is given the type the scheduler chose the GPU for.
    ``model``: the GPU's ``catalog.GpuModel``. Raises ExtraSpecError when
    a ``gpu:`` key is wrong or the flavor cannot be served on this model.
    """
    values = _device_values(extra_specs, catalog, _ANY_COUNT)
    _exclusive(values)
    models = values.get('model')
    if 'profile' in values:
        owner, profile = values['profile']
        if owner.name != model.name:
            raise ExtraSpecError(PREFIX + 'profile', profile.name,
                                 'is a %s profile, not one of this %s GPU'
                                 % (owner.name, model.name))
        return (profile.name,)
    if 'memory' not in values or values.get('kind', 'vgpu') != 'vgpu':
        return ()
    if models is not None and model.name not in models:
        raise ExtraSpecError(PREFIX + 'model', ','.join(sorted(models)),
                             'does not allow this %s GPU' % model.name)
    try:
        found = _by_need(catalog, values, frozenset([model.name]), {})
    except ExtraSpecError as e:
        raise ExtraSpecError(e.key, extra_specs[e.key],
                             'no vGPU type of this %s GPU meets it'
                             % model.name) from None
    return tuple(req.profile for _size, req in found)


def vgpu_type_for(extra_specs, catalog, model, available=None):
    """The vGPU type to give a ``model`` GPU's VF for a flavor, or None
    when the flavor names none (see ``vgpu_types_for``).

    The first of ``vgpu_types_for`` that ``available`` holds (the type
    names the VF can take now, e.g. its ``creatable_vgpu_types`` without
    the vendor prefix; None: any). Raises ExtraSpecError when a key is
    wrong, or no type the flavor may have is available.
    """
    types = vgpu_types_for(extra_specs, catalog, model)
    if not types:
        return None
    for name in types:
        if available is None or name in available:
            return name
    key = 'profile' if PREFIX + 'profile' in extra_specs else 'memory'
    raise ExtraSpecError(PREFIX + key, extra_specs[PREFIX + key],
                         'no vGPU type of it can be set on this %s GPU now '
                         '(wanted: %s; available: %s)'
                         % (model.name, ', '.join(types),
                            ', '.join(sorted(available)) or 'none'))


# The agent does not police gpu:count (the API validator and the
# scheduler did, with the configured limit): any count the grammar allows.
_ANY_COUNT = PathNames(max_gpu_count=MAX_COUNT)
