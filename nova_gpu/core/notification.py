"""Versioned notifications of nova-gpu: the payloads and their wire form.

Other tools follow nova-gpu's decisions through these notifications, sent
with oslo.messaging (``messagingv2``) next to the host reports, on the
report topic (``[gpu_scheduler] report_topic``, ``.info``). Each payload is
serialised as Nova serialises its versioned notification payloads
(nova/notifications/objects, oslo.versionedobjects primitives)::

    {"nova_object.name": "GpuRefusalPayload",
     "nova_object.namespace": "nova_gpu",
     "nova_object.version": "1.0",
     "nova_object.data": {...the fields...}}

so that a consumer written for Nova's notifications reads them unchanged.
Versioning follows the same rule: a new optional field bumps the minor
version, a change to an existing field the major one; a reader accepts
any minor version of the major versions it knows and ignores fields it
does not know. This module holds the contract once (no OpenStack import);
the scheduler and agent send, the exporter and others read.

Event types (``<object>.<action>``, as Nova's):

* ``gpu.schedule.refusal`` (scheduler, once per request the GPU filter
  ran): how many hosts the filter refused for each reason
  (``REFUSAL_REASONS``) and how many passed;
* ``gpu.placement.decided`` (scheduler): the host and the physical GPUs
  (and slots) chosen for an instance, and the fragmentation it adds;
* ``gpu.device.change`` (agent): a device created, removed or rolled back
  on a host, with the instance it serves;
* ``gpu.demand.updated`` (scheduler, on its own topic ``DEMAND_TOPIC``,
  at most every ``[gpu_scheduler] demand_publish_interval`` seconds):
  the windowed demand distribution
  the fragmentation measure uses, which the agents' layout planners carve
  to (``DemandPayload``; ``demand_to_items`` / ``demand_from_items``
  convert it from and to ``core.fragmentation.Demand``).
"""

import dataclasses

from nova_gpu.core import exceptions
from nova_gpu.core import fragmentation
from nova_gpu.core import request as request_mod

NAMESPACE = 'nova_gpu'
REFUSAL_EVENT = 'gpu.schedule.refusal'
PLACEMENT_EVENT = 'gpu.placement.decided'
DEVICE_EVENT = 'gpu.device.change'
DEMAND_EVENT = 'gpu.demand.updated'
# The demand goes on a topic of its own: every agent listens to it in a
# pool of its own, and must not receive every other host's reports.
DEMAND_TOPIC = 'nova_gpu_demand'
EVENT_TYPES = (REFUSAL_EVENT, PLACEMENT_EVENT, DEVICE_EVENT, DEMAND_EVENT)
# Demand items one payload may carry (the scheduler keeps 16 observed
# requests plus the typical ones and a whole GPU).
MAX_DEMAND_ITEMS = 256

# Why the GPU filter refused a host (label values: keep the set small).
NO_REPORT = 'no_report'          # the host's agent never reported
STALE_REPORT = 'stale_report'    # its report is too old to trust
NO_GPU_FITS = 'no_gpu_fits'      # too few GPUs can take the device
GPU_MODEL = 'gpu_model'          # no GPU of an allowed model
TOPOLOGY = 'topology'            # no GPU set with the NVLink/NUMA asked
CPU_MEMORY = 'cpu_memory'        # not enough CPU or memory beside the GPUs
DRIVER = 'driver'                # guest driver / vGPU version mismatch
INVALID_REQUEST = 'invalid_request'
OTHER = 'other'
REFUSAL_REASONS = (NO_REPORT, STALE_REPORT, NO_GPU_FITS, GPU_MODEL,
                   TOPOLOGY, CPU_MEMORY, DRIVER, INVALID_REQUEST, OTHER)

DEVICE_ACTIONS = ('create', 'remove', 'rollback')

MAX_COUNT = 2 ** 31


def reason_of(why):
    """The ``REFUSAL_REASONS`` code of an ``engine.why_not`` sentence."""
    text = (why or '').lower()
    for words, code in (
            (('cpu milli', 'mib memory', 'numa node can hold'), CPU_MEMORY),
            (('no gpu of model',), GPU_MODEL),
            # gpu:rdma: no GPU-NIC pair in one PCIe switch (core.rdma).
            (('topology=', 'nic vf', 'rdma nic', 'pcie tree'), TOPOLOGY),
            (('gpus can take', 'full with the earlier instances'),
             NO_GPU_FITS),
            (('driver', 'vgpu version'), DRIVER),
            (('no gpu report', 'not reported'), NO_REPORT),
            (('stale',), STALE_REPORT)):
        if any(w in text for w in words):
            return code
    return OTHER


class PayloadError(exceptions.InvalidRequest):
    """A notification payload does not match its schema."""


def _check_str(value, field, optional=False):
    if value is None and optional:
        return None
    if not isinstance(value, str) or len(value) > 255:
        raise PayloadError('%s must be a string (at most 255 characters)'
                           % field)
    return value


def _check_count(value, field):
    if isinstance(value, bool) or not isinstance(value, int) or \
            not 0 <= value < MAX_COUNT:
        raise PayloadError('%s must be an integer >= 0, got %r'
                           % (field, value))
    return value


@dataclasses.dataclass(frozen=True)
class Payload:
    """Base of the versioned payloads: their Nova-style primitive form."""

    NAME = None
    VERSION = '1.0'

    def to_primitive(self):
        return {'nova_object.name': self.NAME,
                'nova_object.namespace': NAMESPACE,
                'nova_object.version': self.VERSION,
                'nova_object.data': dataclasses.asdict(self)}

    @classmethod
    def from_primitive(cls, primitive):
        """Read a payload; raises PayloadError naming what is wrong."""
        if not isinstance(primitive, dict):
            raise PayloadError('payload must be an object')
        name = primitive.get('nova_object.name')
        if name != cls.NAME or \
                primitive.get('nova_object.namespace') != NAMESPACE:
            raise PayloadError('payload is %r, expected %s.%s' % (
                name, NAMESPACE, cls.NAME))
        version = str(primitive.get('nova_object.version', ''))
        if version.partition('.')[0] != cls.VERSION.partition('.')[0]:
            raise PayloadError('%s version %s is not readable (this reads '
                               '%s.x)' % (cls.NAME, version,
                                          cls.VERSION.partition('.')[0]))
        data = primitive.get('nova_object.data')
        if not isinstance(data, dict):
            raise PayloadError('%s: nova_object.data must be an object'
                               % cls.NAME)
        known = {f.name for f in dataclasses.fields(cls)}
        try:
            payload = cls(**{k: v for k, v in data.items() if k in known})
        except TypeError as e:
            raise PayloadError('%s: %s' % (cls.NAME, e)) from e
        payload.check()
        return payload

    def check(self):
        pass


@dataclasses.dataclass(frozen=True)
class RefusalPayload(Payload):
    """What the GPU filter did with one scheduling request."""

    NAME = 'GpuRefusalPayload'

    refusals: dict          # reason code -> hosts refused for it
    hosts_passed: int = 0
    instance_uuid: str = None
    request: str = None     # the GPU request, e.g. "vgpu A100-3-20C x1"

    def check(self):
        if not isinstance(self.refusals, dict):
            raise PayloadError('refusals must be an object')
        for reason, count in self.refusals.items():
            if reason not in REFUSAL_REASONS:
                raise PayloadError('unknown refusal reason %r (known: %s)'
                                   % (reason, ', '.join(REFUSAL_REASONS)))
            _check_count(count, 'refusals.%s' % reason)
        _check_count(self.hosts_passed, 'hosts_passed')
        _check_str(self.instance_uuid, 'instance_uuid', optional=True)
        _check_str(self.request, 'request', optional=True)


@dataclasses.dataclass(frozen=True)
class PlacementPayload(Payload):
    """Where the scheduler placed an instance's GPU devices."""

    NAME = 'GpuPlacementPayload'

    host: str
    gpus: list              # physical GPU indices on the host
    slots: list = ()        # [gpu, kind, detail] of each device
    instance_uuid: str = None
    request: str = None
    fragmentation_delta: float = 0.0   # GPUs of expected fragmentation

    def check(self):
        _check_str(self.host, 'host')
        if not isinstance(self.gpus, (list, tuple)):
            raise PayloadError('gpus must be a list')
        for g in self.gpus:
            _check_count(g, 'gpus[]')
        _check_str(self.instance_uuid, 'instance_uuid', optional=True)
        if not isinstance(self.fragmentation_delta, (int, float)):
            raise PayloadError('fragmentation_delta must be a number')


@dataclasses.dataclass(frozen=True)
class DevicePayload(Payload):
    """A GPU device the agent made, removed or rolled back."""

    NAME = 'GpuDevicePayload'

    host: str
    action: str             # DEVICE_ACTIONS
    kind: str               # vgpu, mig, passthrough
    device: str             # mdev UUID, VF address, GPU/mig@start
    gpu_address: str = None
    profile: str = None
    instance_uuid: str = None

    def check(self):
        _check_str(self.host, 'host')
        if self.action not in DEVICE_ACTIONS:
            raise PayloadError('action must be one of %s'
                               % ', '.join(DEVICE_ACTIONS))
        _check_str(self.kind, 'kind')
        _check_str(self.device, 'device')
        for f in ('gpu_address', 'profile', 'instance_uuid'):
            _check_str(getattr(self, f), f, optional=True)


# GpuRequest fields a demand item carries (the device part only).
_REQUEST_FIELDS = ('kind', 'profile', 'count', 'milli', 'models')


def _request_to_dict(req):
    return {'kind': req.kind, 'profile': req.profile, 'count': req.count,
            'milli': req.milli,
            'models': sorted(req.models) if req.models is not None
            else None}


def _request_from_dict(data, path):
    if not isinstance(data, dict):
        raise PayloadError('%s must be an object' % path)
    known = {k: data[k] for k in _REQUEST_FIELDS if data.get(k) is not None}
    if 'kind' not in known:
        raise PayloadError('%s.kind is missing' % path)
    _check_str(known['kind'], path + '.kind')
    _check_str(known.get('profile'), path + '.profile', optional=True)
    for field in ('count', 'milli'):
        if field in known:
            _check_count(known[field], '%s.%s' % (path, field))
    models = known.get('models')
    if models is not None:
        if not isinstance(models, list) or len(models) > MAX_DEMAND_ITEMS:
            raise PayloadError('%s.models must be a list of model names'
                               % path)
        for m in models:
            _check_str(m, path + '.models[]')
    try:
        return request_mod.GpuRequest(**known)
    except (exceptions.InvalidRequest, TypeError) as e:
        raise PayloadError('%s: %s' % (path, e)) from None


def demand_to_items(demand):
    """``[[request, weight], ...]`` of a ``fragmentation.Demand``."""
    return [[_request_to_dict(i.request), float(i.weight)]
            for i in demand.items if i.request is not None]


def demand_from_items(items):
    """The ``fragmentation.Demand`` of a payload's ``items``."""
    return fragmentation.Demand([
        fragmentation.DemandItem(_request_from_dict(req, 'items[%d]' % k),
                                 weight)
        for k, (req, weight) in enumerate(items)])


@dataclasses.dataclass(frozen=True)
class DemandPayload(Payload):
    """The demand distribution a scheduler measures (its window).

    ``items``: ``[request, weight]`` pairs; a request is ``{"kind",
    "profile", "count", "milli", "models"}`` (``core.request.GpuRequest``'s
    device part), weights are shares (they need not sum to 1).
    ``version`` increases with every rebuild of that scheduler's window;
    ``requests`` is how many requests the window holds (0: only the
    operator's typical requests and the whole GPU).
    """

    NAME = 'GpuDemandPayload'

    items: list
    publisher: str = None
    version: int = 0
    requests: int = 0

    def check(self):
        if not isinstance(self.items, (list, tuple)) or \
                len(self.items) > MAX_DEMAND_ITEMS:
            raise PayloadError('items must be a list of at most %d '
                               '[request, weight] pairs' % MAX_DEMAND_ITEMS)
        for k, item in enumerate(self.items):
            if not isinstance(item, (list, tuple)) or len(item) != 2:
                raise PayloadError('items[%d] must be [request, weight]'
                                   % k)
            weight = item[1]
            if isinstance(weight, bool) or \
                    not isinstance(weight, (int, float)) or \
                    not 0 <= weight < float(MAX_COUNT) or weight != weight:
                raise PayloadError('items[%d] weight must be a number >= 0,'
                                   ' got %r' % (k, weight))
            _request_from_dict(item[0], 'items[%d]' % k)
        _check_str(self.publisher, 'publisher', optional=True)
        _check_count(self.version, 'version')
        _check_count(self.requests, 'requests')

    def demand(self):
        """This payload as a ``fragmentation.Demand``."""
        return demand_from_items(self.items)


PAYLOADS = {REFUSAL_EVENT: RefusalPayload, PLACEMENT_EVENT: PlacementPayload,
            DEVICE_EVENT: DevicePayload, DEMAND_EVENT: DemandPayload}


def parse(event_type, primitive):
    """The payload of a nova-gpu notification of ``event_type``."""
    cls = PAYLOADS.get(event_type)
    if cls is None:
        raise PayloadError('not a nova-gpu notification: %r' % (event_type,))
    return cls.from_primitive(primitive)
