"""``openstack gpu flavor keys``: the Nova keys a ``gpu:`` flavor needs.

Offline: it reads the flavor grammar of ``core.flavor`` with the catalog
and nova-gpu's default resource classes and aliases (``[gpu_scheduler]``
defaults; pass ``--vgpu-resource-class`` and the alias options where a
cloud changed them), and prints the Placement / PCI keys of
``core.flavor.placement_extra_specs``, set traits included, for
``openstack flavor set --property``. ``--quota`` adds the GPU quota
classes of ``core.quota.extra_specs`` (doc/source/quotas.rst).
"""

from osc_lib.command import command
from osc_lib import exceptions

from nova_gpu.core import catalog as catalog_mod
from nova_gpu.core import exceptions as core_exceptions
from nova_gpu.core import flavor
from nova_gpu.core import quota
from nova_gpu.core import report


class FlavorKeys(command.Lister):
    """Print the Nova extra specs a flavor with these gpu: keys needs."""

    auth_required = False  # nothing is read from the cloud

    def get_parser(self, prog_name):
        parser = super().get_parser(prog_name)
        parser.add_argument(
            '--property', metavar='<gpu:key=value>', action='append',
            required=True, dest='properties',
            help='A gpu: extra spec of the flavor (repeat), e.g. '
                 '--property gpu:profile=H100-20C --property gpu:count=4')
        parser.add_argument(
            '--plain', action='store_true',
            help='Without set traits: for a cloud whose agents do not keep '
                 'them (stock Nova groups; slow for several devices)')
        parser.add_argument(
            '--quota', action='store_true',
            help='Also the GPU quota classes (per model, GPU memory) that '
                 'Nova\'s unified limits cap: only for clouds whose agents '
                 'offer them ([gpu_agent] quota_inventory)')
        parser.add_argument('--vgpu-resource-class', default=report.VGPU_RC)
        parser.add_argument('--vfio-vgpu-alias',
                            default=report.VFIO_VGPU_ALIAS)
        parser.add_argument('--whole-gpu-alias',
                            default=report.WHOLE_GPU_ALIAS)
        parser.add_argument('--vgpu-backend', default='mdev',
                            choices=flavor.BACKENDS)
        return parser

    def take_action(self, parsed_args):
        specs = {}
        for item in parsed_args.properties:
            key, sep, value = item.partition('=')
            if not sep or not key.startswith(flavor.PREFIX):
                raise exceptions.CommandError(
                    '--property %r: expected gpu:<key>=<value>' % item)
            specs[key] = value
        names = flavor.PathNames(
            vgpu_rc=parsed_args.vgpu_resource_class,
            vfio_alias=parsed_args.vfio_vgpu_alias,
            whole_alias=parsed_args.whole_gpu_alias,
            backend=parsed_args.vgpu_backend,
            max_gpu_count=flavor.MAX_COUNT)
        catalog = catalog_mod.load_catalog()
        try:
            spec = flavor.parse(specs, catalog, names=names)
        except core_exceptions.GpuError as e:
            raise exceptions.CommandError(str(e))
        if spec is None:
            raise exceptions.CommandError('these keys ask no GPU device')
        keys = flavor.placement_extra_specs(spec, names,
                                            sets=not parsed_args.plain)
        if parsed_args.quota:
            keys.update(quota.extra_specs(spec, catalog))
        return ('Key', 'Value'), sorted(keys.items())
