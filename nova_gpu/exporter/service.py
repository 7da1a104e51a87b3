"""nova-gpu-exporter: the cloud's GPU figures for Prometheus and the CLI.

Run it once per cloud (or per region) with access to the notification
transport nova-scheduler uses::

    nova-gpu-exporter --config-file /etc/nova-gpu/nova-gpu.conf

It listens to the agents' host reports and the scheduler's nova-gpu
notifications on ``[gpu_exporter] report_topic`` in its own pool, computes
with ``nova_gpu.core`` what each host and the cloud have free, how
fragmented and stranded their GPUs are and which reports are stale, and
serves that on ``[gpu_exporter] listen`` (/metrics and /v1/...).
"""

import sys

from oslo_log import log as logging
import prometheus_client

from nova_gpu.core import catalog as catalog_mod
from nova_gpu import daemon
from nova_gpu.exporter import api
from nova_gpu.exporter import cloud
from nova_gpu.exporter import collector as collector_mod
from nova_gpu.exporter import idle_notices
from nova_gpu.exporter import listener as listener_mod
from nova_gpu.exporter import usage as usage_mod
from nova_gpu import listening

LOG = logging.getLogger(__name__)


def parse_listen(value):
    """``'ADDRESS:PORT'`` -> (address, port); ``[::1]:9836`` for IPv6."""
    host, sep, port = (value or '').strip().rpartition(':')
    if not sep or not host or not port.isdigit() or \
            not 0 <= int(port) < 65536:
        raise ValueError('[gpu_exporter] listen must be ADDRESS:PORT (e.g. '
                         '127.0.0.1:9836), got %r' % (value,))
    return host.strip('[]'), int(port)


class Exporter:
    """State, listener and HTTP server, started and stopped together."""

    def __init__(self, conf, transport=None, catalog=None):
        o = conf.gpu_exporter
        self.state = cloud.CloudState(
            catalog or catalog_mod.load_catalog(conf.gpu.catalog_files),
            reset_after=o.generation_reset_after)
        self.usage = make_usage_book(conf)
        self.state.report_observers.append(self.usage.observe)
        self._owns_transport = transport is None
        self.transport = transport or listening.transport(conf)
        self.idle_notices = idle_notices.make(conf, self.transport)
        if self.idle_notices is not None:
            self.state.report_observers.append(self.idle_notices.observe)
        self.registry = prometheus_client.CollectorRegistry()
        self.registry.register(collector_mod.CloudCollector(
            self.state, stale_after=o.stale_after, usage=self.usage,
            idle_notices=self.idle_notices))
        self.listener = listener_mod.Listener(
            self.state, self.transport, o.report_topic,
            exchange=o.report_exchange, pool=o.pool)
        self.address, port = parse_listen(o.listen)
        self.app = api.Api(self.state, self.registry, o.stale_after,
                           usage=self.usage)
        self.http = None
        self._port = port

    @property
    def port(self):
        return self.http.port if self.http else None

    def start(self):
        self.usage.start()
        self.listener.start()
        self.http = api.HttpServer(self.app, self.address, self._port)
        LOG.info('nova-gpu-exporter on http://%s:%d/ (metrics, /v1)',
                 self.address, self.port)
        return self

    def stop(self):
        if self.http is not None:
            self.http.stop()
            self.http = None
        self.listener.stop()
        if self.idle_notices is not None:
            self.idle_notices.stop()
        # Last: what the listener took until it stopped is written.
        self.usage.stop()
        if self._owns_transport:
            self.transport.cleanup()


def make_usage_book(conf):
    """The usage ledger of ``[gpu_exporter]``, read back from its file."""
    o = conf.gpu_exporter
    if o.usage_ledger and not usage_mod.ledger_dir_ok(o.usage_ledger):
        raise ValueError('[gpu_exporter] usage_ledger %s: its directory '
                         'does not exist' % o.usage_ledger)
    projects = None
    if o.usage_projects:
        projects = usage_mod.NovaProjects(
            lambda: usage_mod.connect(o.cloud))
    return usage_mod.UsageBook(
        o.usage_ledger, max_interval=o.usage_max_interval,
        retention_days=o.usage_retention_days,
        write_interval=o.usage_write_interval, projects=projects)


def prepare(argv):
    conf = daemon.prepare(argv, 'nova-gpu-exporter')
    return conf


def main(argv=None):
    conf = prepare(sys.argv[1:] if argv is None else argv)
    stop = daemon.stop_on_signals()
    exporter = Exporter(conf).start()
    try:
        stop.wait()
    finally:
        exporter.stop()
    return 0


if __name__ == '__main__':
    sys.exit(main())
