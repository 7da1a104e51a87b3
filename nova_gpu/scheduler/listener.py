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

And ``SchedulerManager.select_destinations`` (the RPC method; checked on
Nova 34.0.0, whose parameters ``SELECT_DESTINATIONS_PARAMS`` lists and a
functional test holds against the installed Nova): when Nova answers
NoValidHost for a GPU request although GpuFilter let a host through that
Nova could claim on (``filters.claims_lost``), every claim Nova tried was
refused by Placement, because other schedulers took those devices since
Placement offered them; Nova tries only candidate 0 of each host, and its
alternates are the same for every scheduler. The request is then
scheduled again, with fresh allocation candidates, after a short random
wait, until it is placed, at most ``[gpu_scheduler] claim_retries`` times
and not after ``claim_retry_seconds`` (``_retrying``): while it races
other schedulers, a later attempt's NoValidHost is asked again too (what
Placement offers is in flux: others' claims come, and go when a
multi-create of theirs fails). A first attempt that lost no claim (no
host passed, or Placement offered none) is a refusal, answered at once,
as before.
"""

import functools
import inspect
import itertools
import os
import random
import socket
import threading
import time

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
        select_destinations = cls.select_destinations
        if select_destinations_params(select_destinations) == \
                SELECT_DESTINATIONS_PARAMS:
            cls.select_destinations = _retrying(select_destinations)
        else:
            # Another Nova: its claims are left as they are rather than
            # retried with arguments read wrong.
            LOG.warning('SchedulerManager.select_destinations takes %s, '
                        'not %s: GPU requests whose claims other '
                        'schedulers took are not scheduled again',
                        select_destinations_params(select_destinations),
                        SELECT_DESTINATIONS_PARAMS)
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


# -- scheduling again when every claim was lost ----------------------------

# The parameters of SchedulerManager.select_destinations, as Nova 34.0.0
# defines them (under oslo.messaging's expected_exceptions decorator).
SELECT_DESTINATIONS_PARAMS = (
    'self', 'context', 'request_spec', 'filter_properties', 'spec_obj',
    'instance_uuids', 'return_objects', 'return_alternates')
_SPEC_OBJ = SELECT_DESTINATIONS_PARAMS.index('spec_obj') - 2
# The first wait before scheduling again is at most this many seconds;
# each later one at most twice the one before (full jitter).
RETRY_WAIT = 0.1
# Attribute of a SchedulerManager counting its retries (``retry_counts``).
_RETRIES_ATTR = '_nova_gpu_claim_retries'


def select_destinations_params(method):
    """The parameter names of ``select_destinations`` under its
    decorators (oslo.messaging's ``expected_exceptions`` keeps no
    ``__wrapped__``: the function is found in its closure), or None.
    """
    func, seen = method, set()
    while func is not None and id(func) not in seen:
        seen.add(id(func))
        func = inspect.unwrap(func)
        if func.__name__ == 'select_destinations':
            try:
                return tuple(inspect.signature(func).parameters)
            except (TypeError, ValueError):
                return None
        inner = []
        for cell in func.__closure__ or ():
            try:
                content = cell.cell_contents
            except ValueError:  # an empty cell
                continue
            if inspect.isfunction(content):
                inner.append(content)
        func = inner[0] if len(inner) == 1 else None
    return None


def retry_counts(manager):
    """``{'retried': n, 'gave_up': m}``: how often ``manager`` scheduled
    a request again after its claims were lost, and how often it answered
    NoValidHost with its claims still lost, its retries spent.
    """
    return dict(getattr(manager, _RETRIES_ATTR, None)
                or {'retried': 0, 'gave_up': 0})


def _count(manager, what):
    counts = getattr(manager, _RETRIES_ATTR, None)
    if counts is None:
        counts = {'retried': 0, 'gave_up': 0}
        setattr(manager, _RETRIES_ATTR, counts)
    counts[what] += 1


def _is_no_valid_host(error):
    """Whether ``error`` is Nova's NoValidHost, as raised through
    oslo.messaging's ``expected_exceptions`` (an ExpectedException
    holding it) or plain.
    """
    from nova import exception
    if isinstance(error, messaging.ExpectedException):
        error = error.exc_info[1]
    return isinstance(error, exception.NoValidHost)


def _fresh_spec(spec_obj, group_hosts):
    """A copy of ``spec_obj`` to schedule again: Nova's failed attempt
    added the hosts it claimed on to the server group's hosts
    (``_consume_selected_host``), which the copy has as they were; and a
    new object is a new request to GpuFilter (its decisions left on the
    hosts by the failed attempt are not this request's).
    """
    fresh = spec_obj.obj_clone()
    if group_hosts is not None:
        fresh.instance_group.hosts = list(group_hosts)
        fresh.instance_group.obj_reset_changes(['hosts'])
    return fresh


def _group_hosts(spec_obj):
    group = (spec_obj.instance_group
             if spec_obj.obj_attr_is_set('instance_group') else None)
    if group is None or not group.obj_attr_is_set('hosts'):
        return None
    return list(group.hosts or ())


def _retrying(select_destinations):
    """``SchedulerManager.select_destinations``, scheduling a GPU request
    again once every claim Nova tried was lost to other schedulers, until
    it is placed or the bounds run out (see the module doc). Checked on
    Nova 34.0.0.
    """
    @functools.wraps(select_destinations)
    def select_destinations_retrying(self, context, *args, **kwargs):
        from nova_gpu.scheduler import filters
        if len(args) > _SPEC_OBJ:
            spec_obj = args[_SPEC_OBJ]
        else:
            spec_obj = kwargs.get('spec_obj')
        retries = CONF.gpu_scheduler.claim_retries
        if (not retries or spec_obj is None
                or not hasattr(spec_obj, 'obj_clone')
                or not _plugins(self)[1]):
            # No RequestSpec object (an old conductor's primitives), no
            # retries, or a scheduler without the plugin: as Nova does.
            return select_destinations(self, context, *args, **kwargs)
        window = CONF.gpu_scheduler.claim_retry_seconds
        group_hosts = _group_hosts(spec_obj)
        start = time.monotonic()
        attempt = 0
        while True:
            filters.forget_pass(spec_obj)
            try:
                return select_destinations(self, context, *args, **kwargs)
            except Exception as e:
                if not _is_no_valid_host(e):
                    raise
                # A first attempt that lost no claim was a refusal. Once
                # it lost some, the request races other schedulers and
                # what Placement offers is in flux (their claims come,
                # and go when a multi-create of theirs fails): any
                # NoValidHost is asked again, within the bounds.
                if not attempt and not filters.claims_lost(spec_obj):
                    raise
                wait = random.uniform(0, RETRY_WAIT * 2 ** attempt)
                spent = time.monotonic() - start
                uuid = getattr(spec_obj, 'instance_uuid', None)
                if attempt >= retries or spent + wait > window:
                    _count(self, 'gave_up')
                    LOG.info('GPU request of instance %s: not placed in '
                             '%d attempts racing other schedulers (%.1f '
                             's): NoValidHost', uuid, attempt + 1, spent)
                    raise
            attempt += 1
            _count(self, 'retried')
            LOG.info('GPU request of instance %s: %s; scheduling it again '
                     'with fresh allocation candidates in %.2f s (retry '
                     '%d of %d)', uuid,
                     'every claim was lost to other schedulers'
                     if attempt == 1 else 'NoValidHost while racing other '
                     'schedulers', wait, attempt, retries)
            time.sleep(wait)
            spec_obj = _fresh_spec(spec_obj, group_hosts)
            if len(args) > _SPEC_OBJ:
                args = args[:_SPEC_OBJ] + (spec_obj,) + args[_SPEC_OBJ + 1:]
            else:
                kwargs['spec_obj'] = spec_obj
    return select_destinations_retrying
