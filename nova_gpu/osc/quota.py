"""``openstack gpu quota limits``: the Keystone limits that cap GPUs.

Offline: it names, for the catalog's models (or ``--model``), the
resource classes of ``core.quota`` that Nova's unified limits count, and
prints the ``openstack registered limit create`` command of each, for an
operator to run against Keystone (doc/source/quotas.rst).
"""

from osc_lib.command import command
from osc_lib import exceptions

from nova_gpu.core import catalog as catalog_mod
from nova_gpu.core import exceptions as core_exceptions
from nova_gpu.core import quota


class QuotaLimits(command.Lister):
    """Print the registered limits that cap GPUs per model and memory."""

    auth_required = False  # nothing is read from the cloud

    def get_parser(self, prog_name):
        parser = super().get_parser(prog_name)
        parser.add_argument(
            '--model', metavar='<model>', action='append', dest='models',
            help='A catalog GPU model (repeat; default: every model)')
        parser.add_argument(
            '--kind', choices=('vgpu', 'whole'), action='append',
            dest='kinds',
            help='vGPUs or whole GPUs (repeat; default: both)')
        parser.add_argument(
            '--default-limit', type=int, default=0, metavar='<n>',
            help='The default limit of every project (0, the default: none '
                 'unless a project limit allows some; -1: no limit)')
        parser.add_argument('--region', metavar='<region>',
                            help='Keystone region of the limits')
        return parser

    def take_action(self, parsed_args):
        kinds = tuple(k.upper() for k in parsed_args.kinds or ()) or \
            quota.KINDS
        try:
            names = quota.limit_names(catalog_mod.load_catalog(),
                                      parsed_args.models, kinds)
            rows = [(name, what, quota.limit_command(
                name, parsed_args.default_limit, parsed_args.region))
                for name, what in names]
        except core_exceptions.GpuError as e:
            raise exceptions.CommandError(str(e))
        return ('Limit', 'Caps', 'Command'), rows
