"""The shape of a host GPU report, as a JSON Schema (Draft 2020-12).

``nova_gpu.core.report`` validates a report's shape here (types, ranges,
required keys, string bounds, PCI addresses, list lengths) and checks in
code only what a schema cannot say: the catalog (models, vGPU types, MIG
profiles), duplicates across entries, the totals over all GPUs and
cross-references. ``first_error`` answers the first fault as (field path,
problem), with the path written as the parser writes it
(``gpus[0].providers[1].name``).

To add a field, add its schema to ``_PROPERTIES`` (top level) or to the
object that holds it. Keys no schema names are accepted (later versions
and the agent's diagnostics add some). A subschema may carry ``problems``
(keyword -> message, ``{value}`` the value found) where the generic
sentence of that keyword would not say what is wrong.
"""

import hashlib
import json
import math
import re
import threading

import cachetools
import jsonschema

from nova_gpu.core import drivers as drivers_mod
from nova_gpu.core import health as health_mod
from nova_gpu.core import host as host_mod
from nova_gpu.core import partitions as partitions_mod
from nova_gpu.core import rdma as rdma_mod

# -- bounds: a report is untrusted input (see report.py) --

MAX_GENERATION = 2 ** 53 - 1   # exact in JSON doubles; ms since 1970 fit
MAX_NAME = 255                 # Placement's limit for names and classes
MAX_GPUS = 64
MAX_CELLS = 64
MAX_DEVICES = 4096             # per GPU
MAX_PROVIDERS = 512            # per GPU (a PF has at most 256 VFs)
MAX_LIST = 512                 # vgpu_types, vfs, nvlink_peers
MAX_QUANTITY = 2 ** 53 - 1     # cpu_milli, memory_mib
MAX_NUMA_ID = MAX_CELLS * 16

# The provider kinds of report.py (``report.PF_MDEV`` and the others).
PROVIDER_KINDS = ('pf_mdev', 'vf_mdev', 'pci_pool', 'pci_device')
SUPPORTED_VERSIONS = (1, 2)

_PCI_ADDRESS = re.compile(
    r'[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]')
_RESOURCE_CLASS = re.compile(r'[A-Z0-9_]+')

# Formats: matched in full (a JSON Schema ``pattern`` is searched, and
# Python's ``$`` lets a trailing newline through). '' passes: minLength
# says whether a field may be empty.
_FORMATS = jsonschema.FormatChecker(())
_WHAT = {'pci-address': 'PCI address', 'resource-class': 'resource class'}


@_FORMATS.checks('pci-address')
def _pci_address(value):
    return not isinstance(value, str) or not value or bool(
        _PCI_ADDRESS.fullmatch(value))


@_FORMATS.checks('resource-class')
def _resource_class(value):
    return not isinstance(value, str) or not value or bool(
        _RESOURCE_CLASS.fullmatch(value))


# -- the pieces --

def _integer(high=MAX_QUANTITY, low=0):
    return {'type': 'integer', 'minimum': low, 'maximum': high}


def _string(empty=False, **extra):
    schema = {'type': 'string', 'maxLength': MAX_NAME}
    if not empty:
        schema['minLength'] = 1
    schema.update(extra)
    return schema


def _null_or(schema):
    """``schema``, or null (JSON null reads as absent)."""
    types = schema['type']
    return dict(schema, type=[types, 'null'])


def _array(items, limit=MAX_LIST, **extra):
    return dict({'type': 'array', 'maxItems': limit, 'items': items},
                **extra)


def _fixed(problem):
    """``problems`` of a list of a fixed length."""
    return dict.fromkeys(('minItems', 'maxItems', 'items'), problem)


_ADDRESS = _string(format='pci-address')
_BOOLEAN = {'type': 'boolean'}
_MIG_SLOT = [_string(), _integer(MAX_LIST)]  # profile, start slice

_CELL = {
    'type': 'object',
    'required': ['id'],
    'properties': {'id': _integer(MAX_NUMA_ID), 'cpu_milli': _integer(),
                   'memory_mib': _integer()},
}

_HEALTH = {
    'type': ['object', 'null'],
    'properties': {'quarantined': _BOOLEAN},
    # Only a quarantined GPU's reason and faults are read.
    'if': {'required': ['quarantined'],
           'properties': {'quarantined': {'const': True}}},
    'then': {'properties': {
        'reason': _null_or(_string()),
        'faults': _null_or(_array({'type': 'object'},
                                  health_mod.MAX_FAULTS))}},
}


def _detail(kind, schema):
    return {'if': {'required': ['kind'],
                   'properties': {'kind': {'const': kind}}},
            'then': {'required': ['detail'],
                     'properties': {'detail': schema}}}


_DEVICE = {
    'type': 'object',
    'required': ['kind'],
    'properties': {
        'kind': {'enum': list(host_mod.KINDS)},
        # instance: the Nova instance (libvirt domain UUID) holding it
        'uuid': _null_or(_string()), 'vf': _null_or(_string()),
        'instance': _null_or(_string()),
    },
    'allOf': [
        _detail(host_mod.SHARE, _integer(host_mod.MILLI, low=1)),
        _detail(host_mod.VGPU, _string()),
        _detail(host_mod.MIG, _array(
            False, prefixItems=_MIG_SLOT + [_null_or(_string())],
            minItems=3, maxItems=3, problems=_fixed(
                'must be [MIG profile, start slice, vGPU type or null]'))),
    ],
}

_PROVIDER = {
    'type': 'object',
    'required': ['name', 'kind', 'address'],
    'properties': {
        'name': _string(),
        'kind': {'enum': list(PROVIDER_KINDS)},
        'address': _ADDRESS,
        'resource_class': _string(format='resource-class'),
        'vgpu_type': _null_or(_string()),
        'vfs': _null_or(_array(_ADDRESS)),
        'mig': {'type': ['array', 'null'], 'maxItems': 2, 'minItems': 2,
                'prefixItems': _MIG_SLOT, 'items': False,
                'problems': _fixed('must be [MIG profile, start slice] or '
                                   'null')},
    },
}


def _gpu(version):
    properties = {
        'index': _integer(MAX_GPUS - 1),
        'model': _string(),
        'address': _null_or(_string(empty=True, format='pci-address')),
        'numa_node': _null_or(_integer(MAX_NUMA_ID)),
        'pcie_switch': _null_or(_string(empty=True)),
        'nvlink_peers': _null_or(_array(
            _integer(MAX_GPUS - 1), uniqueItems=True,
            problems={'uniqueItems': 'a peer is listed twice'})),
        'mig_enabled': _BOOLEAN,
        # NVIDIA's mixed-size vGPU mode is on (core.mixed_size).
        'mixed_size': _BOOLEAN,
        'vgpu_types': _null_or(_array(
            _string(), uniqueItems=True,
            problems={'uniqueItems': 'a type is listed twice'})),
        'health': _HEALTH,
        'devices': _null_or(_array(_DEVICE, MAX_DEVICES)),
    }
    schema = {'type': 'object', 'required': ['index', 'model'],
              'properties': properties}
    # Version 1 has one ``provider`` name, and so has a version 2 GPU
    # entry without ``providers``; the other key is not read.
    provider = {'properties': {'provider': _null_or(_string())}}
    if version == 1:
        schema.update(provider)
    else:
        schema.update({'if': {'required': ['providers']}, 'then': {
            'properties': {'providers': _null_or(
                _array(_PROVIDER, MAX_PROVIDERS))}}, 'else': provider})
    return schema


_LEFT_OUT = {
    'type': 'object',
    'required': ['address', 'reason'],
    'properties': {
        'address': _ADDRESS, 'reason': _string(),
        'providers': _null_or(_array(_string(), MAX_PROVIDERS)),
    },
}

_NVIDIA = {
    'type': ['object', 'null'],
    'required': ['driver_version'],
    'properties': {
        'driver_version': _string(),
        'guest_driver_branches': _null_or(_array(_string())),
        'vgpu_version_range': _null_or(_array(
            _integer(drivers_mod.MAX_VGPU_VERSION), minItems=2, maxItems=2,
            problems=_fixed('must be [min, max]'))),
    },
}

# An NVSwitch partition (Shared NVSwitch mode, ``core.partitions``); its
# GPUs against the report's and the table as a whole are checked in code.
_PARTITION = {
    'type': 'object',
    'required': ['id', 'gpus'],
    'properties': {
        'id': _integer(partitions_mod.MAX_PARTITIONS - 1),
        'gpus': _array(_integer(MAX_GPUS - 1), MAX_GPUS, uniqueItems=True,
                       problems={'uniqueItems': 'a GPU is listed twice'}),
        'supported': _BOOLEAN,
        'active': _BOOLEAN,
    },
}

# The PCIe tree for GPUDirect RDMA pairing (``core.rdma``); switches
# named by their upstream port's address, root complexes by their host
# bridge (``pci0000:15``). Cross-references (a GPU's or NIC's switch among
# the switches, VFs used within VFs) are checked in code.
_ROOT = _string(empty=True)
_DEVICE_ID = _string(maxLength=9, pattern='^[0-9a-f]{4}:[0-9a-f]{4}$',
                     problems=dict.fromkeys(
                         ('pattern', 'maxLength'), 'must be vendor:device '
                         'in lower-case hex, e.g. 15b3:1021, got {value}'))
_PCIE = {
    'type': ['object', 'null'],
    'required': ['gpus'],
    'properties': {
        'gpus': _array({
            'type': 'object', 'required': ['index'],
            'properties': {'index': _integer(MAX_GPUS - 1),
                           'switch': _null_or(_ADDRESS),
                           'root': _null_or(_ROOT)}}, MAX_GPUS),
        'switches': _null_or(_array({
            'type': 'object', 'required': ['id'],
            'properties': {'id': _ADDRESS, 'root': _null_or(_ROOT),
                           'acs_redirect': _null_or(_BOOLEAN),
                           'device': _null_or(_DEVICE_ID)}},
            rdma_mod.MAX_SWITCHES)),
        'nics': _null_or(_array({
            'type': 'object', 'required': ['address'],
            'properties': {'address': _ADDRESS,
                           'switch': _null_or(_ADDRESS),
                           'root': _null_or(_ROOT),
                           'vfs': _integer(rdma_mod.MAX_VFS),
                           'vfs_used': _integer(rdma_mod.MAX_VFS),
                           'provider': _null_or(_string()),
                           'device': _null_or(_DEVICE_ID)}},
            rdma_mod.MAX_NICS)),
    },
}

# What a report says of itself: read alone first (``report.parse_header``).
HEADER = {
    'type': 'object',
    'properties': {
        'version': {'enum': list(SUPPORTED_VERSIONS), 'problems': {
            'enum': 'unsupported version {value} (this scheduler reads %s)'
                    % ', '.join(map(str, SUPPORTED_VERSIONS))}},
        'host': _string(),
        'nodename': _null_or(_string()),
        'generation': _integer(MAX_GENERATION),
        'boot_id': _null_or(_string()),
    },
    # After the fields: a bad version is named before a missing host.
    'required': ['version', 'host', 'generation'],
}

# What the size check reads (``report._Parser.size``), before the rest.
LISTS = {
    'type': 'object',
    'required': ['gpus'],
    'properties': {'gpus': {'type': 'array', 'maxItems': MAX_GPUS}},
}


def _report(gpu):
    properties = dict(HEADER['properties'], **{
        'cpu_milli': _integer(),
        'memory_mib': _integer(),
        'numa_cells': _null_or(_array(_CELL, MAX_CELLS)),
        'gpus': _array(gpu, MAX_GPUS),
        'nvidia': _NVIDIA,
        'left_out': _null_or(_array(_LEFT_OUT, MAX_GPUS)),
        'partitions': _null_or(_array(_PARTITION,
                                      partitions_mod.MAX_PARTITIONS)),
        'pcie': _PCIE,
    })
    return {'$schema': 'https://json-schema.org/draft/2020-12/schema',
            'type': 'object', 'required': ['gpus'],
            'properties': properties}


# A GPU entry and the whole report, per version.
GPUS = {v: _gpu(v) for v in SUPPORTED_VERSIONS}
REPORTS = {v: _report(GPUS[v]) for v in SUPPORTED_VERSIONS}
# The report but its GPU entries' insides (``report_error``).
_OUTER = _report({'type': 'object'})

# -- validating --


def _strict_integer(checker, value):
    # JSON Schema takes 1.0 for an integer; a count or an index is not,
    # nor is a boolean.
    return isinstance(value, int) and not isinstance(value, bool)


_Validator = jsonschema.validators.extend(
    jsonschema.Draft202012Validator,
    type_checker=jsonschema.Draft202012Validator.TYPE_CHECKER.redefine(
        'integer', _strict_integer))
_VALIDATORS = {}

_TYPE_NAMES = {'integer': 'an integer', 'string': 'a string',
               'array': 'a list', 'object': 'an object',
               'boolean': 'true or false', 'null': 'null'}


def _shown(value):
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + '...'


def path(parts):
    """A field path as the parser writes it: ``gpus[0].providers``."""
    text = ''
    for part in parts:
        text += '[%d]' % part if isinstance(part, int) else (
            '.%s' % part if text else part)
    return text or 'report'


def _problem(error):
    """The sentence of one jsonschema error."""
    keyword, value, schema = error.validator, error.instance, error.schema
    if keyword == 'type':
        if isinstance(value, float) and not math.isfinite(value) and (
                'integer' in schema['type']):
            return 'must be a finite integer, got %s' % value
        wanted = schema['type']
        wanted = [wanted] if isinstance(wanted, str) else wanted
        return 'must be %s, got %s' % (' or '.join(
            _TYPE_NAMES[t] for t in wanted), type(value).__name__)
    if keyword in schema.get('problems', ()):
        return schema['problems'][keyword].format(value=_shown(value))
    if keyword == 'required':
        return 'missing'
    if keyword in ('minimum', 'maximum'):
        return 'must be in %d..%d, got %s' % (
            schema['minimum'], schema['maximum'], _shown(value))
    if keyword == 'maxLength':
        return 'longer than %d characters' % error.validator_value
    if keyword == 'minLength':
        return 'must not be empty'
    if keyword == 'maxItems':
        return 'more than %d entries' % error.validator_value
    if keyword == 'enum':
        return 'must be one of %s, got %s' % (
            ', '.join(map(str, error.validator_value)), _shown(value))
    if keyword == 'format':
        return 'not a valid %s: %s' % (_WHAT[error.validator_value],
                                       _shown(value))
    return error.message


def first_error(data, schema):
    """The first fault of ``data`` against ``schema`` (one of this
    module's): (field path, problem), or None when it has none.
    """
    fault = _first(data, schema)
    return None if fault is None else (path(fault[0]), fault[1])


# Digests of GPU entries found valid: an agent sends the same entries
# cycle after cycle (devices change when guests come and go), and walking
# them again costs what jsonschema costs (about 0.2 s for the largest
# real host, 16 GPUs of 66 providers).
_VALID_GPUS = cachetools.LRUCache(maxsize=16384)
_VALID_LOCK = threading.Lock()


def _digest(version, raw):
    try:
        text = json.dumps(raw, sort_keys=True, allow_nan=True)
    except (TypeError, ValueError):  # not JSON (in-process callers)
        return None
    return hashlib.sha256(b'%d:%s' % (version, text.encode(
        'utf-8', 'surrogatepass'))).digest()


def report_error(data, version):
    """The first fault of a whole report of ``version`` against
    ``REPORTS[version]``, as ``first_error`` answers it; a GPU entry
    found valid before is not walked again.
    """
    fault = first_error(data, _OUTER)
    if fault is not None:
        return fault
    for n, raw in enumerate(data['gpus']):
        digest = _digest(version, raw)
        with _VALID_LOCK:
            if digest is not None and digest in _VALID_GPUS:
                continue
        fault = _first(raw, GPUS[version])
        if fault is not None:
            return path(['gpus', n] + fault[0]), fault[1]
        if digest is not None:
            with _VALID_LOCK:
                _VALID_GPUS[digest] = True
    return None


def _first(data, schema):
    # Keyed by the schema's id, holding the schema: the id stays its own.
    _schema, validator = _VALIDATORS.get(id(schema), (None, None))
    if validator is None:
        validator = _Validator(schema, format_checker=_FORMATS)
        _VALIDATORS[id(schema)] = (schema, validator)
    error = next(validator.iter_errors(data), None)
    if error is None:
        return None
    parts = list(error.absolute_path)
    if error.validator == 'required':
        # The error is the object's; name the key that is missing.
        parts.append(next(k for k in error.validator_value
                          if k not in error.instance))
    return parts, _problem(error)
