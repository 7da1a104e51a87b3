"""``openstack gpu idle``: guest GPU devices idle for a while.

Reads nova-gpu-exporter's ``/v1/idle``: each guest device whose host's
agent found it under ``[gpu_agent] idle_threshold`` for ``idle_after``
seconds (``nova_gpu.core.idle``), since when, its observed peak and the
smaller profile that peak fits (the right-sizing suggestion).
"""

from osc_lib.command import command

COLUMNS = (('Host', 'host'), ('Server', 'server_id'), ('Model', 'model'),
           ('Kind', 'kind'), ('Profile', 'profile'),
           ('Idle (s)', 'seconds'), ('Since', 'since'),
           ('Peak Compute', 'peak_compute'),
           ('Peak Memory (MiB)', 'peak_memory_mib'),
           ('Suggestion', 'suggestion'), ('Device', 'device'))


class Idle(command.Lister):
    """List guest GPU devices that have stayed idle, with a smaller size.

    Peak Compute is a share of one GPU; Suggestion is the smallest device
    (same model, or a smaller model for a guest that barely computes)
    that the observed peak fits, empty when none is smaller.
    """

    auth_required = False  # the exporter's API only

    def get_parser(self, prog_name):
        parser = super().get_parser(prog_name)
        parser.add_argument('--host', metavar='<host>',
                            help='Only devices of this compute host')
        parser.add_argument('--model', metavar='<model>',
                            help='Only devices of this GPU model')
        parser.add_argument('--min-seconds', metavar='<seconds>', type=float,
                            default=0.0,
                            help='Only devices idle at least this long')
        return parser

    def take_action(self, parsed_args):
        rows = []
        for row in self.app.client_manager.gpu.idle():
            if parsed_args.host and row['host'] != parsed_args.host:
                continue
            if parsed_args.model and row['model'] != parsed_args.model:
                continue
            if (row.get('seconds') or 0) < parsed_args.min_seconds:
                continue
            row = dict(row)
            for key in ('seconds', 'peak_compute', 'peak_memory_mib'):
                if row.get(key) is not None:
                    row[key] = round(row[key], 3)
            rows.append(row)
        rows.sort(key=lambda r: (-(r.get('seconds') or 0), r['host'],
                                 r.get('device') or ''))
        return ([title for title, _key in COLUMNS],
                [tuple(r.get(key) for _title, key in COLUMNS) for r in rows])
