"""Versioned notifications the scheduler plugin sends (oslo.messaging).

The payloads and event types are the contract in
``nova_gpu.core.notification``; this module sends them on the report
topic (``[gpu_scheduler] report_topic``) over nova-scheduler's
notification transport, where nova-gpu-exporter (and any other tool)
listens.

Scheduling never waits on a broker. ``refused``, ``placed`` and
``demand_updated`` build and check the payload in the caller and hand it
to a bounded queue (``nova_gpu.send_queue``, of ``[gpu_scheduler]
notification_queue_size`` messages) drained by one background thread. A
demand publication supersedes the one before, and refusals and
placements feed counters where each message weighs the same: dropping
the oldest when the queue is full loses the least.

The GPU filter calls, once per request after it filtered every host::

    notifications.refused(spec_obj.instance_uuid, refusals, hosts_passed,
                          request=str(gpu_request))

``refusals`` maps reason codes (``core.notification.REFUSAL_REASONS``;
``reason_of(engine.why_not(...))`` turns the engine's sentence into one)
to the number of hosts refused for it. Once per instance, when Nova has
chosen its host and claimed there the candidate the filter put first
(what ``select_destinations`` returns, in nova-gpu-scheduler's
``manager.GpuSchedulerManager``), ``filters.notify_placed`` calls::

    notifications.placed(host, gpus, instance_uuid, slots=..., request=...,
                         fragmentation_delta=...)

with the GPU set and slots the filter's decision stands for.
"""

import datetime
import os
import socket
import threading
import uuid

from oslo_config import cfg
from oslo_log import log as logging
import oslo_messaging as messaging

from nova_gpu.core import notification
from nova_gpu import listening
from nova_gpu import send_queue

CONF = cfg.CONF
LOG = logging.getLogger(__name__)
PUBLISHER = 'nova-gpu-scheduler'
# Connection retries of one send (0: none; the send is dropped, counted).
SEND_RETRY = 0
# Most seconds the service's stop waits for the queue to drain and the
# transport to close: a hung broker must not hold the stop either.
STOP_TIMEOUT = 2

reason_of = notification.reason_of

# Guards only the assignments below, never a call that may yield: this
# lock can be a real one (created before eventlet patched the process), and
# a green thread blocking on a real lock held by another stops them all.
_lock = threading.Lock()
_notifier = None
# The notifier set_notifier set to be called in the caller's thread.
_inline = None
_sender = None


class _Channel:
    """Sends notifications on one topic of a notification transport.

    The envelope is the one oslo.messaging's ``messagingv2`` driver sends;
    unlike that driver, a failed send raises, so that the sender can
    count it (the driver logs and drops it).
    """

    def __init__(self, transport, publisher_id, topic, retry=SEND_RETRY):
        self.transport = transport
        self.publisher_id = publisher_id
        self.retry = retry
        self.target = messaging.Target(topic='%s.info' % topic)

    def info(self, ctxt, event_type, payload):
        message = {'message_id': str(uuid.uuid4()),
                   'publisher_id': self.publisher_id,
                   'event_type': event_type, 'priority': 'INFO',
                   'payload': payload,
                   'timestamp': str(datetime.datetime.utcnow())}
        self.transport._send_notification(self.target, ctxt, message,
                                          version=2.0, retry=self.retry)


def _build_notifier():
    transport = listening.transport(CONF)
    # Not [oslo_messaging_notifications] retry (-1, forever): a broker
    # that stays down must not keep the sender from later messages; a
    # lost one only undercounts a metric.
    notifier = _Channel(transport,
                        '%s:%s' % (PUBLISHER, socket.gethostname()),
                        CONF.gpu_scheduler.report_topic)
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


def _get_sender():
    global _sender
    sender = _sender
    if sender is None:
        with _lock:
            if _sender is None:
                _sender = send_queue.SendQueue(
                    lambda: CONF.gpu_scheduler.notification_queue_size)
            sender = _sender
    return sender


def stats():
    """The background sender's counters (``send_queue.SendQueue.stats``);
    zeros before the first send.
    """
    return _get_sender().stats()


def flush(timeout=None):
    """Wait up to ``timeout`` s (None: ``STOP_TIMEOUT``) for what is
    queued to be sent; whether it was.
    """
    return _get_sender().flush(STOP_TIMEOUT if timeout is None else timeout)


def _forked():
    # A forked worker has no sender thread; what its parent queued is the
    # parent's to send.
    global _sender
    _sender = None


os.register_at_fork(after_in_child=_forked)


def reset():
    """Send what is queued (for up to ``STOP_TIMEOUT`` s), drop the
    notifier built from the configuration and close its transport (the
    scheduler service is stopping): its broker connection and heartbeat
    thread must not outlive the service.
    """
    global _notifier, _sender
    with _lock:
        sender, _sender = _sender, None
    if sender is not None and not sender.stop(STOP_TIMEOUT):
        LOG.warning('GPU notifications: %d still queued after %g s, '
                    'dropped (the service stops)',
                    sender.stats()['pending'], STOP_TIMEOUT)
    with _lock:
        notifier, _notifier = _notifier, None
    transport = getattr(notifier, '_nova_gpu_transport', None)
    if transport is not None:
        # In a thread of its own: closing a connection to a hung broker
        # waits on it too.
        closing = threading.Thread(target=_cleanup, args=(transport,),
                                   name='nova-gpu-notifications-close',
                                   daemon=True)
        closing.start()
        closing.join(STOP_TIMEOUT)


def _cleanup(transport):
    try:
        transport.cleanup()
    except Exception as e:  # stopping never fails on a notifier
        LOG.warning('closing the GPU notification transport: %s', e)


def set_notifier(notifier, background=False):
    """Use ``notifier`` (tests, the demo; None: build one from the
    configuration).

    Its ``info`` is called in the caller's thread, the way a notifier that
    records in process is used, unless ``background``: then it is sent
    through the background sender, as the configured one is.
    """
    global _notifier, _inline
    with _lock:
        _notifier = notifier
        _inline = None if background else notifier


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
        sibling = _Channel(transport, notifier.publisher_id,
                           CONF.gpu_scheduler.demand_topic)
        notifier._nova_gpu_demand = sibling
    return sibling


def _send(event_type, build, get_notifier=None):
    """Build the payload and queue it (or, for a notifier set to be
    called inline, send it); False (logged) if either fails.
    """
    try:
        payload = build()
        payload.check()
        primitive = payload.to_primitive()
        notifier = (get_notifier or _get_notifier)()
        if notifier is not _inline:
            return _get_sender().submit(notifier, event_type, primitive)
        notifier.info({}, event_type, primitive)
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
