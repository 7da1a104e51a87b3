"""Receives the agents' GPU reports in nova-scheduler (oslo.messaging).

nova-gpu-agent publishes each report as an ``info`` notification with
event type ``core.report.EVENT_TYPE`` (publisher ``core.report.PUBLISHER``)
on ``[gpu_scheduler] report_topic`` over Nova's notification transport;
the contract lives once, in ``core.report``. Every scheduler service
listens in its own pool and feeds its own view (``view.of_service``), so
each one keeps a full view. The endpoint is the only way
reports enter the view, in production and in the functional tests alike,
and it never raises: a bad report is logged at WARNING and dropped.

Lifecycle: the listener belongs to the nova-scheduler service. It starts
when the service starts (``SchedulerManager.init_host``, which
nova.service.Service.start calls in each worker process, after the fork)
and stops when the service stops (``Manager.set_shutdown_in_progress``,
the first, synchronous step of nova.service.Service.stop; the later
``graceful_shutdown`` runs in a thread that Service.stop may not wait
for). Nova 34 gives filters
and weighers no lifecycle of their own: they are built inside
``SchedulerManager.__init__`` (through ``HostManager``), hold no reference
to the manager, and the manager class of nova-scheduler is fixed
(``nova.service.SERVICE_MANAGERS``). So ``bind_to_scheduler_service``
adds one small hook: it wraps those two ``SchedulerManager`` methods, once
per process, to call the originals and then start, or first stop, the
listener of *that* manager, which feeds *that* manager's view. It acts
only for a manager whose enabled filters or weighers include nova-gpu's,
and starts a listener only with ``[gpu_scheduler] report_listener =
true``; every other scheduler is untouched.

The same hook wraps ``SchedulerManager._consume_selected_host``, which
Nova calls once per instance after it claimed the chosen host's candidate
0 in Placement: there the GPU choice is final, and
``filters.notify_placed`` sends the placement notification (only for a
request GpuFilter chose GPUs for; never raising).
"""

import functools
import itertools
import os
import socket
import threading

from oslo_config import cfg
from oslo_log import log as logging
import oslo_messaging as messaging

from nova_gpu.core import report as report_mod
from nova_gpu import listening

CONF = cfg.CONF
LOG = logging.getLogger(__name__)

# Attribute of a SchedulerManager holding its ReportListener.
_ATTR = '_nova_gpu_report_listener'
_POOLS = itertools.count()


class ReportEndpoint:
    """oslo.messaging notification endpoint feeding a GpuView."""

    filter_rule = listening.event_filter([report_mod.EVENT_TYPE])

    def __init__(self, view):
        self.view = view

    def info(self, ctxt, publisher_id, event_type, payload, metadata):
        # Whatever a report holds, it must not escape into oslo.messaging
        # (which would requeue or drop the listener's batch) nor touch
        # another host: ingest validates before it changes anything.
        try:
            entry = self.view.ingest(payload)
        except Exception as e:
            LOG.warning('Dropping GPU report from %s (host %s): %s',
                        listening.shown(publisher_id), _host_of(payload), e)
            return messaging.NotificationResult.HANDLED
        if entry is not None:
            LOG.debug('GPU report %s of %s ingested (%d GPUs)',
                      entry.generation, entry.nodename,
                      len(entry.host.gpus))
        return messaging.NotificationResult.HANDLED


class _Discard:
    """Consumes the topic's shared queue so that it cannot grow.

    oslo.messaging's RabbitMQ driver declares the non-pooled queue
    ``<topic>.info`` on every send, and every report lands there as well
    as in each pool's queue; with no consumer it grows for as long as
    agents publish. Every scheduler listener also drains it: whichever
    gets a message drops it (the pools carry the copies that count).
    """

    def info(self, ctxt, publisher_id, event_type, payload, metadata):
        return messaging.NotificationResult.HANDLED


def _host_of(payload):
    try:
        return listening.shown(payload.get('host'))
    except Exception:
        return 'unknown'


class ReportListener:
    """The notification listener of one scheduler (start/stop once)."""

    def __init__(self, view, transport=None):
        self.view = view
        self._transport = transport
        self._owns_transport = transport is None
        self._server = None
        self._drain = None
        self._lock = threading.Lock()

    @property
    def running(self):
        return self._server is not None

    def start(self):
        with self._lock:
            if self._server is not None:
                return self
            if self._transport is None:
                self._transport = messaging.get_notification_transport(CONF)
            target = messaging.Target(topic=CONF.gpu_scheduler.report_topic)
            server = messaging.get_notification_listener(
                self._transport, [target], [ReportEndpoint(self.view)],
                executor='threading',
                # One pool per listener: every scheduler worker (and every
                # scheduler of a process) keeps a full view.
                pool='nova-gpu-scheduler-%s-%d-%d' % (
                    socket.gethostname(), os.getpid(), next(_POOLS)))
            server.start()
            self._server = server
            self._drain = messaging.get_notification_listener(
                self._transport, [target], [_Discard()],
                executor='threading')
            self._drain.start()
        LOG.info('Listening for GPU reports on topic %s',
                 CONF.gpu_scheduler.report_topic)
        return self

    def stop(self):
        """Stop consuming and wait for the poller and workers to end."""
        with self._lock:
            server, self._server = self._server, None
            drain, self._drain = self._drain, None
            if server is None:
                return
            try:
                for each in (server, drain):
                    if each is not None:
                        each.stop()
                        each.wait()
            finally:
                if self._owns_transport and self._transport is not None:
                    self._transport.cleanup()
                    self._transport = None
        LOG.info('Stopped listening for GPU reports')

    # As an oslo.messaging server, for callers that stop then wait.
    def wait(self):
        self.stop()


def start(view, transport=None):
    """Start a listener feeding ``view``; returns the ReportListener."""
    return ReportListener(view, transport).start()


def publish(report, transport=None):
    """Publish ``report`` the way the agent does (tools and tests)."""
    transport = transport or messaging.get_notification_transport(CONF)
    notifier = messaging.Notifier(
        transport, publisher_id='%s.%s' % (report_mod.PUBLISHER,
                                           report.get('host')),
        driver='messagingv2', topics=[CONF.gpu_scheduler.report_topic])
    notifier.info({}, report_mod.EVENT_TYPE, report)


# -- the nova-scheduler service lifecycle ----------------------------------

_BOUND = False
_BIND_LOCK = threading.Lock()


def listener_of(manager):
    """The ReportListener a SchedulerManager owns, or None."""
    return getattr(manager, _ATTR, None)


def _plugins(manager):
    """(nova-gpu filters that read the view, whether any nova-gpu filter
    or weigher is enabled) of a SchedulerManager.
    """
    from nova_gpu.scheduler import filters
    from nova_gpu.scheduler import weighers
    hm = getattr(manager, 'host_manager', None)
    enabled = list(getattr(hm, 'enabled_filters', ()) or ())
    # GpuFilter and any other nova-gpu filter reading the view (its
    # ``_view``, e.g. GpuDriverFilter).
    gpu_filters = [f for f in enabled if isinstance(f, filters.GpuFilter)
                   or (type(f).__module__.startswith('nova_gpu.scheduler.')
                       and hasattr(f, '_view'))]
    used = bool(gpu_filters) or any(
        isinstance(w, weighers._GpuWeigher)
        for w in getattr(hm, 'weighers', ()) or ())
    return gpu_filters, used


def service_started(manager):
    """Give ``manager``'s filters its view and start its listener (its
    service is starting).
    """
    gpu_filters, used = _plugins(manager)
    if not used:
        return None
    from nova_gpu.scheduler import view as view_mod
    view = view_mod.of_service(manager, gpu_filters)
    if not CONF.gpu_scheduler.report_listener:
        return None
    found = listener_of(manager)
    if found is None:
        found = ReportListener(view)
        setattr(manager, _ATTR, found)
    return found.start()


def service_stopping(manager):
    """Stop ``manager``'s listener (its service is stopping)."""
    found = listener_of(manager)
    if found is not None:
        try:
            found.stop()
        except Exception:
            LOG.exception('Error stopping the GPU report listener')
    # The filter's refusal notifier: nothing of the plugin's messaging
    # outlives the service.
    from nova_gpu.scheduler import notifications
    notifications.reset()


def bind_to_scheduler_service():
    """Tie report listeners to nova-scheduler's service (once; see above).

    Called by GpuFilter and the weighers when Nova builds them, inside
    ``SchedulerManager.__init__``, before the service starts.
    """
    global _BOUND
    with _BIND_LOCK:
        if _BOUND:
            return
        try:
            from nova.scheduler import manager as manager_mod
        except ImportError:  # not inside Nova (tools, the simulator)
            return
        cls = manager_mod.SchedulerManager
        init_host = cls.init_host
        set_shutdown_in_progress = cls.set_shutdown_in_progress

        @functools.wraps(init_host)
        def init_host_with_reports(self, *args, **kwargs):
            result = init_host(self, *args, **kwargs)
            service_started(self)
            return result

        @functools.wraps(set_shutdown_in_progress)
        def shutdown_with_reports(self, *args, **kwargs):
            result = set_shutdown_in_progress(self, *args, **kwargs)
            service_stopping(self)
            return result

        cls.init_host = init_host_with_reports
        cls.set_shutdown_in_progress = shutdown_with_reports
        cls._consume_selected_host = staticmethod(
            _notifying(cls._consume_selected_host))
        _BOUND = True


def _notifying(consume):
    """``SchedulerManager._consume_selected_host`` (a static method), then
    the placement notification of the instance (``filters.notify_placed``,
    which never raises). Nova calls it once per instance, after it claimed
    the host's candidate 0 in Placement: the GPU choice is final there.
    """
    @functools.wraps(consume)
    def consume_and_notify(selected_host, spec_obj, *args, **kwargs):
        result = consume(selected_host, spec_obj, *args, **kwargs)
        try:
            from nova_gpu.scheduler import filters
            filters.notify_placed(selected_host, spec_obj,
                                  kwargs.get('instance_uuid',
                                             args[0] if args else None))
        except Exception:  # never into scheduling
            LOG.exception('GPU placement notification failed')
        return result
    return consume_and_notify
