"""nova-gpu commands that change the host: create, remove, attach,
detach."""

from nova_gpu.agent.cli import base
from nova_gpu.agent.cli import inventory
from nova_gpu.agent import errors
from nova_gpu.agent import xmlbuild


class CreateMdev(base.Action):
    """Create a persistent mdev via libvirt; prints its UUID."""

    def get_parser(self, prog_name):
        parser = super().get_parser(prog_name)
        parser.add_argument('parent', help='parent PCI address (PF or VF)')
        parser.add_argument('type', help='mdev type id, e.g. nvidia-222')
        parser.add_argument('--uuid')
        return parser

    def result(self, agent, args):
        return agent.manager.create_mdev(args.parent, args.type,
                                         uuid=args.uuid)


class CreateVgpu(base.Action):
    """Create a vendor VFIO vGPU on a VF (or a PF's first free VF).

    Prints the VF's address.
    """

    def get_parser(self, prog_name):
        parser = super().get_parser(prog_name)
        parser.add_argument('address', help='PF or VF PCI address')
        parser.add_argument('type_id', type=int, help='vGPU type id')
        return parser

    def result(self, agent, args):
        return agent.manager.create_vf_vgpu(args.address, args.type_id)


class CreateMig(base.Action):
    """Create a MIG GPU instance with its compute instance."""

    def get_parser(self, prog_name):
        parser = super().get_parser(prog_name)
        parser.add_argument('gpu', type=int,
                            help='GPU index, as nova-gpu list shows it')
        parser.add_argument('profile', help='MIG profile, e.g. 3g.20gb')
        parser.add_argument('--start', type=int,
                            help='start slice (default: the first free)')
        return parser

    def result(self, agent, args):
        inv = agent.discover()
        g = inventory.find_gpu(inv, str(args.gpu))
        profile = g.model.mig_profile(args.profile)
        start = args.start
        if start is None:
            starts = inv.host.gpus[g.index].mig_starts(profile)
            if not starts:
                raise errors.NoCapacity('GPU %d has no room for MIG %s'
                                        % (g.index, profile.name))
            start = starts[0]
        return 'GPU instance %d' % agent.manager.create_mig(
            _nvml_index(g), profile, start)


class RemoveMdev(base.Action):
    """Remove an mdev (refused while a domain uses it)."""

    def get_parser(self, prog_name):
        parser = super().get_parser(prog_name)
        parser.add_argument('uuid')
        return parser

    def result(self, agent, args):
        agent.manager.remove_mdev(args.uuid)
        return 'removed'


class RemoveVgpu(base.Action):
    """Clear the vGPU type of a VF."""

    def get_parser(self, prog_name):
        parser = super().get_parser(prog_name)
        parser.add_argument('address', help='VF PCI address')
        return parser

    def result(self, agent, args):
        agent.manager.remove_vf_vgpu(args.address)
        return 'removed'


class RemoveMig(base.Action):
    """Destroy a MIG GPU instance and its compute instances."""

    def get_parser(self, prog_name):
        parser = super().get_parser(prog_name)
        parser.add_argument('gpu', type=int,
                            help='GPU index, as nova-gpu list shows it')
        parser.add_argument('gi_id', type=int, help='GPU instance id')
        return parser

    def result(self, agent, args):
        g = inventory.find_gpu(agent.discover(), str(args.gpu))
        agent.manager.remove_mig(_nvml_index(g), args.gi_id)
        return 'removed'


def _nvml_index(record):
    """NVML's index of a listed GPU (``nova-gpu list`` shows the report's,
    which differs once a GPU NVML cannot read is left out before it).
    """
    if record.nvml is None:
        raise errors.Unavailable('GPU %d (%s) is not seen by NVML: no MIG '
                                 'instance can be made or removed there'
                                 % (record.index, record.address))
    return record.nvml.index


class _Hostdev(base.Action):

    def get_parser(self, prog_name):
        parser = super().get_parser(prog_name)
        parser.add_argument('domain')
        what = parser.add_mutually_exclusive_group(required=True)
        what.add_argument('--mdev', metavar='UUID')
        what.add_argument('--pci', metavar='ADDRESS',
                          help='whole GPU (every function of its IOMMU '
                               'group) or a VF')
        return parser

    @staticmethod
    def libvirt(agent):
        if agent.libvirt is None:
            raise errors.Unavailable('libvirt-python is not installed')
        return agent.libvirt


class Attach(_Hostdev):
    """Attach a device to a libvirt domain (live and persistent)."""

    def result(self, agent, args):
        libvirt = self.libvirt(agent)
        if args.mdev:
            hostdevs = [xmlbuild.mdev_hostdev(args.mdev)]
        elif agent.sysfs.pci_function(args.pci).physfn:
            # a VF is its own IOMMU group member set
            hostdevs = [xmlbuild.pci_hostdev(args.pci)]
        else:
            hostdevs = agent.manager.passthrough_hostdevs(args.pci)
        for xml in hostdevs:
            libvirt.attach(args.domain, xml)
        return 'attached to %s' % args.domain


class Detach(_Hostdev):
    """Detach a device from a libvirt domain."""

    def result(self, agent, args):
        libvirt = self.libvirt(agent)
        if args.mdev:
            hostdevs = [xmlbuild.mdev_hostdev(args.mdev)]
        else:
            fn = agent.sysfs.pci_function(args.pci)
            hostdevs = [xmlbuild.pci_hostdev(a) for a in
                        ((args.pci,) if fn.physfn else fn.group_members)]
        for xml in hostdevs:
            libvirt.detach(args.domain, xml)
        return 'detached from %s' % args.domain
