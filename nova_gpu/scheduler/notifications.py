"""Versioned notifications the scheduler plugin sends (oslo.messaging).

The payloads and event types are the contract in
``nova_gpu.core.notification``; this module sends them on the report
topic (``[gpu_scheduler] report_topic``) over nova-scheduler's
notification transport, where nova-gpu-exporter (and any other tool)
listens. Sending never raises into scheduling and never blocks it on a
broker: oslo.messaging's ``messagingv2`` driver logs and drops a failed
send.

The GPU filter calls, once per request after it filtered every host::

    notifications.refused(spec_obj.instance_uuid, refusals, hosts_passed,
                          request=str(gpu_request))

``refusals`` maps reason codes (``core.notification.REFUSAL_REASONS``;
``reason_of(engine.why_not(...))`` turns the engine's sentence into one)
to the number of hosts refused for it. Once per instance, when Nova has
chosen its host and claimed there the candidate the filter put first
(``SchedulerManager._consume_selected_host``, hooked by the listener
module), ``filters.notify_placed`` calls::

    notifications.placed(host, gpus, instance_uuid, slots=..., request=...,
                         fragmentation_delta=...)

with the GPU set and slots the filter's decision stands for.
"""

import socket
import threading

from oslo_config import cfg
from oslo_log import log as logging
import oslo_messaging as messaging

from nova_gpu.core import notification

CONF = cfg.CONF
LOG = logging.getLogger(__name__)
PUBLISHER = 'nova-gpu-scheduler'
# Connection retries of one send (0: none; the send is dropped, logged).
SEND_RETRY = 0

reason_of = notification.reason_of

# Guards only the assignments below, never a call that may yield: this
# lock can be a real one (created before eventlet patched the process), and
# a green thread blocking on a real lock held by another stops them all.
_lock = threading.Lock()
_notifier = None


def _build_notifier():
    transport = messaging.get_notification_transport(CONF)
    notifier = messaging.Notifier(
        transport, driver='messagingv2',
        publisher_id='%s:%s' % (PUBLISHER, socket.gethostname()),
        topics=[CONF.gpu_scheduler.report_topic],
        # Not [oslo_messaging_notifications] retry (-1, forever): these
        # are sent inside scheduling, which a broker outage must not hold
        # up; a lost one only undercounts a metric.
        retry=SEND_RETRY)
    # Ours to close (reset); a notifier set by set_notifier is not.
    notifier._nova_gpu_transport = transport
    return notifier


def _get_notifier():
    global _notifier
    notifier = _notifier
    if notifier is not None:
        return notifier
    built = _build_notifier()
    with _lock:
        if _notifier is None:
            _notifier = built
            return built
        notifier = _notifier
    # Another thread built one first: keep one transport, close ours.
    built._nova_gpu_transport.cleanup()
    return notifier


def reset():
    """Drop the notifier built from the configuration and close its
    transport (the scheduler service is stopping): its broker connection
    and heartbeat thread must not outlive the service.
    """
    global _notifier
    with _lock:
        notifier, _notifier = _notifier, None
    transport = getattr(notifier, '_nova_gpu_transport', None)
    if transport is not None:
        try:
            transport.cleanup()
        except Exception as e:  # stopping never fails on a notifier
            LOG.warning('closing the GPU notification transport: %s', e)


def set_notifier(notifier):
    """Use ``notifier`` (tests; None: build one from the configuration)."""
    global _notifier
    with _lock:
        _notifier = notifier


def _get_demand_notifier():
    """The notifier of the demand topic: it shares the report notifier's
    transport (closed by ``reset``); one set by ``set_notifier`` (tests)
    is used as it is.
    """
    notifier = _get_notifier()
    transport = getattr(notifier, '_nova_gpu_transport', None)
    if transport is None:
        return notifier
    sibling = getattr(notifier, '_nova_gpu_demand', None)
    if sibling is None:
        # Not the report topic: every agent listens to the demand in a
        # pool of its own, and must not receive every host's reports.
        # Two threads may both build one; either serves, neither owns a
        # transport of its own.
        sibling = messaging.Notifier(
            transport, driver='messagingv2',
            publisher_id=notifier.publisher_id,
            topics=[CONF.gpu_scheduler.demand_topic], retry=SEND_RETRY)
        notifier._nova_gpu_demand = sibling
        return sibling


def _send(event_type, build, get_notifier=None):
    """Build the payload and send it; False (logged) if either fails."""
    try:
        payload = build()
        payload.check()
        (get_notifier or _get_notifier)().info(
            {}, event_type, payload.to_primitive())
    except Exception as e:  # a notification never breaks scheduling
        LOG.warning('GPU notification %s not sent: %s', event_type, e)
        return False
    return True


def refused(instance_uuid, refusals, hosts_passed, request=None):
    """One request's filter outcome: hosts refused per reason code."""
    def build():
        counts = {}
        for reason, count in refusals.items():
            if reason not in notification.REFUSAL_REASONS:
                reason = notification.OTHER
            counts[reason] = counts.get(reason, 0) + int(count)
        return notification.RefusalPayload(
            refusals=counts, hosts_passed=int(hosts_passed),
            instance_uuid=instance_uuid, request=request)
    return _send(notification.REFUSAL_EVENT, build)


def _plain(value):
    """``value`` with tuples (a slot's MIG detail) as lists, as on the wire."""
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def placed(host, gpus, instance_uuid=None, slots=(), request=None,
           fragmentation_delta=0.0):
    """The physical GPUs (and slots) chosen for an instance on ``host``.

    ``slots``: ``core.host.Slot`` (or ``[gpu, kind, detail]``) of each
    device, sent as ``[gpu, kind, detail]``.
    """
    return _send(notification.PLACEMENT_EVENT, lambda: (
        notification.PlacementPayload(
            host=host, gpus=[int(g) for g in gpus],
            slots=[_plain(s) for s in slots], instance_uuid=instance_uuid,
            request=request,
            fragmentation_delta=float(fragmentation_delta))))


def demand_updated(items, version=0, requests=0):
    """The scheduler's windowed demand (``[request, weight]`` items), for
    the agents' layout planners (``scheduler.demand`` rate-limits it).
    """
    return _send(notification.DEMAND_EVENT, lambda: (
        notification.DemandPayload(
            items=items, publisher=socket.gethostname(),
            version=int(version), requests=int(requests))),
        get_notifier=_get_demand_notifier)
