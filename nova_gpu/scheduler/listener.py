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
when the service starts and stops when it stops: nova-gpu-scheduler's
manager (``nova_gpu.scheduler.manager``, the one module touching Nova's
scheduler service) calls ``service_started`` and ``service_stopping``.
It acts only for a manager whose enabled filters or weighers include
nova-gpu's, and starts a listener only with ``[gpu_scheduler]
report_listener = true``.
"""

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
        self._server = None
        self._lock = threading.Lock()

    @property
    def running(self):
        return self._server is not None

    def start(self):
        with self._lock:
            if self._server is not None:
                return self
            self._server = listening.Listener(
                CONF, [(CONF.gpu_scheduler.report_topic, None)],
                [ReportEndpoint(self.view)],
                # One pool per listener: every scheduler worker (and every
                # scheduler of a process) keeps a full view.
                pool='nova-gpu-scheduler-%s-%d-%d' % (
                    socket.gethostname(), os.getpid(), next(_POOLS)),
                drain=True, transport=self._transport, log=LOG).start()
        LOG.info('Listening for GPU reports on topic %s',
                 CONF.gpu_scheduler.report_topic)
        return self

    def stop(self):
        """Stop consuming and wait for the poller and workers to end."""
        with self._lock:
            server, self._server = self._server, None
            if server is None:
                return
            # The listener closes the transport it made, not ours.
            server.stop()
        LOG.info('Stopped listening for GPU reports')

    # As an oslo.messaging server, for callers that stop then wait.
    def wait(self):
        self.stop()


def start(view, transport=None):
    """Start a listener feeding ``view``; returns the ReportListener."""
    return ReportListener(view, transport).start()


def publish(report, transport=None):
    """Publish ``report`` the way the agent does (tools and tests)."""
    transport = transport or listening.transport(CONF)
    notifier = messaging.Notifier(
        transport, publisher_id='%s.%s' % (report_mod.PUBLISHER,
                                           report.get('host')),
        driver='messagingv2', topics=[CONF.gpu_scheduler.report_topic])
    notifier.info({}, report_mod.EVENT_TYPE, report)


# -- the nova-scheduler service lifecycle ----------------------------------

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
    from nova_gpu.scheduler import notifier as notifications
    notifications.reset()
