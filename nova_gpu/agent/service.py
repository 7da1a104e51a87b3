"""nova-gpu-agent: the compute-side service.

Runs beside nova-compute with an oslo.config file, e.g.::

    nova-gpu-agent --config-file /etc/nova-gpu/nova-gpu.conf

At start and every ``[gpu_agent] reconcile_interval`` seconds it reconciles
devices, discovers the GPUs, carves idle GPUs to the demand (``[gpu_agent]
carve_enabled``, ``nova_gpu.agent.planning``), writes the provider config
file and publishes the host report.
"""

import os
import sys
import time

from oslo_log import log as logging

from nova_gpu.agent import agent as agent_mod
from nova_gpu.agent import device_events
from nova_gpu.agent import host_metrics as exporter
from nova_gpu.agent import planning
from nova_gpu.agent import privsep
from nova_gpu.agent import publisher as publisher_mod
from nova_gpu.core import report as report_mod
from nova_gpu import daemon

LOG = logging.getLogger(__name__)


def prepare(argv, prog):
    """Read the configuration, set logging up; the ConfigOpts.

    A configuration that cannot be used ends the program with one line
    (``daemon.prepare``).
    """
    conf = daemon.prepare(argv, prog)
    _privsep_in_process_if_root()
    return conf


def configure(prog, config_files=None, overrides=None):
    """``prepare`` for a CLI that parsed its own arguments (``nova-gpu``):
    no command line read, logs on stderr, and ``daemon.ConfigError``
    raised for the CLI to report.

    ``overrides``: ``[DEFAULT]`` options, such as ``debug``.
    """
    conf = daemon.configure([], prog, stderr=True, config_files=config_files,
                            overrides=overrides)
    _privsep_in_process_if_root()
    return conf


def _privsep_in_process_if_root():
    if os.geteuid() == 0:
        # Already root (the service usually is): no privsep daemon needed.
        privsep.use_in_process()


def _wait_keeping_heads(agent, stop, interval, heads_interval):
    """Wait ``interval`` s for the next cycle (or a stop), moving the
    set traits of SR-IOV + mdev GPUs every ``heads_interval`` s meanwhile
    (0: only at the cycles): a guest that took a head must not keep its
    GPU out of multi-GPU requests until the next cycle.
    """
    deadline = time.monotonic() + interval
    while not stop.is_set():
        left = deadline - time.monotonic()
        if left <= 0:
            return
        if not heads_interval or heads_interval >= left:
            stop.wait(left)
            return
        if stop.wait(heads_interval):
            return
        agent.keep_heads()


def main(argv=None):
    conf = prepare(sys.argv[1:] if argv is None else argv, 'nova-gpu-agent')
    opts = conf.gpu_agent
    agent = agent_mod.Agent(conf)
    publisher = publisher_mod.ReportPublisher(
        conf, opts.report_topic, opts.outbox_dir, opts.outbox_max,
        publisher_id='%s.%s' % (report_mod.PUBLISHER, agent.host),
        exchange=opts.report_exchange)
    metrics = exporter.serve(conf, agent)  # [gpu_agent] metrics_listen
    events = device_events.DeviceEvents(conf, agent.host, agent.libvirt)
    demand = None
    if agent.demand is not None and agent.demand.use_published:
        try:
            demand = planning.DemandListener(conf, agent.demand,
                                             agent.host).start()
        except Exception as e:  # the static demand (if any) still counts
            LOG.error('cannot listen for the GPU demand (%s): carving to '
                      '[gpu_agent] carve_static_demand only', e)
    stop = daemon.stop_on_signals()
    LOG.info('nova-gpu-agent on %s (node %s) starting', agent.host,
             agent.nodename)
    try:
        # Before the first report: the GPUs' carved layouts, lost at a
        # reboot, are made again (nova-gpu-restore.service usually did it).
        restored = agent.restore_layouts()
        if restored.restored or restored.failed:
            LOG.info('GPU layouts restored: %s; failed: %s',
                     restored.restored, restored.failed)
    except Exception:
        LOG.exception('restoring the GPU layouts failed; continuing')
    try:
        while not stop.is_set():
            try:
                result = agent.cycle(publisher)
                metrics.observe(result)
                events.observe(result)
                LOG.info('GPU cycle: report generation %d, %d GPUs '
                         '(%d NVML cannot read, left out), reconcile '
                         '%.3fs, discovery %.3fs, %s reports unsent',
                         result['report']['generation'],
                         len(result['report']['gpus']),
                         len(result['unreadable_gpus']),
                         result['timings']['reconcile_s'],
                         result['timings']['discover_s'],
                         result['unsent_reports'])
            except Exception:
                metrics.failed()
                LOG.exception('GPU agent cycle failed; retrying next cycle')
            if not opts.reconcile_interval:
                break
            _wait_keeping_heads(agent, stop, opts.reconcile_interval,
                                opts.heads_interval)
    finally:
        if demand is not None:
            demand.stop()
        metrics.stop()
        events.close()
        publisher.close()
        agent.close()
    return 0


if __name__ == '__main__':
    sys.exit(main())
