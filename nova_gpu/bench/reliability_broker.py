"""Reliability: scheduling and reporting while the broker fails.

Part ``broker`` of ``nova_gpu.bench.reliability``. The scheduler's
notifications (refusals, placements, demand publications) go over the
``rabbit`` transport, as in nova-scheduler, to a broker that is

* *up*: the RabbitMQ node on 127.0.0.1:5672 if one runs, else
  oslo.messaging's in-process ``fake`` driver (a broker that takes every
  message at once);
* *stopped*: nothing listens on the port (connection refused);
* *hung*: a TCP server that accepts connections and never answers, what
  a RabbitMQ node stopped with SIGSTOP looks like to its clients (the
  kernel completes the handshake, nothing replies).

For each, measured (``scheduler.notifications``' calls, and with Nova
installed whole ``GpuFilter`` passes through Nova's ``HostFilterHandler``
on 40 hosts, half of them refused, each followed by the placement
notification nova-gpu-scheduler sends for Nova's selection):

* the median and 99th percentile call, against the broker up: unchanged
  within noise (target: the 99th percentile under ``CALL_BOUND_MS``; a
  pass's median within ``PASS_NOISE`` of the up one). The maximum is
  shown, not judged: on a loaded machine the OS deschedules any thread
  for tens of ms, with the broker up as well;
* with the broker up, none failed or dropped, and how many the sender
  sends per second (RabbitMQ confirms each publish);
* messages dropped with the queue full (hung, a queue of ``QUEUE``):
  every one counted (queued = sent + failed + dropped + still queued);
* the agent's report publish (``agent.publisher``) with a send timeout
  of ``AGENT_TIMEOUT`` s: back within it plus half a second.

Runs in seconds; traffic only to 127.0.0.1.
"""

import contextlib
import socket
import statistics
import tempfile
import threading
import time
import types

from oslo_config import cfg

from nova_gpu.bench import reliability
import nova_gpu.conf  # noqa: F401 (registers [gpu_scheduler])

PART = 'broker'
CALLS = 1000
QUICK_CALLS = 300
PASSES = 40
QUICK_PASSES = 10
QUEUE = 50
# 99 calls in 100 take less, whatever the broker does ("a few ms").
CALL_BOUND_MS = 5.0
# A pass's median with the broker down or hung may exceed the up one by
# this factor plus PASS_SLACK_MS (noise of a shared 2-core machine).
PASS_NOISE = 1.5
PASS_SLACK_MS = 0.5
AGENT_TIMEOUT = 1.0
# How long the sender may take to send what the calls queued, broker up.
UP_WAIT = 3.0
SHARED = ('127.0.0.1', 5672)


class HungBroker:
    """Accepts TCP connections and never answers (a SIGSTOPped node)."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(('127.0.0.1', 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.held = []
        self._thread = threading.Thread(target=self._accept, daemon=True,
                                        name='bench-hung-broker')
        self._thread.start()

    def _accept(self):
        while True:
            try:
                conn, _addr = self.sock.accept()
            except OSError:
                return
            self.held.append(conn)

    def close(self):
        self.sock.close()
        for conn in self.held:
            conn.close()


def _closed_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def _shared_up():
    try:
        socket.create_connection(SHARED, timeout=1).close()
        return True
    except OSError:
        return False


@contextlib.contextmanager
def _brokers(shared=True):
    """{mode: transport URL}, and what the up one is (``shared``: the
    RabbitMQ node on 127.0.0.1:5672 if one runs).
    """
    hung = HungBroker()
    try:
        if shared and _shared_up():
            up, what = 'rabbit://guest:guest@%s:%d/' % SHARED, 'RabbitMQ'
        else:
            up, what = 'fake:/', 'in-process fake driver'
        yield {'up': up,
               'stopped': 'rabbit://guest:guest@127.0.0.1:%d/'
                          % _closed_port(),
               'hung': 'rabbit://guest:guest@127.0.0.1:%d/' % hung.port}, what
    finally:
        hung.close()


def _configure(url, queue=None):
    from nova_gpu import listening
    from nova_gpu.scheduler import notifier as notifications
    notifications.reset()
    notifications.set_notifier(None)
    conf = cfg.CONF
    # Registers [oslo_messaging_notifications] before it is overridden,
    # and loads the rabbit driver, as nova-scheduler's RPC transport has
    # (the first load imports kombu: a few hundred ms, once a process).
    for loaded in ('fake:/', 'rabbit://127.0.0.1:%d/' % _closed_port()):
        listening.transport(conf, url=loaded).cleanup()
    conf.set_override('transport_url', url,
                      group='oslo_messaging_notifications')
    conf.set_override('notification_queue_size', queue or 1000,
                      group='gpu_scheduler')


def _percentile(values, share):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * share))]


def _timed(call):
    start = time.perf_counter()
    call()
    return (time.perf_counter() - start) * 1000


def _calls(n):
    """(times in ms of n notification calls of each kind)."""
    from nova_gpu.scheduler import notifier as notifications
    times = []
    for i in range(n):
        times.append(_timed(lambda: notifications.refused(
            'uuid-%d' % i, {'no_gpu_fits': 3, 'topology': 1}, 2,
            request='bench')))
        times.append(_timed(lambda: notifications.placed(
            'host-%d' % i, [0, 1], instance_uuid='uuid-%d' % i,
            slots=[(0, 'vgpu', 'A100-10C'), (1, 'vgpu', 'A100-10C')],
            request='bench', fragmentation_delta=0.25)))
        times.append(_timed(lambda: notifications.demand_updated(
            [], version=i, requests=i)))
    return times


class _Passes:
    """GpuFilter passes through Nova's filter handler (Nova installed)."""

    def __init__(self):
        from nova import objects
        from nova.scheduler import filters as nova_filters
        from nova.scheduler import host_manager
        from nova_gpu.scheduler import filters
        from nova_gpu.scheduler import view as view_mod
        from nova_gpu.tests.unit.scheduler import base
        objects.register_all()
        self.objects, self.host_manager = objects, host_manager
        self.filters = filters
        self.handler = nova_filters.HostFilterHandler()
        self.view = view_mod.GpuView(base.CATALOG)
        self.names = []
        for i in range(PASSES):
            name = 'h%d' % i
            model, vgpu = (('A100-40GB', 'A100-10C') if i % 2 else
                           ('H100-80GB', 'H100-10C'))
            self.view.ingest(base.gpu_report(name, model, vgpu_type=vgpu))
            self.view.set_provider_uuids(name, {
                base.provider(name, g): '%s-rp%d' % (name, g)
                for g in range(4)})
            self.names.append(name)
        self.filter = filters.GpuFilter(self.view)
        self.serial = 0

    def _state(self, name):
        state = self.host_manager.HostState(name, name, 'cell')
        state.uuid = name + '-root'
        state.allocation_candidates = [
            {'allocations': {'%s-rp%d' % (name, g): {
                'resources': {'VGPU': 1}}},
             'mappings': {'': ['%s-rp%d' % (name, g)]}} for g in range(4)]
        return state

    def one(self):
        """One request: a pass (refusing half the hosts), then the
        placement notification of the host chosen.
        """
        self.serial += 1
        flavor = self.objects.Flavor(
            name='bench', vcpus=2, memory_mb=2048, root_gb=1,
            ephemeral_gb=0, swap=0,
            extra_specs={'gpu:profile': 'A100-10C', 'resources:VGPU': '1'})
        uuid = '00000000-0000-0000-0000-%012d' % self.serial
        spec_obj = self.objects.RequestSpec(
            flavor=flavor, instance_uuid=uuid, num_instances=1,
            scheduler_hints={}, ignore_hosts=None, force_hosts=None,
            force_nodes=None)
        states = [self._state(name) for name in self.names]
        start = time.perf_counter()
        passed = self.handler.get_filtered_objects([self.filter], states,
                                                   spec_obj)
        # As nova-gpu-scheduler's select_destinations, with Nova's
        # selection (manager.GpuSchedulerManager).
        self.filters.notify_placements(spec_obj, [uuid], [[
            types.SimpleNamespace(service_host=passed[0].host,
                                  nodename=passed[0].nodename)]])
        return (time.perf_counter() - start) * 1000


def _passes(n):
    try:
        import nova  # noqa: F401 (the bench and functional envs)
    except ImportError:
        return None
    passes = _Passes()
    passes.one()   # warm: the view scores each host state once
    return [passes.one() for _ in range(n)]


def _agent_publish(url):
    from nova_gpu.agent import publisher
    conf = cfg.ConfigOpts()
    conf([], project='nova-gpu-bench')
    pub = publisher.ReportPublisher(conf, 'gpu_reports_bench',
                                    tempfile.mkdtemp(), url=url, retry=0,
                                    send_timeout=AGENT_TIMEOUT)
    try:
        start = time.perf_counter()
        pending = pub.publish({'generation': 1})
        return time.perf_counter() - start, pending
    finally:
        pub.close()


def run(quick=False, calls=None, filter_passes=True, agent=True,
        shared=True):
    from nova_gpu.scheduler import notifier as notifications
    n = calls or (QUICK_CALLS if quick else CALLS)
    n_passes = QUICK_PASSES if quick else PASSES
    rows = []

    def figure(name, value, target, ok):
        rows.append(reliability.Figure(PART, name, value, target, ok))
    measured = {}
    saved = notifications.STOP_TIMEOUT
    try:
        with _brokers(shared) as (urls, what):
            for mode in ('up', 'stopped', 'hung'):
                # Room for every call: the queue's bound is measured
                # below, on its own.
                _configure(urls[mode], queue=10 * n)
                start = time.monotonic()
                times = _calls(n)
                passes = _passes(n_passes) if filter_passes else None
                measured[mode] = (times, passes)
                if mode == 'up':
                    notifications.flush(UP_WAIT)
                    up_counts = notifications.stats()
                    up_rate = up_counts['sent'] / (time.monotonic() - start)
                # Not waiting on the broker between modes.
                notifications.STOP_TIMEOUT = 0.1
            _configure(urls['hung'], queue=QUEUE)
            _calls(n)
            counts = notifications.stats()
            agent_times = ({mode: _agent_publish(urls[mode])
                            for mode in ('stopped', 'hung')}
                           if agent else {})
    finally:
        notifications.reset()
        notifications.STOP_TIMEOUT = saved
        notifications.set_notifier(None)
        for opt, group in (('transport_url', 'oslo_messaging_notifications'),
                           ('notification_queue_size', 'gpu_scheduler')):
            cfg.CONF.clear_override(opt, group=group)
    up_times, up_passes = measured['up']
    for mode in ('up', 'stopped', 'hung'):
        times, passes = measured[mode]
        label = 'broker %s%s' % (mode, ' (%s)' % what if mode == 'up'
                                 else '')
        p99 = _percentile(times, 0.99)
        figure('%s: notification call, median / p99 / max (ms)' % label,
               '%.3f / %.2f / %.1f' % (statistics.median(times), p99,
                                       max(times)),
               'p99 < %g' % CALL_BOUND_MS, p99 < CALL_BOUND_MS)
        if passes is None:
            continue
        bound = statistics.median(up_passes) * PASS_NOISE + PASS_SLACK_MS
        median = statistics.median(passes)
        figure('%s: filter pass + placement, median / max (ms)' % label,
               '%.2f / %.2f' % (median, max(passes)),
               '-' if mode == 'up' else 'median < %.2f' % bound,
               mode == 'up' or median < bound)
    figure('broker up: sent / queued in %g s (sent per s), failed, '
           'dropped' % UP_WAIT,
           '%d / %d (%.0f), %d, %d' % (
               up_counts['sent'], up_counts['queued'], up_rate,
               up_counts['failed'], up_counts['dropped']),
           '-, 0, 0', not up_counts['failed'] and not up_counts['dropped'])
    accounted = (counts['sent'] + counts['failed'] + counts['dropped'] +
                 counts['pending'] + (1 if counts['sending_s'] else 0))
    figure('broker hung, queue of %d: dropped / queued' % QUEUE,
           '%d / %d' % (counts['dropped'], counts['queued']),
           'every one counted',
           counts['dropped'] > 0 and accounted == counts['queued'])
    for mode, (took, pending) in sorted(agent_times.items()):
        figure('broker %s: agent report publish (s), reports kept' % mode,
               '%.2f, %d' % (took, pending),
               '< %g, 1' % (AGENT_TIMEOUT + 0.5),
               took < AGENT_TIMEOUT + 0.5 and pending == 1)
    return rows


if __name__ == '__main__':
    import sys
    sys.exit(reliability.part_main(PART, run))
