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
to the number of hosts refused for it; ``placed`` reports the GPUs chosen
for an instance.
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

reason_of = notification.reason_of

_lock = threading.Lock()
_notifier = None


def _get_notifier():
    global _notifier
    with _lock:
        if _notifier is None:
            transport = messaging.get_notification_transport(CONF)
            _notifier = messaging.Notifier(
                transport, driver='messagingv2',
                publisher_id='%s:%s' % (PUBLISHER, socket.gethostname()),
                topics=[CONF.gpu_scheduler.report_topic])
            # Ours to close (reset); a notifier set by set_notifier is not.
            _notifier._nova_gpu_transport = transport
        return _notifier


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


def _send(event_type, build):
    """Build the payload and send it; False (logged) if either fails."""
    try:
        payload = build()
        payload.check()
        _get_notifier().info({}, event_type, payload.to_primitive())
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


def placed(host, gpus, instance_uuid=None, slots=(), request=None,
           fragmentation_delta=0.0):
    """The physical GPUs (and slots) chosen for an instance on ``host``."""
    return _send(notification.PLACEMENT_EVENT, lambda: (
        notification.PlacementPayload(
            host=host, gpus=[int(g) for g in gpus],
            slots=[list(s) for s in slots], instance_uuid=instance_uuid,
            request=request,
            fragmentation_delta=float(fragmentation_delta))))
