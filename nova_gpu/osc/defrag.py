"""``openstack gpu defrag``: free whole GPUs, NVLink sets or hosts by live
migration.

Reads the cloud's GPU state from nova-gpu-exporter (hosts, their devices
and providers), the servers from Nova and their GPU allocations from
Placement (``core.inventory.read_cloud``), asks the core what to move
(``core.defrag.propose_for_cloud``) and, without ``--dry-run``, carries
the moves out one at a time through Nova's compute API
(``core.defrag.Executor`` with ``cloud_api.Nova.mover``), stopping at the first
failure. One row per move; the plan's reasons go to stderr.
"""

import logging

from osc_lib.command import command
from osc_lib import exceptions

from nova_gpu import cloud_api
from nova_gpu.core import catalog as catalog_mod
from nova_gpu.core import defrag
from nova_gpu.core import exceptions as core_exceptions
from nova_gpu.core import inventory

LOG = logging.getLogger(__name__)

COLUMNS = ('Step', 'Server', 'Source', 'Destination', 'GPU Memory (MiB)',
           'Status', 'Detail')


def rows(steps):
    """One table row per ``defrag.Step``."""
    return [(s.number, s.move.server.id,
             '%s GPU %s' % (s.move.server.host,
                            _gpus(s.move.server.placement)),
             '%s GPU %s' % (s.move.destination.host,
                            _gpus(s.move.destination)),
             s.move.memory_mib, s.status, s.detail) for s in steps]


def _gpus(placement):
    return ','.join(str(g) for g in placement.gpus)


class Defrag(command.Lister):
    """Live-migrate vGPU servers so that large GPU requests fit.

    Targets are the large requests of the demand model (whole-GPU requests
    of at least --min-gpus GPUs, and their NVLink variants) unless
    --target names them. Only vGPU guests Nova can live-migrate are moved
    (mdev-backed, the same vGPU type on the destination, a compatible
    NVIDIA driver), one at a time, stopping at the first failure; nothing
    is ever evicted.
    """

    def get_parser(self, prog_name):
        parser = super().get_parser(prog_name)
        parser.add_argument(
            '--dry-run', action='store_true',
            help='Print the plan, one row per live migration; move nothing')
        parser.add_argument(
            '--target', metavar='<target>', action='append',
            help='What to free, repeatable: whole:N (N free GPUs on one '
                 'host), whole:N:nvlink (an NVLink-connected set), '
                 'vgpu:TYPE:N or host:NAME (empty the host). Default: the '
                 'large requests the demand model expects')
        parser.add_argument(
            '--min-gpus', metavar='<n>', type=int, default=4,
            help='Smallest request counted as large when no --target is '
                 'given (default 4)')
        parser.add_argument(
            '--max-moves', metavar='<n>', type=int, default=4,
            help='Most live migrations carried out in all (default 4)')
        parser.add_argument(
            '--timeout', metavar='<seconds>', type=float, default=600.0,
            help='How long to wait for each live migration (default 600)')
        return parser

    def take_action(self, parsed_args):
        if parsed_args.max_moves < 1 or parsed_args.min_gpus < 1:
            raise exceptions.CommandError(
                '--max-moves and --min-gpus must be at least 1')
        if parsed_args.timeout <= 0:
            raise exceptions.CommandError('--timeout must be above 0')
        try:
            targets = (None if not parsed_args.target else
                       [defrag.parse_target(t) for t in parsed_args.target])
            catalog = catalog_mod.load_catalog()
            cloud = cloud_api.Cloud(self.app.client_manager.sdk_connection)
            hosts, servers, infos, problems = inventory.read_cloud(
                self.app.client_manager.gpu, cloud, catalog)
            if not hosts:
                raise exceptions.CommandError(
                    'nova-gpu-exporter reports no current GPU host')
            for line in problems:
                LOG.warning(line)
            proposal = defrag.propose_for_cloud(
                catalog, hosts, servers, infos, targets,
                min_gpus=parsed_args.min_gpus,
                max_moves=parsed_args.max_moves)
        except core_exceptions.GpuError as e:
            raise exceptions.CommandError(str(e)) from e
        for line in proposal.explain():
            self.app.stderr.write(line + '\n')
        mover = cloud.nova.mover(timeout=parsed_args.timeout)
        steps = defrag.Executor(mover, infos).run(
            proposal.moves, dry_run=parsed_args.dry_run)
        failed = [s for s in steps if s.status == defrag.FAILED]
        if failed:
            # The table still shows what was done before the failure.
            self.app.stderr.write('stopped at step %d: %s\n'
                                  % (failed[0].number, failed[0].detail))
        self.exit_code = 1 if failed else 0
        return COLUMNS, rows(steps)

    def run(self, parsed_args):
        self.exit_code = 0
        return super().run(parsed_args) or self.exit_code
