"""nova-gpu-scheduler: Nova's scheduler service with the GPU plugin's hooks.

The one module of nova-gpu that touches Nova's scheduler service. Nova 34
gives filters and weighers no lifecycle and no view of the request's
outcome, so nova-gpu runs nova-scheduler with a subclass of Nova's
``SchedulerManager`` (``GpuSchedulerManager``), as Nova's own main builds
it: ``nova-gpu-scheduler`` (``nova_gpu.cmd.scheduler``) names this class
for the ``nova-scheduler`` binary in ``nova.service.SERVICE_MANAGERS``
and then runs Nova's own ``nova.cmd.scheduler.main`` (same arguments,
configuration files, workers, Guru Meditation reports). Nothing of Nova
is patched: the subclass overrides three public methods and calls
Nova's through ``super()``. ``NOVA_METHODS`` lists them with their
parameters as checked on ``CHECKED_ON``; a test fails when the installed
Nova's differ.

- ``init_host`` (``nova.manager.Manager``; nova.service.Service.start
  calls it in each worker process, after the fork): the service's GpuView
  is given to its GPU filters, and the report listener feeding it starts
  (``listener.service_started``).
- ``set_shutdown_in_progress`` (``nova.manager.Manager``, the first,
  synchronous step of nova.service.Service.stop; the later
  ``graceful_shutdown`` runs in a thread that Service.stop may not wait
  for): the listener stops and queued notifications are sent
  (``listener.service_stopping``).
- ``select_destinations`` (the RPC method): the placement notifications
  (``gpu.placement.decided``) are sent from what it returns, the host
  Nova chose and claimed on for each instance (``filters.notify_placed``);
  and a GPU request whose every claim was lost to other schedulers is
  scheduled again (``_schedule_again``).

Scheduling again: Nova claims candidate 0 of the first weighed host and,
when Placement refuses it (another scheduler took that device since
Placement offered it), candidate 0 of the next host, then answers
NoValidHost (``SchedulerManager._schedule``); its alternates are the same
for every scheduler. When Nova answers NoValidHost for a GPU request
although GpuFilter let a host through that Nova could claim on
(``filters.claims_lost``), the request is scheduled again with fresh
allocation candidates after a short random wait, until it is placed, at
most ``[gpu_scheduler] claim_retries`` times and not after
``claim_retry_seconds`` per instance of the request (a multi-create's
every attempt claims for each of its instances, so it gets as many
windows: under load a 7-instance request used to run out of a single
window after two attempts). While it races other schedulers, a later
attempt's NoValidHost is asked again too (what Placement offers is in
flux: others' claims come, and go when a multi-create of theirs fails).
A first attempt that lost no claim (no host passed, or Placement offered
none) is a refusal, answered at once, as Nova does.

Under Nova's own ``nova-scheduler`` the plugin's filter and weighers
still load (Nova's plugin interfaces), but they get no GPU reports:
GpuFilter logs that once and refuses GPU flavors on hosts it has no
report of (see ``filters.GpuFilter``).
"""

import random
import time

from nova import exception
from nova.scheduler import manager as nova_manager
from nova import service as nova_service
from oslo_config import cfg
from oslo_log import log as logging
import oslo_messaging as messaging

from nova_gpu.scheduler import filters
from nova_gpu.scheduler import listener

CONF = cfg.CONF
LOG = logging.getLogger(__name__)

# The Nova methods GpuSchedulerManager overrides, with their parameters
# as checked on the Nova releases in CHECKED_ON.
NOVA_METHODS = {
    'init_host': ('self', 'service_ref'),
    'set_shutdown_in_progress': ('self',),
    'select_destinations': (
        'self', 'context', 'request_spec', 'filter_properties', 'spec_obj',
        'instance_uuids', 'return_objects', 'return_alternates'),
}
CHECKED_ON = ('34.0.0',)
# What ``nova.service.SERVICE_MANAGERS`` names for nova-scheduler under
# nova-gpu-scheduler.
MANAGER = '%s.GpuSchedulerManager' % __name__
BINARY = 'nova-scheduler'
# The first wait before scheduling again is at most this many seconds;
# each later one at most twice the one before (full jitter).
RETRY_WAIT = 0.1
_SENTINEL = nova_manager.SchedulerManager._sentinel


class GpuSchedulerManager(nova_manager.SchedulerManager):
    """Nova's SchedulerManager, with the GPU plugin's service hooks."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # How often a request was scheduled again after its claims were
        # lost, and how often it still got NoValidHost, retries spent.
        self.claim_retries = {'retried': 0, 'gave_up': 0}

    def init_host(self, service_ref):
        super().init_host(service_ref)
        listener.service_started(self)

    def set_shutdown_in_progress(self):
        super().set_shutdown_in_progress()
        listener.service_stopping(self)

    @messaging.expected_exceptions(exception.NoValidHost)
    def select_destinations(
        self, context, request_spec=None, filter_properties=None,
        spec_obj=_SENTINEL, instance_uuids=None, return_objects=False,
        return_alternates=False,
    ):
        def select(spec):
            return super(GpuSchedulerManager, self).select_destinations(
                context, request_spec=request_spec,
                filter_properties=filter_properties, spec_obj=spec,
                instance_uuids=instance_uuids,
                return_objects=return_objects,
                return_alternates=return_alternates)

        if spec_obj is _SENTINEL or not hasattr(spec_obj, 'obj_clone'):
            # An old conductor's primitives: as Nova does.
            return select(spec_obj)
        spec_obj, selections = self._schedule_again(select, spec_obj)
        filters.notify_placements(spec_obj, instance_uuids, selections)
        return selections

    def _schedule_again(self, select, spec_obj):
        """``(spec_obj, select(spec_obj))``, scheduling the request again
        while its claims are lost to other schedulers (see the module
        doc); the RequestSpec returned is the one the last attempt used.
        """
        retries = CONF.gpu_scheduler.claim_retries
        window = (CONF.gpu_scheduler.claim_retry_seconds
                  * _num_instances(spec_obj))
        group_hosts = _group_hosts(spec_obj)
        start = time.monotonic()
        attempt = 0
        uuid = getattr(spec_obj, 'instance_uuid', None)
        while True:
            filters.forget_pass(spec_obj)
            try:
                return spec_obj, select(spec_obj)
            except Exception as e:
                if not retries or not _is_no_valid_host(e):
                    raise
                # A first attempt that lost no claim was a refusal.
                if not attempt and not filters.claims_lost(spec_obj):
                    raise
                wait = random.uniform(0, RETRY_WAIT * 2 ** attempt)
                spent = time.monotonic() - start
                if attempt >= retries or spent + wait > window:
                    self.claim_retries['gave_up'] += 1
                    LOG.info('GPU request of instance %s: not placed in '
                             '%d attempts racing other schedulers (%.1f '
                             's): NoValidHost', uuid, attempt + 1, spent)
                    raise
            attempt += 1
            self.claim_retries['retried'] += 1
            LOG.info('GPU request of instance %s: %s; scheduling it again '
                     'with fresh allocation candidates in %.2f s (retry '
                     '%d of %d)', uuid,
                     'every claim was lost to other schedulers'
                     if attempt == 1 else 'NoValidHost while racing other '
                     'schedulers', wait, attempt, retries)
            time.sleep(wait)
            spec_obj = _fresh_spec(spec_obj, group_hosts)


def use_in_nova_scheduler():
    """Make ``GpuSchedulerManager`` the manager of the nova-scheduler
    binary in this process (``nova-gpu-scheduler``, before Nova's main).
    """
    nova_service.SERVICE_MANAGERS[BINARY] = MANAGER


def nova_method_params(name):
    """The parameter names of Nova's ``SchedulerManager.<name>`` as the
    installed Nova defines it, under its decorators (oslo.messaging's
    ``expected_exceptions`` keeps no ``__wrapped__``: the function is
    found in its closure), or None.
    """
    import inspect
    func, seen = getattr(nova_manager.SchedulerManager, name), set()
    while func is not None and id(func) not in seen:
        seen.add(id(func))
        func = inspect.unwrap(func)
        if func.__name__ == name:
            return tuple(inspect.signature(func).parameters)
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


def _is_no_valid_host(error):
    """Whether ``error`` is Nova's NoValidHost, as raised through
    oslo.messaging's ``expected_exceptions`` (an ExpectedException
    holding it) or plain.
    """
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


def _num_instances(spec_obj):
    """RequestSpec.num_instances (1 when unset or not a number)."""
    num = (spec_obj.num_instances
           if spec_obj.obj_attr_is_set('num_instances') else 1)
    return num if isinstance(num, int) and num > 0 else 1


def _group_hosts(spec_obj):
    group = (spec_obj.instance_group
             if spec_obj.obj_attr_is_set('instance_group') else None)
    if group is None or not group.obj_attr_is_set('hosts'):
        return None
    return list(group.hosts or ())
