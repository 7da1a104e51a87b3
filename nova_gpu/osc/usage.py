"""``openstack gpu usage``: GPU usage for billing, per server and profile.

Reads nova-gpu-exporter's ``/v1/usage`` (the exporter's usage ledger as
last written, ``nova_gpu.exporter.usage``): for each project, server,
GPU model and profile, the seconds its devices were held between
``--start`` and ``--end``, the GPU-seconds (seconds x the device's share
of one GPU) and the frame-buffer GiB-seconds. Times are ISO 8601; a time
without an offset is UTC.
"""

import datetime

from osc_lib.command import command
from osc_lib import exceptions

COLUMNS = (('Project', 'project_id'), ('Server', 'server_id'),
           ('Model', 'model'), ('Profile', 'profile'),
           ('Seconds', 'seconds'), ('GPU Seconds', 'gpu_seconds'),
           ('FB GiB Seconds', 'fb_gib_seconds'), ('First', 'first'),
           ('Last', 'last'))
FIGURES = ('seconds', 'gpu_seconds', 'fb_gib_seconds')


def iso_time(value, option):
    """``value`` (ISO 8601) as an aware ISO 8601 string, UTC when it says
    no offset; CommandError naming ``option`` when it is no time.
    """
    try:
        when = datetime.datetime.fromisoformat(value)
    except ValueError:
        raise exceptions.CommandError(
            '%s %r: not an ISO 8601 time (e.g. 2025-01-31, '
            '2025-01-31T12:00:00Z or 2025-01-31T13:00:00+01:00)'
            % (option, value)) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.timezone.utc)
    return when


class Usage(command.Lister):
    """GPU usage per server, model and profile between two times.

    GPU Seconds count a device's share of one GPU (a whole GPU 1, a vGPU
    or MIG slice its share); FB GiB Seconds the GiB of its frame buffer.
    """

    auth_required = False  # the exporter's API only

    def get_parser(self, prog_name):
        parser = super().get_parser(prog_name)
        parser.add_argument('--project', metavar='<project-id>',
                            help='Only this project (ID); default: all')
        parser.add_argument('--server', metavar='<server-id>',
                            help='Only this server (ID)')
        parser.add_argument('--start', metavar='<time>', required=True,
                            help='Start of the period (ISO 8601; UTC '
                                 'unless it says an offset)')
        parser.add_argument('--end', metavar='<time>',
                            help='End of the period (ISO 8601); default: '
                                 'now')
        return parser

    def take_action(self, parsed_args):
        start = iso_time(parsed_args.start, '--start')
        end = None
        if parsed_args.end is not None:
            end = iso_time(parsed_args.end, '--end')
            if end <= start:
                raise exceptions.CommandError(
                    '--end %s is not after --start %s'
                    % (end.isoformat(), start.isoformat()))
            end = end.isoformat()
        rows = self.app.client_manager.gpu.usage(
            start.isoformat(), end, project=parsed_args.project,
            server=parsed_args.server)
        values = []
        for row in rows:
            row = dict(row)
            for key in FIGURES:
                row[key] = round(row[key], 3)
            values.append(tuple(row[key] for _title, key in COLUMNS))
        return [title for title, _key in COLUMNS], values
