"""nova-gpu-reclaimer: evicts spot GPU servers for on-demand ones.

Run it once per cloud with admin credentials (``[gpu_reclaimer] cloud``)
and access to the notification transport::

    nova-gpu-reclaimer --config-file /etc/nova-gpu/nova-gpu.conf

Triggers (``doc/source/economics.rst``):

* Nova refused an on-demand GPU instance for capacity (versioned
  ``compute_task.build_instances.error`` with NoValidHost): room is made
  for its flavor, and its owner is told (``gpu.reclaim.room``) to boot it
  again;
* every ``headroom_interval`` seconds, when fewer than ``headroom_floor``
  servers of ``headroom_flavor`` fit in free GPU capacity, room is made
  until they do, so that on-demand boots are not refused at all.

A decision is planned with ``Reclaimer`` (the core's move planner) on the
hosts of fresh GPU reports and the servers Nova and Placement list
(``inventory``), then carried out by ``executor.Executor``. One worker
thread handles the triggers in turn, so two decisions never race for one
server; each plans from fresh state.
"""

import queue
import sys
import threading

from oslo_log import log as logging

from nova_gpu.core import catalog as catalog_mod
from nova_gpu.core import flavor
from nova_gpu.core import moves
from nova_gpu import daemon
from nova_gpu import listening
from nova_gpu import owner_notice
from nova_gpu.reclaim import events
from nova_gpu.reclaim import executor as executor_mod
from nova_gpu.reclaim import grammar as grammar_mod
from nova_gpu.reclaim import listener as listener_mod
from nova_gpu.reclaim import notices as notification
from nova_gpu.reclaim import planner_view as inventory
from nova_gpu.reclaim import reclaimer as reclaimer_mod

LOG = logging.getLogger(__name__)
_HEADROOM = object()


class ReclaimService:
    """State, decisions and (once started) listener and worker.

    ``compute``: the compute/Placement client (``compute.SdkCompute``);
    ``notifier``: a ``notification.Notifier`` (default, made by
    ``start``: oslo.messaging on the report topic of the transport);
    ``catalog``: default ``[gpu] catalog_files``. Flavors are read with
    the core's grammar and the ``[gpu_scheduler]`` names of ``conf``
    (``grammar``).
    """

    def __init__(self, conf, compute, transport=None, notifier=None,
                 catalog=None, clock=None):
        o = conf.gpu_reclaimer
        self.conf = conf
        self.compute = compute
        self.is_spot = grammar_mod.is_spot
        self.catalog = catalog or catalog_mod.load_catalog(
            conf.gpu.catalog_files)
        self.names = flavor.PathNames.from_options(conf.gpu_scheduler)
        kw = {'clock': clock} if clock else {}
        self.store = inventory.ReportStore(
            self.catalog, o.generation_reset_after, **kw)
        self.stale_after = o.stale_after
        self.room_report_timeout = o.room_report_timeout
        self.dry_run = o.dry_run
        self.reclaimer = reclaimer_mod.Reclaimer(
            moves.MovePlanner(max_moves=o.max_evictions), action=o.action,
            grace_s=o.grace_period)
        self._transport = transport
        self._owns_transport = False
        self.notifier = notifier
        self._stop = threading.Event()
        self.executor = executor_mod.Executor(
            compute, self.is_spot, notifier, timeout_s=o.eviction_timeout,
            stop=self._stop, **kw)
        self.headroom_floor = o.headroom_floor
        self.headroom_flavor = o.headroom_flavor
        self.headroom_interval = o.headroom_interval
        self._queue = queue.Queue()
        self._listener = None
        self._worker = None

    # -- decisions (synchronous; the worker calls them) ---------------------

    def inventory(self):
        return inventory.build(self.store.fresh(self.stale_after),
                               self.compute.servers(), self.catalog,
                               self.is_spot)

    def requests_of(self, extra_specs, vcpus=0, memory_mb=0):
        """The GpuRequests a flavor may be served with (``grammar``)."""
        return grammar_mod.requests_of(extra_specs, self.catalog,
                                       self.names, vcpus, memory_mb)

    def handle_refusal(self, refused):
        """Make room for a refused instance; the executor's EvictionResult, or
        None when nothing is done (spot or GPU-less flavor, no plan).
        """
        LOG.info('Nova refused instance %s (flavor %s) with NoValidHost',
                 refused.instance_uuid, refused.flavor_name)
        if self.is_spot(refused.extra_specs):
            LOG.info('Refused instance %s is spot itself: nothing evicted',
                     refused.instance_uuid)
            return None
        requests = self.requests_of(refused.extra_specs, refused.vcpus,
                                    refused.memory_mb)
        if not requests:
            return None
        inv = self.inventory()
        decision = None
        for req in requests:
            decision = self.reclaimer.for_request(inv.hosts, inv.servers,
                                                  req)
            if decision is not None:
                break
        if decision is None:
            LOG.info('No spot servers to evict for refused instance %s '
                     '(flavor %s)', refused.instance_uuid,
                     refused.flavor_name)
            return None
        host = decision.plans[0].host
        before = self.store.version(host)
        outcome = self._carry_out(decision, inv, 'instance %s'
                                  % refused.instance_uuid)
        if outcome is not None and outcome.ok and self.notifier:
            # The schedulers place on what the agents report: the owner is
            # told once the host's agent has reported the room.
            if self.room_report_timeout and not self.store.wait_newer(
                    host, before, self.room_report_timeout):
                LOG.warning('No GPU report of %s within %d s of evicting '
                            'for instance %s: telling its owner anyway; '
                            'a boot may be refused until that host '
                            'reports', host, self.room_report_timeout,
                            refused.instance_uuid)
            self.notifier.send(notification.RoomPayload(
                refused.instance_uuid, list(outcome.evicted),
                refused.project_id, refused.user_id, host))
            LOG.info('Room made on %s for instance %s: its owner told '
                     '(%s)', host, refused.instance_uuid,
                     notification.ROOM_EVENT)
        return outcome

    def headroom_request(self):
        specs, vcpus, ram = self.compute.flavor(self.headroom_flavor)
        requests = self.requests_of(specs, vcpus, ram)
        if not requests:
            raise ValueError('[gpu_reclaimer] headroom_flavor %s asks no GPU '
                             'device the scheduler can read'
                             % self.headroom_flavor)
        return requests[0]

    def check_headroom(self):
        """Evict until the floor is met; an EvictionResult, or None."""
        if not self.headroom_floor:
            return None
        inv = self.inventory()
        reclaimer = reclaimer_mod.Reclaimer(
            self.reclaimer.planner, action=self.reclaimer.action,
            grace_s=self.reclaimer.grace_s, floor=self.headroom_floor,
            reference=self.headroom_request())
        if reclaimer.headroom(inv.hosts) >= self.headroom_floor:
            return None
        decision = reclaimer.for_headroom(inv.hosts, inv.servers)
        if decision is None:
            LOG.warning('Headroom below the floor of %d and spot capacity '
                        'cannot restore it', self.headroom_floor)
            return None
        return self._carry_out(decision, inv, 'the headroom floor')

    def _carry_out(self, decision, inv, what):
        for line in decision.explain():
            LOG.info('Reclaim plan for %s: %s', what, line)
        if self.dry_run:
            LOG.info('[gpu_reclaimer] dry_run: nothing done')
            return None
        outcome = self.executor.carry_out(decision, inv.info)
        LOG.info('Reclaim for %s: evicted %s%s', what,
                 ', '.join(outcome.evicted) or 'none',
                 '' if outcome.ok else ' (stopped: %s)' % outcome.failed)
        return outcome

    # -- service ------------------------------------------------------------

    def submit(self, refused):
        self._queue.put(refused)

    def _run(self):
        clock = self.executor.clock
        due = clock() + self.headroom_interval
        while not self._stop.is_set():
            try:
                item = self._queue.get(timeout=max(0.0, due - clock()))
            except queue.Empty:
                item = _HEADROOM
            if self._stop.is_set():
                break
            if item is not _HEADROOM and clock() >= due:
                # Refusals arriving without a pause must not starve the
                # periodic check: it runs after this one.
                self._queue.put(_HEADROOM)
            if item is _HEADROOM:
                due = clock() + self.headroom_interval
            try:
                if item is _HEADROOM:
                    self.check_headroom()
                elif item is not None:
                    self.handle_refusal(item)
            except Exception:
                LOG.exception('Reclaim failed; the next trigger plans '
                              'afresh')

    def start(self):
        if self._transport is None:
            self._transport = listening.transport(self.conf)
            self._owns_transport = True
        if self.notifier is None:
            # Its notices (gpu.reclaim.notice, .evicted, .room) go out on
            # the transport it listens on, given or made here (as ``main``
            # runs it: none was sent before, found in devstack).
            self.notifier = notification.Notifier(
                owner_notice.messaging_notifier(
                    self._transport, notification.PUBLISHER,
                    self.conf.gpu_reclaimer.report_topic))
            self.executor.notifier = self.notifier
        self._listener = listener_mod.listener(
            self._transport, listener_mod.Endpoint(self.store, self.submit),
            self.conf)
        self._listener.start()
        o = self.conf.gpu_reclaimer
        # What it waits for, once: a reclaimer that never acts is then
        # told from one that hears nothing (Nova's versioned notifications
        # off, another exchange or topic).
        LOG.info('Listening for GPU reports on topic %s (exchange %s) and '
                 'Nova\'s %s on topic %s (exchange %s); evicting by %s '
                 'after %d s%s', o.report_topic, o.report_exchange,
                 events.BUILD_ERROR, o.nova_topic, o.nova_exchange,
                 o.action, o.grace_period,
                 ' (dry run: nothing done)' if o.dry_run else '')
        self._worker = threading.Thread(target=self._run,
                                        name='nova-gpu-reclaimer',
                                        daemon=True)
        self._worker.start()
        return self

    def stop(self):
        self._stop.set()
        self._queue.put(None)
        if self._listener is not None:
            self._listener.stop()
            self._listener = None
        if self._worker is not None:
            self._worker.join(timeout=10)
            self._worker = None
        if self._owns_transport and self._transport is not None:
            self._transport.cleanup()
            self._transport = None


def prepare(argv):
    conf = daemon.prepare(argv, 'nova-gpu-reclaimer')
    problem = conf_problem(conf)
    if problem:
        raise SystemExit(problem)
    return conf


def conf_problem(conf):
    """What is wrong with ``[gpu_reclaimer]``, or None."""
    o = conf.gpu_reclaimer
    if o.headroom_floor and not o.headroom_flavor:
        return ('[gpu_reclaimer] headroom_floor = %d needs headroom_flavor '
                '(the on-demand flavor it counts)' % o.headroom_floor)
    return None


def main(argv=None):
    from nova_gpu.reclaim import compute as compute_mod
    conf = prepare(sys.argv[1:] if argv is None else argv)
    stop = daemon.stop_on_signals()
    service = ReclaimService(
        conf, compute_mod.SdkCompute(cloud=conf.gpu_reclaimer.cloud)).start()
    try:
        stop.wait()
    finally:
        service.stop()
    return 0


if __name__ == '__main__':
    sys.exit(main())
