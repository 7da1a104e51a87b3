"""Versioned notifications the scheduler plugin sends (oslo.messaging).

The payloads and event types are the contract in
``nova_gpu.core.notification``; this module sends them on the report
topic (``[gpu_scheduler] report_topic``) over nova-scheduler's
notification transport, where nova-gpu-exporter (and any other tool)
listens.

Scheduling never waits on a broker. ``refused``, ``placed`` and
``demand_updated`` build and check the payload in the caller and hand it
to a bounded queue (``[gpu_scheduler] notification_queue_size``); one
background thread (``Sender``) sends what is queued, oldest first. A send
cannot be bounded from outside (oslo.messaging's notifier has no per-send
timeout, and a RabbitMQ node stopped with its connections open answers
nothing, so a publish waits for a confirm that does not come): that
thread may wait on a hung broker, the scheduler does not. When the queue
is full the oldest message is dropped, because the newest describe the
present: a demand publication supersedes the one before, and refusals
and placements feed counters where each message weighs the same.
Dropped and failed sends are counted (``stats``) and logged at WARNING
at most once per ``WARN_INTERVAL``. The thread is made at the first send
with what ``threading`` is then: an OS thread in Nova's native threading
mode, a green thread where eventlet patched the process.

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

import collections
import datetime
import os
import socket
import threading
import time
import uuid

from oslo_config import cfg
from oslo_log import log as logging
import oslo_messaging as messaging

from nova_gpu.core import notification

CONF = cfg.CONF
LOG = logging.getLogger(__name__)
PUBLISHER = 'nova-gpu-scheduler'
# Connection retries of one send (0: none; the send is dropped, counted).
SEND_RETRY = 0
# Least seconds between two WARNINGs about dropped or failed sends.
WARN_INTERVAL = 60
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


class Sender:
    """Sends queued notifications from one background thread.

    ``submit`` never blocks: it queues (dropping the oldest message when
    the queue holds ``capacity``) and wakes the thread.
    """

    def __init__(self, capacity=None, clock=time.monotonic):
        self._capacity = capacity
        self._clock = clock
        self._queue = collections.deque()
        # Held for queue and counter updates only, never across a send.
        self._lock = threading.Lock()
        self._wake = None
        self._thread = None
        self._stopping = False
        self.counts = dict.fromkeys(('queued', 'sent', 'dropped', 'failed'),
                                    0)
        # When the message being sent was taken off the queue (None: idle).
        self.sending_since = None
        # When the last WARNING was logged; whether a send was lost since.
        self._warned_at = None
        self._degraded = False
        self._last_error = None

    @property
    def capacity(self):
        if self._capacity is not None:
            return self._capacity
        return CONF.gpu_scheduler.notification_queue_size

    def submit(self, notifier, event_type, payload):
        """Queue one message for ``notifier``; True (queued)."""
        self._running()
        capacity = self.capacity
        with self._lock:
            dropped = len(self._queue) >= capacity
            while len(self._queue) >= capacity:
                self._queue.popleft()
                self.counts['dropped'] += 1
            self._queue.append((notifier, event_type, payload))
            self.counts['queued'] += 1
        self._wake.set()
        if dropped:
            self._warn()
        return True

    def _running(self):
        """Start the thread unless it runs (or another caller starts it)."""
        thread = self._thread
        if thread is not None and (thread.ident is None or
                                   thread.is_alive()):
            return
        with self._lock:
            thread = self._thread
            if thread is not None and (thread.ident is None or
                                       thread.is_alive()):
                return
            self._stopping = False
            self._wake = threading.Event()
            thread = self._thread = threading.Thread(
                target=self._run, args=(self._wake,),
                name='nova-gpu-notifications', daemon=True)
        # Outside the lock: under eventlet, start() yields to the new
        # green thread, which takes the lock.
        try:
            thread.start()
        except Exception:
            with self._lock:
                self._thread = None
            raise

    def _take(self):
        with self._lock:
            if not self._queue:
                return None
            self.sending_since = self._clock()
            return self._queue.popleft()

    def _run(self, wake):
        while True:
            # Cleared before the queue is read: a message queued after
            # the last read sets it again, and the wait returns at once.
            wake.clear()
            item = self._take()
            while item is not None:
                self._deliver(*item)
                item = self._take()
            if self._stopping:
                return
            wake.wait()

    def _deliver(self, notifier, event_type, payload):
        try:
            notifier.info({}, event_type, payload)
        except Exception as e:  # counted and logged, the next one goes
            with self._lock:
                self.counts['failed'] += 1
            self._last_error = '%s not sent: %s' % (event_type, e)
            self._warn()
            return
        finally:
            with self._lock:
                self.sending_since = None
        with self._lock:
            self.counts['sent'] += 1
        if self._degraded:
            self._recovered()

    def _warn(self):
        now = self._clock()
        if self._warned_at is not None and \
                now - self._warned_at < WARN_INTERVAL:
            return
        self._warned_at, self._degraded = now, True
        LOG.warning('GPU notifications: %(dropped)d dropped (queue of '
                    '%(capacity)d full), %(failed)d failed, %(sent)d sent '
                    'since start; %(pending)d queued; the send in '
                    'progress has waited %(sending_s).0f s on the broker; '
                    'last error: %(error)s. Scheduling does not wait for '
                    'them.', dict(self.stats(),
                                  error=self._last_error or 'none'))

    def _recovered(self):
        self._degraded = False
        LOG.info('GPU notifications sent again (%(dropped)d dropped, '
                 '%(failed)d failed since start)', self.stats())

    def stats(self):
        """The counters: queued, sent, dropped, failed (since start),
        pending (queued now), sending_s (how long the send in progress
        has waited), capacity.
        """
        with self._lock:
            counts = dict(self.counts, pending=len(self._queue))
            since = self.sending_since
        counts['sending_s'] = self._clock() - since if since else 0.0
        counts['capacity'] = self.capacity
        return counts

    def flush(self, timeout):
        """Wait up to ``timeout`` s for the queue to be sent; whether it
        was (tools and tests).
        """
        deadline = self._clock() + timeout
        while True:
            with self._lock:
                if not self._queue and self.sending_since is None:
                    return True
            if self._clock() >= deadline:
                return False
            time.sleep(0.01)

    def stop(self, timeout=None):
        """Send what is queued within ``timeout`` s (None:
        ``STOP_TIMEOUT``), then end the thread (whatever is left is
        dropped with the process).
        """
        if timeout is None:
            timeout = STOP_TIMEOUT
        with self._lock:
            thread, self._stopping = self._thread, True
            wake = self._wake
        if thread is None:
            return True
        wake.set()
        thread.join(timeout)
        return not thread.is_alive()


def _build_notifier():
    transport = messaging.get_notification_transport(CONF)
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
                _sender = Sender()
            sender = _sender
    return sender


def stats():
    """The background sender's counters (``Sender.stats``); zeros before
    the first send.
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
