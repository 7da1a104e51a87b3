"""The GPU catalog: models, vGPU profiles and MIG placement rules as data.

The catalog ships as ``data/gpu_catalog.yaml`` and operators can add or
replace models with their own files (``[gpu] catalog_files``). Every file
is parsed against one typed schema (``MODEL`` and the records it holds)
at this boundary; errors name the file, the entry and the field, and
nothing else escapes the loader.
"""

import dataclasses
import functools
import os
import re
import stat

import yaml

from nova_gpu.core import exceptions
from nova_gpu.core import mixed_size

DEFAULT_CATALOG = os.path.join(os.path.dirname(__file__), 'data',
                               'gpu_catalog.yaml')
SCHEMA_VERSION = 1
VGPU_MODES = ('mdev', 'sriov', 'none')


@dataclasses.dataclass(frozen=True)
class MigProfile:
    """A GPU instance profile and where NVIDIA allows it on one GPU.

    ``framebuffer_mib`` is explicit data, the MiB NVIDIA documents for the
    profile's MIG-backed vGPU type; it is never derived from the name (an
    H100 NVL's ``2g.24gb`` has 24672, not 24 * 1024).
    """

    name: str
    compute_slices: int
    memory_slices: int
    framebuffer_mib: int
    max_instances: int
    starts: tuple

    def mask(self, start):
        """Bit mask of the memory slices the instance at ``start`` holds."""
        return ((1 << self.memory_slices) - 1) << start

    @property
    def placements(self):
        """``(start, mask)`` for each allowed start, computed once."""
        try:
            return self._placements
        except AttributeError:
            value = tuple((s, self.mask(s)) for s in self.starts)
            object.__setattr__(self, '_placements', value)
            return value


@dataclasses.dataclass(frozen=True)
class MigSpec:
    memory_slices: int
    compute_slices: int
    profiles: dict  # name -> MigProfile


@dataclasses.dataclass(frozen=True)
class VgpuProfile:
    """An NVIDIA vGPU type; MIG-backed when ``mig_profile`` is set.

    ``framebuffer_mib``: NVIDIA's "Frame Buffer (MB)" as printed (MiB),
    or the MIG profile's for a MIG-backed type.
    """

    name: str
    framebuffer_mib: int
    max_instances: int
    mig_profile: str = None

    @property
    def mig_backed(self):
        return self.mig_profile is not None


@dataclasses.dataclass(frozen=True)
class GpuModel:
    name: str
    architecture: str
    framebuffer_mib: int
    vgpu_mode: str
    time_sliced_mixing: bool
    nvlink: bool
    vgpu_profiles: dict  # name -> VgpuProfile
    mig: MigSpec = None
    pci_device_ids: tuple = ()
    nvml_names: tuple = ()
    aliases: tuple = ()
    sources: tuple = ()
    # Mixed-size vGPU mode (core.mixed_size): None where the model has no
    # such mode, else the types whose maximum NVIDIA lowers in it.
    mixed_size_maxima: dict = None

    @property
    def mig_capable(self):
        return self.mig is not None

    def vgpu_profile(self, name):
        try:
            return self.vgpu_profiles[name]
        except KeyError:
            raise exceptions.UnknownProfile(name, 'vGPU',
                                            self.vgpu_profiles) from None

    def mig_profile(self, name):
        profiles = self.mig.profiles if self.mig else {}
        try:
            return profiles[name]
        except KeyError:
            raise exceptions.UnknownProfile(
                name, 'MIG on %s' % self.name, profiles) from None

    @classmethod
    def generic(cls, name, framebuffer_mib=0):
        """A model known only by name: whole GPUs and shares, no profiles."""
        return cls(name=name, architecture='unknown',
                   framebuffer_mib=framebuffer_mib, vgpu_mode='none',
                   time_sliced_mixing=False, nvlink=False, vgpu_profiles={})


class Catalog:
    """All known GPU models, indexed by name, alias, PCI id and NVML name."""

    def __init__(self, models, sources=None):
        self.models = dict(models)
        self.sources = dict(sources or {})
        self._by_alias = {}
        self._by_pci = {}
        self._by_nvml = {}
        self._profile_owner = {}
        for model in self.models.values():
            for alias in model.aliases:
                self._by_alias[alias.lower()] = model
            for dev in model.pci_device_ids:
                self._by_pci[dev.lower()] = model
            for nvml_name in model.nvml_names:
                self._by_nvml[nvml_name.lower()] = model
            for profile in model.vgpu_profiles.values():
                self._profile_owner[profile.name] = model

    def model(self, name):
        found = self.models.get(name) or self._by_alias.get(name.lower())
        if found is None:
            raise exceptions.UnknownModel(name, self.models)
        return found

    def model_for_pci(self, device_id):
        """Model of a PCI device id such as ``0x20b0`` or ``20b0``."""
        key = device_id.lower()
        key = key[2:] if key.startswith('0x') else key
        return self._by_pci.get(key)

    def model_for_nvml_name(self, nvml_name):
        return self._by_nvml.get(nvml_name.strip().lower())

    def vgpu_profile(self, name):
        """Return ``(model, profile)`` for a vGPU profile name."""
        model = self._profile_owner.get(name)
        if model is None:
            raise exceptions.UnknownProfile(name, 'vGPU', self._profile_owner)
        return model, model.vgpu_profiles[name]

    def vgpu_profile_names(self):
        return sorted(self._profile_owner)

    def mig_profile_names(self):
        return sorted({p for m in self.models.values() if m.mig
                       for p in m.mig.profiles})


def load_catalog(paths=None):
    """Load the shipped catalog, then each extra file in ``paths``.

    A model defined again in a later file (same ``name``) replaces the
    earlier definition, so operators can correct or extend the shipped
    data. No other model may take over a name, alias, PCI id, NVML name or
    vGPU type another model owns: flavors that pin it would silently move
    to another model.
    """
    models, sources = {}, {}
    owners = _Owners()
    for path in [DEFAULT_CATALOG] + list(paths or ()):
        file_models, file_sources = (_shipped() if path == DEFAULT_CATALOG
                                     else _load_file(path))
        for model in file_models.values():
            owners.claim(path, model, models.get(model.name))
        sources.update(file_sources)
        models.update(file_models)
    return Catalog(models, sources)


@functools.lru_cache(maxsize=1)
def _shipped():
    """The shipped catalog, parsed once: package data, and immutable."""
    models, sources = _load_file(DEFAULT_CATALOG)
    return models, dict(sources)


# A catalog file is kilobytes (the shipped one, every model, is tens).
MAX_FILE_BYTES = 4 * 2 ** 20


def _load_file(path):
    # Only a regular file is read, at most MAX_FILE_BYTES of it, and its
    # open does not wait (O_NONBLOCK): a FIFO, a device or /dev/zero named
    # as a catalog file must not hang or fill the memory of the service
    # (scheduler, API, agent) loading the catalog.
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise exceptions.CatalogError(
                path, None, None, 'not a regular file (a FIFO, a device or '
                'a directory)')
        with os.fdopen(fd, 'rb') as f:
            data = f.read(MAX_FILE_BYTES + 1)
        if len(data) > MAX_FILE_BYTES:
            raise exceptions.CatalogError(
                path, None, None, 'larger than %d bytes' % MAX_FILE_BYTES)
        doc = yaml.safe_load(data.decode('utf-8'))
    except OSError as e:
        raise exceptions.CatalogError(path, None, None,
                                      'cannot read: %s' % e) from e
    except UnicodeDecodeError as e:
        raise exceptions.CatalogError(path, None, None,
                                      'not UTF-8 text: %s' % e) from e
    except (yaml.YAMLError, RecursionError) as e:
        raise exceptions.CatalogError(path, None, None,
                                      'not valid YAML: %s' % e) from e
    return _document(_Context(path), doc)


class _Owners:
    """Which model owns each identifier, across every file loaded.

    Model names and aliases share one case-insensitive namespace (lookups
    by alias ignore case); PCI ids and NVML names are matched without case
    too; vGPU type names are exact, as flavors spell them.
    """

    def __init__(self):
        self.owner = {}  # (namespace, key) -> (model name, file)

    @staticmethod
    def _keys(model):
        yield 'name', 'names', model.name.lower()
        for alias in model.aliases:
            yield 'aliases', 'names', alias.lower()
        for dev in model.pci_device_ids:
            yield 'pci_device_ids', 'pci', dev
        for nvml_name in model.nvml_names:
            yield 'nvml_names', 'nvml', nvml_name.strip().lower()
        for name in model.vgpu_profiles:
            yield 'vgpu_profiles', 'vgpu', name

    def claim(self, path, model, replaced):
        if replaced is not None:
            # An explicit replacement (same model name) frees what the
            # earlier definition owned; it may claim any of it again.
            for _field, space, key in self._keys(replaced):
                self.owner.pop((space, key), None)
        mine = {}
        for field, space, key in self._keys(model):
            other = self.owner.get((space, key))
            if other is not None and other[0] != model.name:
                raise exceptions.CatalogError(
                    path, model.name, field,
                    '%r already belongs to model %s (%s); a model may only '
                    'replace its own definition (same name)'
                    % (key, other[0], other[1]))
            mine[(space, key)] = (model.name, path)
        self.owner.update(mine)


# -- the schema ---------------------------------------------------------
#
# One typed pass over the parsed YAML: every value is checked for type and
# range where it is read, and every error names the file, the model and
# the field (``vgpu_profiles[A100-10C].max_instances``). Relations between
# fields (a start slice inside the GPU, a MIG profile that exists) are
# checked on the typed values afterwards.

# Matched whole (fullmatch): '$' would let a trailing newline through.
NAME_RE = re.compile(r'[A-Za-z0-9][A-Za-z0-9._+-]*')
PCI_ID_RE = re.compile(r'(0x)?[0-9a-fA-F]{4}', re.IGNORECASE)
_REQUIRED = object()


class _Context:
    """Where in which file the parser is, for error messages."""

    def __init__(self, path):
        self.path = path
        self.entry = None

    def fail(self, field, problem):
        raise exceptions.CatalogError(self.path, self.entry, field, problem)


def _describe(value):
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + '...'


class _Int:
    def __init__(self, minimum=0):
        self.minimum = minimum

    def parse(self, ctx, value, field):
        if isinstance(value, bool) or not isinstance(value, int):
            ctx.fail(field, 'expected an integer, got %s' % _describe(value))
        if value < self.minimum:
            ctx.fail(field, 'must be at least %d, got %r'
                     % (self.minimum, value))
        return value


class _Bool:
    def parse(self, ctx, value, field):
        if not isinstance(value, bool):
            ctx.fail(field, 'expected true or false, got %s'
                     % _describe(value))
        return value


class _Str:
    def __init__(self, pattern=None, what='a non-empty string',
                 choices=None):
        self.pattern = pattern
        self.what = what
        self.choices = choices

    def parse(self, ctx, value, field):
        if not isinstance(value, str) or not value.strip():
            ctx.fail(field, 'expected %s, got %s' % (self.what,
                                                     _describe(value)))
        if self.choices is not None and value not in self.choices:
            ctx.fail(field, 'must be one of %s, got %s'
                     % (', '.join(self.choices), _describe(value)))
        if self.pattern is not None and not self.pattern.fullmatch(value):
            ctx.fail(field, 'expected %s, got %s' % (self.what,
                                                     _describe(value)))
        return value


class _List:
    """A list of ``item``; ``unique``: no value twice; ``nonempty``."""

    def __init__(self, item, unique=True, nonempty=False):
        self.item = item
        self.unique = unique
        self.nonempty = nonempty

    def parse(self, ctx, value, field):
        if not isinstance(value, list):
            ctx.fail(field, 'expected a list, got %s' % _describe(value))
        if self.nonempty and not value:
            ctx.fail(field, 'must not be empty')
        result = []
        for i, raw in enumerate(value):
            item = self.item.parse(ctx, raw, '%s[%d]' % (field, i))
            if self.unique and item in result:
                ctx.fail(field, '%s listed twice' % _describe(item))
            result.append(item)
        return tuple(result)


class _Map:
    """A mapping of ``key`` to ``value`` (e.g. source id -> citation)."""

    def __init__(self, key, value):
        self.key = key
        self.value = value

    def parse(self, ctx, value, field):
        if not isinstance(value, dict):
            ctx.fail(field, 'expected a mapping, got %s' % _describe(value))
        return {self.key.parse(ctx, k, field):
                self.value.parse(ctx, v, '%s[%s]' % (field, k))
                for k, v in value.items()}


class _Record:
    """A mapping with known fields: ``{field: (schema, default)}``.

    Unknown fields are refused (a misspelt ``max_instance`` would
    otherwise be ignored). Items of a list of records are named by their
    ``name`` field where it is a string, else by position.
    """

    def __init__(self, fields):
        self.fields = fields

    def label(self, value, field, index):
        name = value.get('name') if isinstance(value, dict) else None
        if isinstance(name, str) and NAME_RE.fullmatch(name):
            return '%s[%s]' % (field, name)
        return '%s[%d]' % (field, index)

    def parse(self, ctx, value, field):
        prefix = field + '.' if field else ''
        if not isinstance(value, dict):
            ctx.fail(field, 'expected a mapping, got %s' % _describe(value))
        unknown = sorted(str(k) for k in value if k not in self.fields)
        if unknown:
            ctx.fail(field, 'unknown field(s) %s (known: %s)'
                     % (', '.join(map(repr, unknown)),
                        ', '.join(sorted(self.fields))))
        result = {}
        for name, (schema, default) in self.fields.items():
            if name not in value or value[name] is None and (
                    default is not _REQUIRED):
                if default is _REQUIRED:
                    ctx.fail(prefix + name, 'required field is missing')
                result[name] = default
            else:
                result[name] = schema.parse(ctx, value[name], prefix + name)
        return result


class _Records(_List):
    """A list of records, each named in errors by its ``name``."""

    def parse(self, ctx, value, field):
        if not isinstance(value, list):
            ctx.fail(field, 'expected a list, got %s' % _describe(value))
        if self.nonempty and not value:
            ctx.fail(field, 'must not be empty')
        result = {}
        for i, raw in enumerate(value):
            where = self.item.label(raw, field, i)
            item = self.item.parse(ctx, raw, where)
            if item['name'] in result:
                ctx.fail(where, '%r listed twice' % item['name'])
            result[item['name']] = (where, item)
        return result


_NAME = _Str(NAME_RE, 'a name of letters, digits and . _ + - (starting '
                      'with a letter or digit)')
_POSITIVE = _Int(minimum=1)

MIG_PROFILE = _Record({
    'name': (_NAME, _REQUIRED),
    'compute_slices': (_POSITIVE, _REQUIRED),
    'memory_slices': (_POSITIVE, _REQUIRED),
    'framebuffer_mib': (_POSITIVE, _REQUIRED),
    'max_instances': (_POSITIVE, _REQUIRED),
    'starts': (_List(_Int(minimum=0), nonempty=True), _REQUIRED),
})
MIG_SPEC = _Record({
    'memory_slices': (_POSITIVE, _REQUIRED),
    'compute_slices': (_POSITIVE, _REQUIRED),
    'profiles': (_Records(MIG_PROFILE, nonempty=True), _REQUIRED),
})
VGPU_PROFILE = _Record({
    'name': (_NAME, _REQUIRED),
    # Time-sliced types give both; MIG-backed ones take them from
    # ``mig_profile`` and must not restate them.
    'framebuffer_mib': (_POSITIVE, None),
    'max_instances': (_POSITIVE, None),
    'mig_profile': (_NAME, None),
})
MODEL = _Record({
    'name': (_NAME, _REQUIRED),
    'aliases': (_List(_NAME), ()),
    'architecture': (_NAME, 'unknown'),
    'framebuffer_mib': (_POSITIVE, _REQUIRED),
    'pci_device_ids': (_List(_Str(PCI_ID_RE, 'a PCI device id of 4 hex '
                                             'digits as a quoted string, '
                                             "e.g. '20b0'")), ()),
    'nvml_names': (_List(_Str()), ()),
    'vgpu_mode': (_Str(choices=VGPU_MODES), _REQUIRED),
    'time_sliced_mixing': (_Bool(), False),
    'mixed_size_maxima': (_Map(_NAME, _POSITIVE), None),
    'nvlink': (_Bool(), False),
    'sources': (_List(_Str()), ()),
    'mig': (MIG_SPEC, None),
    'vgpu_profiles': (_Records(VGPU_PROFILE), {}),
})


class _Raw:
    """Any value, checked later (the models, one entry at a time)."""

    def parse(self, ctx, value, field):
        return value


DOCUMENT = _Record({
    'schema_version': (_Int(), _REQUIRED),
    'sources': (_Map(_Str(), _Str()), {}),
    'models': (_List(_Raw(), unique=False), _REQUIRED),
})


def _document(ctx, doc):
    """Parse one YAML document into ``({name: GpuModel}, sources)``."""
    if not isinstance(doc, dict):
        ctx.fail(None, 'top level must be a mapping, got %s'
                 % _describe(doc))
    # The version first: a newer file is "unsupported", not "malformed".
    if 'schema_version' not in doc:
        ctx.fail('schema_version', 'required field is missing')
    version = _Int().parse(ctx, doc['schema_version'], 'schema_version')
    if version != SCHEMA_VERSION:
        ctx.fail('schema_version', 'unsupported version %r (expected %d)'
                 % (version, SCHEMA_VERSION))
    parsed = DOCUMENT.parse(ctx, doc, '')
    sources = parsed['sources']
    models = {}
    for i, raw in enumerate(parsed['models']):
        name = raw.get('name') if isinstance(raw, dict) else None
        ctx.entry = name if isinstance(name, str) else 'models[%d]' % i
        model = _model(ctx, MODEL.parse(ctx, raw, ''), sources)
        if model.name in models:
            ctx.fail('name', 'model defined twice in this file')
        models[model.name] = model
    return models, sources


def _model(ctx, raw, sources):
    for ref in raw['sources']:
        if ref not in sources:
            ctx.fail('sources', 'unknown source %r (this file defines: %s)'
                     % (ref, ', '.join(sorted(sources)) or 'none'))
    mig = _mig(ctx, raw['mig']) if raw['mig'] is not None else None
    profiles = {}
    for name, (where, praw) in raw['vgpu_profiles'].items():
        profiles[name] = _vgpu_profile(ctx, where, praw,
                                       raw['framebuffer_mib'], mig)
    if profiles and raw['vgpu_mode'] == 'none':
        ctx.fail('vgpu_mode', "'none' but vGPU profiles are listed")
    model = GpuModel(
        name=raw['name'], architecture=raw['architecture'],
        framebuffer_mib=raw['framebuffer_mib'], vgpu_mode=raw['vgpu_mode'],
        time_sliced_mixing=raw['time_sliced_mixing'], nvlink=raw['nvlink'],
        vgpu_profiles=profiles, mig=mig,
        pci_device_ids=tuple(d.lower().removeprefix('0x')
                             for d in raw['pci_device_ids']),
        nvml_names=raw['nvml_names'], aliases=raw['aliases'],
        sources=raw['sources'], mixed_size_maxima=raw['mixed_size_maxima'])
    for name, problem in mixed_size.check_model(model):
        ctx.fail('mixed_size_maxima.' + name, problem)
    return model


def _mig(ctx, raw):
    slices = raw['memory_slices']
    compute = raw['compute_slices']
    profiles = {}
    for name, (where, praw) in raw['profiles'].items():
        field = where
        width = praw['memory_slices']
        for start in praw['starts']:
            if start + width > slices:
                ctx.fail(field + '.starts',
                         'start %r does not fit %d of %d slices'
                         % (start, width, slices))
        if praw['compute_slices'] > compute:
            ctx.fail(field + '.compute_slices',
                     'more than the GPU has (%d)' % compute)
        if praw['max_instances'] > len(praw['starts']):
            ctx.fail(field + '.max_instances',
                     '%d instances but only %d start slices'
                     % (praw['max_instances'], len(praw['starts'])))
        profiles[name] = MigProfile(
            name=name, compute_slices=praw['compute_slices'],
            memory_slices=width, framebuffer_mib=praw['framebuffer_mib'],
            max_instances=praw['max_instances'], starts=praw['starts'])
    return MigSpec(slices, compute, profiles)


def _vgpu_profile(ctx, field, raw, framebuffer, mig):
    name = raw['name']
    mig_name = raw['mig_profile']
    if mig_name is not None:
        if mig is None or mig_name not in mig.profiles:
            ctx.fail(field + '.mig_profile',
                     'MIG profile %r is not defined for this model'
                     % mig_name)
        for sized in ('framebuffer_mib', 'max_instances'):
            if raw[sized] is not None:
                ctx.fail(field + '.' + sized, 'a MIG-backed type takes it '
                         'from its MIG profile; remove it')
        backing = mig.profiles[mig_name]
        return VgpuProfile(name, backing.framebuffer_mib,
                           backing.max_instances, mig_name)
    for sized in ('framebuffer_mib', 'max_instances'):
        if raw[sized] is None:
            ctx.fail(field + '.' + sized, 'required field is missing '
                     '(or give mig_profile for a MIG-backed type)')
    size, count = raw['framebuffer_mib'], raw['max_instances']
    if size * count > framebuffer:
        ctx.fail(field, '%d instances of %d MiB exceed the %d MiB '
                 'framebuffer' % (count, size, framebuffer))
    return VgpuProfile(name, size, count)
