"""nova-gpu-defrag: ``openstack gpu defrag`` every ``[gpu_defrag]
interval`` seconds.

Off by default (``interval = 0``: the service logs so and exits). Each run
reads the cloud's GPU state from nova-gpu-exporter, the servers and their
allocations from Nova and Placement, plans live migrations for the
targets (``[gpu_defrag] targets``, else the large requests of the demand
model) and carries at most ``max_moves`` of them out, one at a time,
stopping at the first failure; every decision and step is logged. A run
that fails (the exporter or the cloud unreachable) is logged and the next
one tried at the next interval.
"""

import sys

from oslo_log import log as logging

from nova_gpu import cloud_api
from nova_gpu.core import catalog as catalog_mod
from nova_gpu.core import defrag
from nova_gpu.core import exceptions as core_exceptions
from nova_gpu.core import inventory
from nova_gpu import daemon
from nova_gpu import exporter_client

LOG = logging.getLogger(__name__)


class ExporterReader(exporter_client.ExporterClient):
    """The reads ``core.inventory.read_cloud`` needs from the exporter;
    its errors stop one run, named, as the core's.
    """

    def _get(self, path):
        try:
            return super()._get(path)
        except exporter_client.ExporterError as e:
            raise core_exceptions.InvalidRequest(str(e)) from e


class Defragmenter:
    """One run at a time, on the exporter and connection given."""

    def __init__(self, conf, exporter, conn, catalog):
        o = conf.gpu_defrag
        self.options = o
        self.exporter = exporter
        self.conn = conn
        self.cloud = cloud_api.Cloud(conn)
        self.catalog = catalog
        # Bad targets stop the service at start, naming the value.
        self.targets = ([defrag.parse_target(t) for t in o.targets]
                        if o.targets else None)

    def run_once(self):
        """The steps of one run (empty when nothing needs moving)."""
        o = self.options
        hosts, servers, infos, problems = inventory.read_cloud(
            self.exporter, self.cloud, self.catalog)
        for line in problems:
            LOG.warning('defrag: %s', line)
        proposal = defrag.propose_for_cloud(
            self.catalog, hosts, servers, infos, self.targets,
            min_gpus=o.min_gpus, max_moves=o.max_moves)
        for line in proposal.explain():
            LOG.info('defrag: %s', line)
        mover = self.cloud.nova.mover(timeout=o.migration_timeout,
                                      interval=o.poll_interval)
        steps = defrag.Executor(mover, infos).run(proposal.moves,
                                                  dry_run=o.dry_run)
        for s in steps:
            log = LOG.error if s.status == defrag.FAILED else LOG.info
            log('defrag: step %d %s: %s (%.1f s)', s.number, s.status,
                s.detail, s.seconds)
        return steps


def prepare(argv):
    conf = daemon.prepare(argv, 'nova-gpu-defrag')
    return conf


def connect(conf):
    return cloud_api.connect(conf.gpu_defrag.cloud)


def serve(defragmenter, interval, stop):
    """Run every ``interval`` seconds until ``stop`` is set."""
    while not stop.is_set():
        try:
            defragmenter.run_once()
        except Exception:  # one bad run must not end the service
            LOG.exception('defrag: run failed; next one in %d s', interval)
        stop.wait(interval)


def main(argv=None):
    conf = prepare(sys.argv[1:] if argv is None else argv)
    o = conf.gpu_defrag
    if not o.interval:
        LOG.info('periodic defragmentation is off ([gpu_defrag] interval '
                 '= 0)')
        return 0
    catalog = catalog_mod.load_catalog(conf.gpu.catalog_files)
    defragmenter = Defragmenter(conf, ExporterReader(o.exporter_url),
                                connect(conf), catalog)
    stop = daemon.stop_on_signals()
    serve(defragmenter, o.interval, stop)
    return 0


if __name__ == '__main__':
    sys.exit(main())
