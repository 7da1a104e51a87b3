"""The GPU catalog: models, vGPU profiles and MIG placement rules as data.

The catalog ships as ``data/gpu_catalog.yaml`` and operators can add or
override models with their own files (``[gpu] catalog_files``). Every file
is validated on load; errors name the file, the entry and the field.
"""

import dataclasses
import os

import yaml

from nova_gpu.core import exceptions

DEFAULT_CATALOG = os.path.join(os.path.dirname(__file__), 'data',
                               'gpu_catalog.yaml')
SCHEMA_VERSION = 1
VGPU_MODES = ('mdev', 'sriov', 'none')


@dataclasses.dataclass(frozen=True)
class MigProfile:
    """A GPU instance profile and where NVIDIA allows it on one GPU."""

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
    """An NVIDIA vGPU type; MIG-backed when ``mig_profile`` is set."""

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

    A model defined again in a later file replaces the earlier definition,
    so operators can correct or extend the shipped data.
    """
    models, sources = {}, {}
    for path in [DEFAULT_CATALOG] + list(paths or ()):
        file_models, file_sources = _load_file(path)
        sources.update(file_sources)
        models.update(file_models)
    return Catalog(models, sources)


def _load_file(path):
    try:
        with open(path, encoding='utf-8') as f:
            doc = yaml.safe_load(f)
    except OSError as e:
        raise exceptions.CatalogError(path, None, None,
                                      'cannot read: %s' % e) from e
    except yaml.YAMLError as e:
        raise exceptions.CatalogError(path, None, None,
                                      'not valid YAML: %s' % e) from e
    return _Validator(path).document(doc)


class _Validator:
    """Turns one parsed YAML document into model objects, or says why not."""

    def __init__(self, path):
        self.path = path
        self.entry = None

    def fail(self, field, problem):
        raise exceptions.CatalogError(self.path, self.entry, field, problem)

    def get(self, mapping, field, kind, default=dataclasses.MISSING,
            minimum=None):
        if field not in mapping:
            if default is dataclasses.MISSING:
                self.fail(field, 'required field is missing')
            return default
        value = mapping[field]
        if kind is int and isinstance(value, bool) or not isinstance(
                value, kind):
            names = kind.__name__ if isinstance(kind, type) else '/'.join(
                k.__name__ for k in kind)
            self.fail(field, 'expected %s, got %r' % (names, value))
        if minimum is not None and value < minimum:
            self.fail(field, 'must be at least %d, got %r' % (minimum, value))
        return value

    def document(self, doc):
        if not isinstance(doc, dict):
            self.fail(None, 'top level must be a mapping')
        version = self.get(doc, 'schema_version', int)
        if version != SCHEMA_VERSION:
            self.fail('schema_version', 'unsupported version %r (expected %d)'
                      % (version, SCHEMA_VERSION))
        sources = self.get(doc, 'sources', dict, {})
        entries = self.get(doc, 'models', list)
        models = {}
        for raw in entries:
            self.entry = raw.get('name') if isinstance(raw, dict) else raw
            model = self.model(raw, sources)
            if model.name in models:
                self.fail('name', 'model defined twice in this file')
            models[model.name] = model
        return models, sources

    def model(self, raw, sources):
        if not isinstance(raw, dict):
            self.fail(None, 'each model must be a mapping')
        name = self.get(raw, 'name', str)
        framebuffer = self.get(raw, 'framebuffer_mib', int, minimum=1)
        mode = self.get(raw, 'vgpu_mode', str)
        if mode not in VGPU_MODES:
            self.fail('vgpu_mode', 'must be one of %s, got %r'
                      % (', '.join(VGPU_MODES), mode))
        cited = tuple(self.get(raw, 'sources', list, []))
        for ref in cited:
            if ref not in sources:
                self.fail('sources', 'unknown source %r' % ref)
        mig = self.mig(raw['mig']) if raw.get('mig') is not None else None
        profiles = {}
        for praw in self.get(raw, 'vgpu_profiles', list, []):
            profile = self.vgpu_profile(praw, framebuffer, mig)
            if profile.name in profiles:
                self.fail('vgpu_profiles',
                          'profile %r listed twice' % profile.name)
            profiles[profile.name] = profile
        if profiles and mode == 'none':
            self.fail('vgpu_mode', "'none' but vGPU profiles are listed")
        return GpuModel(
            name=name,
            architecture=self.get(raw, 'architecture', str, 'unknown'),
            framebuffer_mib=framebuffer,
            vgpu_mode=mode,
            time_sliced_mixing=self.get(raw, 'time_sliced_mixing', bool,
                                        False),
            nvlink=self.get(raw, 'nvlink', bool, False),
            vgpu_profiles=profiles, mig=mig,
            pci_device_ids=tuple(str(d).lower().removeprefix('0x') for d in
                                 self.get(raw, 'pci_device_ids', list, [])),
            nvml_names=tuple(self.get(raw, 'nvml_names', list, [])),
            aliases=tuple(self.get(raw, 'aliases', list, [])),
            sources=cited)

    def mig(self, raw):
        if not isinstance(raw, dict):
            self.fail('mig', 'must be a mapping')
        slices = self.get(raw, 'memory_slices', int, minimum=1)
        compute = self.get(raw, 'compute_slices', int, minimum=1)
        profiles = {}
        for praw in self.get(raw, 'profiles', list):
            if not isinstance(praw, dict):
                self.fail('mig.profiles', 'each profile must be a mapping')
            pname = self.get(praw, 'name', str)
            field = 'mig.profiles[%s]' % pname
            width = self._sub(praw, field, 'memory_slices', int, 1)
            starts = tuple(self._sub(praw, field, 'starts', list, None))
            for start in starts:
                if (not isinstance(start, int) or start < 0
                        or start + width > slices):
                    self.fail(field + '.starts',
                              'start %r does not fit %d of %d slices'
                              % (start, width, slices))
            profile = MigProfile(
                name=pname,
                compute_slices=self._sub(praw, field, 'compute_slices', int,
                                         1),
                memory_slices=width,
                framebuffer_mib=self._sub(praw, field, 'framebuffer_mib',
                                          int, 1),
                max_instances=self._sub(praw, field, 'max_instances', int,
                                        1),
                starts=starts)
            if profile.compute_slices > compute:
                self.fail(field + '.compute_slices',
                          'more than the GPU has (%d)' % compute)
            if pname in profiles:
                self.fail(field, 'MIG profile listed twice')
            profiles[pname] = profile
        return MigSpec(slices, compute, profiles)

    def vgpu_profile(self, raw, framebuffer, mig):
        if not isinstance(raw, dict):
            self.fail('vgpu_profiles', 'each profile must be a mapping')
        pname = self.get(raw, 'name', str)
        field = 'vgpu_profiles[%s]' % pname
        mig_name = raw.get('mig_profile')
        if mig_name is not None:
            if mig is None or mig_name not in mig.profiles:
                self.fail(field + '.mig_profile',
                          'MIG profile %r is not defined for this model'
                          % mig_name)
            backing = mig.profiles[mig_name]
            return VgpuProfile(pname, backing.framebuffer_mib,
                               backing.max_instances, mig_name)
        size = self._sub(raw, field, 'framebuffer_mib', int, 1)
        count = self._sub(raw, field, 'max_instances', int, 1)
        if size * count > framebuffer:
            self.fail(field, '%d instances of %d MiB exceed the %d MiB '
                      'framebuffer' % (count, size, framebuffer))
        return VgpuProfile(pname, size, count)

    def _sub(self, raw, prefix, field, kind, minimum):
        try:
            return self.get(raw, field, kind, minimum=minimum)
        except exceptions.CatalogError as e:
            raise exceptions.CatalogError(self.path, self.entry,
                                          '%s.%s' % (prefix, field),
                                          e.problem) from None
