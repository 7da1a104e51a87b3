"""nova-compute on fake GPU hardware: devstack's fake-hardware mode.

A development tool, as devstack offers fake virt drivers for clouds
without hardware (``NOVA_GPU_FAKE_HARDWARE``, doc/source/devstack.rst):
Nova's own ``nova-compute`` (``nova.cmd.compute.main``, its libvirt
driver, its resource tracker, its RPC over the cloud's RabbitMQ) run with
Nova's fake libvirt (``nova.tests.fixtures.libvirt``, as Nova's and this
package's functional tests use it) carrying the GPUs of one path in the
shape ``nova_gpu.tests.harness.cloud`` gives each generation. Beside it
the host's fake sysfs tree (``agent_process.HostSysfs``), kept in step
with the mdevs Nova's driver makes, for a real ``nova-gpu-agent`` whose
``[gpu_agent] sysfs_root`` points there. Only hardware is faked.

Commands (``python -m nova_gpu.tests.harness.fake_compute``)::

  path-conf PATH HOST            the path's etc/nova file with this fake
                                 host's type ids and addresses (stdout)
  agent-options PATH HOST [--dir DIR]
                                 [gpu_agent] options of its agent, one
                                 "option<TAB>value" line each
  describe PATH HOST [--dir DIR] what the host is, for checks (JSON)
  agent PATH HOST -- ARGS        its nova-gpu-agent with ARGS, NVML faked
                                 where the path needs it (fake_nvml)
  run PATH --sysfs DIR [--dir D] -- ARGS
                                 nova-compute with ARGS (its
                                 --config-file ...), the tree under DIR,
                                 the host's other state under D

PATH is one of ``PATHS``, named as the files of etc/nova
(``nova-compute-<PATH>.conf``).
"""

import argparse
import contextlib
import json
import os
import shutil
import sys

from oslo_log import log as logging

LOG = logging.getLogger(__name__)

# The hosts of each path: what nova_gpu/tests/functional/scheduler/
# test_gpu_paths.py boots on, one fake host per path.
PATHS = ('pf-mdev', 'vf-mdev', 'mig-vgpu', 'vendor-vfio', 'whole-gpu',
         'hgx', 'mixed-size')
# The HGX board of the ``hgx`` host (core/data/nvswitch_partitions.yaml).
HGX_BOARD = 'HGX-H100-8GPU'
_HOSTS = {
    # Turing: mdev types on the PF, two T4-8C per GPU.
    'pf-mdev': dict(model='T4', vgpu_type='T4-8C'),
    # Ampere, vGPU 16: SR-IOV + mdev, one VGPU provider per VF.
    'vf-mdev': dict(model='A100-40GB', vgpu_type='A100-10C'),
    # Ampere in MIG mode: a MIG-backed type on the VFs.
    'mig-vgpu': dict(model='A100-40GB', vgpu_type='A100-2-10C', mig=True),
    # Hopper, vGPU 17+: vendor-specific VFIO VFs, pooled per GPU.
    'vendor-vfio': dict(model='H100-80GB', vgpu_type='H100-20C',
                        path='vfio'),
    # Whole GPUs (PCI passthrough of the PF).
    'whole-gpu': dict(model='H200-141GB', path='passthrough'),
    # An HGX H100 8-GPU server (doc/source/hgx.rst): whole GPUs in Fabric
    # Manager's Shared NVSwitch mode (its partitions from fake_fmpm, the
    # qemu hook activating a guest's), eight ConnectX-7 NICs whose VFs
    # pair with the GPUs below the same PCIe switch (gpu:rdma).
    'hgx': dict(model='H100-80GB', path='passthrough', gpus=8,
                partitions=HGX_BOARD, rdma=True),
    # An L40S in NVIDIA's mixed-size vGPU mode (NVML says so): vendor-VFIO
    # VFs typed by the qemu hook when a guest starts, several sizes on
    # the GPU.
    'mixed-size': dict(model='L40S', vgpu_type='L40S-8C', path='vfio',
                       gpus=1, vf_types='on_demand', mixed_size=True),
}
# GPUs of a fake host, where its entry does not say.
GPUS = 2
# What a fake host's directory (the plugin's NOVA_GPU_FAKE_DIR/<path>)
# holds besides its sysfs tree: the agent's state directory (where the
# qemu hook keeps what it did, as the agent's), and the HGX host's
# Fabric Manager.
AGENT_STATE = 'agent-state'
FMPM = 'fmpm'
FABRIC_MANAGER_STATE = 'fabric-manager.json'
# libvirt and QEMU versions the fake reports (Nova's vGPU tests').
LIBVIRT_VERSION = 8000000
QEMU_VERSION = 6002000


def host_spec(path, hostname):
    """The ``cloud.GpuHost`` of a path, named ``hostname``."""
    from nova_gpu.core import partitions as partitions_mod
    from nova_gpu.tests.harness import cloud
    if path not in _HOSTS:
        raise ValueError('unknown GPU path %r: one of %s'
                         % (path, ', '.join(PATHS)))
    kw = dict(_HOSTS[path])
    kw.setdefault('gpus', GPUS)
    if kw.get('partitions'):
        kw['partitions'] = partitions_mod.published_table(kw['partitions'])
    if kw.get('rdma'):
        kw['rdma'] = cloud.RdmaLayout.hgx_h100()
    return cloud.GpuHost(hostname, **kw)


def _devices(spec):
    """(GpuState per GPU, fakelibvirt PCI info) of the host: the
    harness's first host's addresses (each fake host is a machine of its
    own).
    """
    from nova_gpu.tests.harness import cloud
    return cloud._host_devices(spec, 0)


def path_conf(path, hostname):
    """The text of etc/nova/nova-compute-<path>.conf for this fake host:
    the file's options, its example type ids and addresses replaced by the
    host's (as the functional harness does, ``service_conf.host_values``).
    """
    import nova.conf  # noqa: F401  (registers the options merge checks)
    from oslo_config import cfg

    from nova_gpu.tests.harness import cloud
    from nova_gpu.tests.harness import service_conf
    spec = host_spec(path, hostname)
    key = cloud._path_file_key(spec)
    files = [service_conf.PATH_FILES[key]]
    if spec.rdma is not None:
        files.append(service_conf.PATH_FILES[cloud.RDMA_NIC_PATH])
    values = service_conf.merge(files, cfg.CONF)
    mdev, specs = cloud._host_addresses([spec])
    values = service_conf.host_values(values, mdev, specs)
    sections = {}
    for (group, option), value in values.items():
        sections.setdefault(group, []).extend(
            '%s = %s' % (option, v)
            for v in (value if isinstance(value, list) else [value]))
    lines = ['# %s for the fake host %s (nova_gpu.tests.harness.'
             'fake_compute path-conf %s)' % (
                 ' + '.join(files), hostname, path)]
    for group, options in sections.items():
        lines += ['', '[%s]' % group] + options
    return '\n'.join(lines) + '\n'


def agent_options(path, hostname, host_dir=None):
    """{option: value} of ``[gpu_agent]`` for the host's agent: the
    resource classes ``path_conf``'s ``[pci] device_spec`` gives its GPUs
    (PCI in Placement paths), keyed by each GPU's PF; VFs typed on demand;
    on the HGX host Shared NVSwitch mode with the fake Fabric Manager's
    ``fmpm`` in ``host_dir`` and the PCIe tree in the report.
    """
    from oslo_serialization import jsonutils

    from nova_gpu.tests.harness import cloud
    spec = host_spec(path, hostname)
    options = {'host': hostname, 'nodename': hostname,
               'use_nvml': fake_nvml(path, hostname) is not None}
    gpus, _info = _devices(spec)
    classes = {}
    text = path_conf(path, hostname)
    for line in text.splitlines():
        if line.startswith('device_spec = '):
            entry = jsonutils.loads(line.split(' = ', 1)[1])
            for gpu in gpus:
                if entry['address'] in gpu.functions():
                    classes[gpu.address] = entry['resource_class']
    if classes and spec.path in (cloud.VFIO, cloud.PASSTHROUGH):
        options['pci_resource_classes'] = ','.join(
            '%s:%s' % kv for kv in sorted(classes.items()))
    if spec.vf_types == cloud.ON_DEMAND:
        options['vf_types_on_demand'] = True
    if spec.partitions is not None:
        if host_dir is None:
            raise ValueError('the %s host needs its directory (--dir) for '
                             'its Fabric Manager' % path)
        options['nvswitch_mode'] = 'shared'
        options['fmpm_path'] = os.path.join(host_dir, FMPM)
    if spec.rdma is not None:
        options['report_pcie_tree'] = True
    return options


def fake_nvml(path, hostname):
    """The GPUs the host's NVML shows (``agent_process.write_fake_nvml``),
    for a path whose GPUs only NVML describes fully: MIG mode and NVIDIA's
    mixed-size vGPU mode are NVML's alone, so such a host's agent runs
    with NVML faked at its boundary; None for the other paths (no NVML,
    as on a host without the driver).
    """
    from nova_gpu.core import catalog as catalog_mod
    spec = host_spec(path, hostname)
    if not (spec.mig or spec.mixed_size):
        return None
    model = catalog_mod.load_catalog().model(spec.model)
    return [dict({'address': gpu.address,
                  'name': (model.nvml_names or (model.name,))[0],
                  'memory_mib': model.framebuffer_mib,
                  'numa_node': max(spec.numa_of(gpu.index), 0)},
                 **({'mig': True} if spec.mig else {'heterogeneous': 1}))
            for gpu in _devices(spec)[0]]


def pcie_layout(spec, gpus, pci_info):
    """The ``HostSysfs`` layout of a ``gpu:rdma`` host: its PCIe switches
    (``cloud.RdmaLayout``; each named by its upstream port, below a root
    port of its root complex), each GPU and ConnectX NIC below a
    downstream port of its switch, the NICs' VFs bound to ``mlx5_core``;
    the addresses are fake libvirt's (``pci_info``). None for other hosts.
    """
    from nova_gpu.tests.harness import cloud
    from nova_gpu.tests.unit.agent import hgx_pcie
    layout = spec.rdma
    if layout is None:
        return None
    nics = layout.nics(0)

    def numa_of_switch(s):
        # As fake libvirt has it (cloud._host_devices): its GPUs' node.
        return max(spec.numa_of(layout.gpu_switches.index(s)), 0) if (
            s in layout.gpu_switches) else 0

    def build(fs):
        bridges = {}
        below = {s: [] for s in range(len(layout.roots))}
        for gpu in gpus:
            below[layout.gpu_switches[gpu.index]].append(gpu.address)
        for pf, _vfs, s in nics:
            below[s].append(pf)
        ports_of_root = {}
        for s, root in enumerate(layout.roots):
            n = ports_of_root[root] = ports_of_root.get(root, 0) + 1
            root_port = '%s:%02x.0' % (root[len('pci'):], n)
            upstream = layout.switch_id(s)
            downstream = [cloud.pci_address(0xd0 + s, k, 0)
                          for k in range(len(below[s]))]
            fs.add_pcie_switch(root_port, upstream, downstream,
                               hgx_pcie.PEX89000,
                               vendor=hgx_pcie.SWITCH_VENDOR,
                               numa_node=numa_of_switch(s))
            for address, port in zip(below[s], downstream):
                bridges[address] = (root_port, upstream, port)
        for pf, vfs, s in nics:
            got = fs.add_nic(pf, bridges.pop(pf), len(vfs),
                             device_id=hgx_pcie.CX7,
                             vf_device=hgx_pcie.CX7_VF,
                             numa_node=numa_of_switch(s))
            if got != list(vfs):
                raise AssertionError('NIC %s: sysfs VFs %s, libvirt %s'
                                     % (pf, got, vfs))
        return bridges
    return build


class FakeGpuHost:
    """Nova's fake libvirt patched in for one fake GPU host.

    ``start`` installs the fixtures Nova's functional libvirt tests use
    (``nova.tests.functional.libvirt.base.ServersTestBase``) and the
    host's connection; ``sysfs`` (a directory) gets the host's fake sysfs
    tree, rebuilt at each start (the fake hardware starts afresh), and so
    does the HGX host's Fabric Manager (in ``host_dir``). Where the host
    needs libvirt's ``qemu`` hook (VFs typed on demand, NVSwitch
    partitions) the real ``nova-gpu-qemu-hook`` runs around the fake
    domains, on this tree and the agent's state directory in
    ``host_dir``, as libvirtd runs it.
    """

    def __init__(self, path, hostname, sysfs, host_dir=None):
        self.path = path
        self.spec = host_spec(path, hostname)
        self.gpus, self.pci_info = _devices(self.spec)
        self.sysfs_dir = sysfs
        self.host_dir = host_dir or os.path.dirname(
            os.path.abspath(sysfs))
        self.connection = None
        self.tree = None
        self._fixtures = []

    def _use(self, fixture):
        fixture.setUp()
        self._fixtures.append(fixture)
        return fixture

    def start(self):
        import fixtures
        from nova.tests import fixtures as nova_fixtures
        from nova.tests.fixtures import libvirt as fakelibvirt

        from nova_gpu.tests.harness import agent_process
        use = self._use
        use(nova_fixtures.LibvirtImageBackendFixture())
        use(nova_fixtures.CGroupsFixture())
        use(nova_fixtures.LibvirtFixture())
        use(nova_fixtures.OSBrickFixture())
        for target, kw in (
                ('nova.virt.libvirt.LibvirtDriver._create_image',
                 {'return_value': (False, False)}),
                ('nova.virt.libvirt.LibvirtDriver._get_local_gb_info',
                 {'return_value': {'total': 128, 'used': 0, 'free': 128}}),
                ('nova.virt.libvirt.driver.libvirt_utils.is_valid_hostname',
                 {'return_value': True}),
                ('nova.privsep.utils.supports_direct_io',
                 {'return_value': True}),
                ('nova.virt.libvirt.host.Host.get_online_cpus',
                 {'return_value': set(range(8))}),
                ('nova.virt.libvirt.LibvirtDriver._get_instance_disk_info',
                 {'return_value': []}),
                # Nova's PCI code reads the host's sysfs for network PFs.
                ('nova.pci.utils.is_physical_function',
                 {'return_value': False}),
                ('nova.pci.utils.get_function_by_ifname',
                 {'return_value': (None, False)}),
                ('nova.virt.libvirt.driver.LibvirtDriver._create_mdev',
                 {'side_effect': self._create_mdev})):
            use(fixtures.MockPatch(target, **kw))
        # The console log and disk files the fake guest never wrote.
        use(fixtures.MockPatch(
            'nova.virt.libvirt.driver.libvirt_utils.file_open',
            side_effect=lambda *a, **k: __import__('io').BytesIO(b'')))
        # libvirt's listDevices returns a list, Nova's fake a live view.
        use(fixtures.MonkeyPatch(
            'nova.tests.fixtures.libvirt.HostMdevDevicesInfo.get_all_devices',
            lambda info: list(info.devices)))
        self.connection = fakelibvirt.Connection(
            'qemu:///system', version=LIBVIRT_VERSION,
            hv_version=QEMU_VERSION,
            host_info=fakelibvirt.HostInfo(cpu_nodes=2, cpu_sockets=1,
                                           cpu_cores=2, cpu_threads=2),
            pci_info=self.pci_info, hostname=self.spec.name)
        for gpu in self.gpus:
            gpu.connection = self.connection
        undefine = self.connection._undefine

        def undefine_and_release(dom):
            undefine(dom)
            self.release_idle_mdevs()
        self.connection._undefine = undefine_and_release
        use(fixtures.MockPatch('nova.virt.libvirt.host.Host.get_connection',
                               return_value=self.connection))
        shutil.rmtree(self.sysfs_dir, ignore_errors=True)
        self.tree = agent_process.HostSysfs(
            self.connection, self.sysfs_dir, self.vendor_vfio(),
            pcie_layout(self.spec, self.gpus, self.pci_info))
        if self.spec.partitions is not None:
            self.start_fabric_manager()
        if self.needs_hook():
            from nova_gpu.tests.harness import qemu_hook
            qemu_hook.hook_fake_domains(self._use, self.run_qemu_hook)
        return self

    def needs_hook(self):
        from nova_gpu.tests.harness import cloud
        return (self.spec.partitions is not None
                or self.spec.vf_types == cloud.ON_DEMAND)

    def start_fabric_manager(self):
        """Fabric Manager's state at the host's start (nothing active)
        and the ``fmpm`` the agent and the hook run (``fake_fmpm``).
        """
        from nova_gpu.tests.harness import fake_fmpm
        os.makedirs(self.host_dir, exist_ok=True)
        state = os.path.join(self.host_dir, FABRIC_MANAGER_STATE)
        fake_fmpm.init(state, HGX_BOARD, [g.address for g in self.gpus])
        fake_fmpm.write_wrapper(os.path.join(self.host_dir, FMPM), state)

    def hook_options(self):
        """``[gpu_agent]`` options the hook reads, as the agent's file
        (agent_options) has them.
        """
        options = {'sysfs_root': self.sysfs_dir,
                   'state_dir': os.path.join(self.host_dir, AGENT_STATE)}
        if self.spec.partitions is not None:
            options.update(nvswitch_mode='shared',
                           fmpm_path=os.path.join(self.host_dir, FMPM))
        return options

    def run_qemu_hook(self, dom, operation, sub_operation):
        """``nova-gpu-qemu-hook`` for ``dom``, as libvirtd runs it; the
        NIC VFs of the domain bound to vfio-pci while it runs, as
        libvirt binds a managed device.
        """
        from nova_gpu.tests.harness import qemu_hook
        xml = getattr(dom, 'nova_gpu_xml', None)
        if xml is None:
            return None
        os.makedirs(os.path.join(self.host_dir, AGENT_STATE),
                    exist_ok=True)
        run = qemu_hook.run_hook(self.spec.name, dom.name(), xml, operation,
                                 sub_operation, self.hook_options())
        if run.returncode:
            LOG.warning('qemu hook %s %s of %s: exit status %d: %s',
                        operation, sub_operation, dom.name(),
                        run.returncode, run.stderr.strip())
        else:
            self.bind_nic_vfs(xml, 'vfio-pci' if operation == 'prepare'
                              else 'mlx5_core')
        return run

    def bind_nic_vfs(self, xml, driver):
        from nova_gpu.tests.harness import cloud
        if self.spec.rdma is None:
            return
        vfs = {vf for _pf, vfs, _s in self.spec.rdma.nics(0) for vf in vfs}
        for address in cloud.hostdev_refs(xml)[1] & vfs:
            self.tree.fs.bind_driver(address, driver)

    def stop(self):
        while self._fixtures:
            self._fixtures.pop().cleanUp()

    def vendor_vfio(self):
        """NVIDIA's vendor VFIO files of a vendor-VFIO host's VFs
        (``qemu_hook.vendor_vfio_files``).
        """
        from nova_gpu.tests.harness import cloud
        from nova_gpu.tests.harness import qemu_hook
        if self.spec.path != cloud.VFIO:
            return {}
        return qemu_hook.vendor_vfio_files(self.spec, self.gpus)

    def release_idle_mdevs(self):
        """Remove the mdevs (and the GPU instances behind them) no domain
        holds any more, in libvirt's list and in sysfs.

        Nova keeps an mdev for the next guest of its type, and the agent
        tells such an idle one from a used one by the domains it reads
        over libvirt; this host's libvirt is inside the fake
        nova-compute, out of the agent's reach, so the idle mdev would
        count as used. Nova makes a new mdev when it finds none free.
        """
        from nova_gpu.tests.harness import cloud
        held = set()
        for dom in list(self.connection._vms.values()):
            held |= cloud.hostdev_refs(dom.XMLDesc(0))[0]
        for name in list(self.connection.mdev_info.devices):
            uuid = name[len('mdev_'):].replace('_', '-')
            if uuid.lower() not in held:
                del self.connection.mdev_info.devices[name]
                for gpu in self.gpus:
                    gpu.gpu_instances.pop(uuid, None)
        self.tree.sync()

    def _create_mdev(self, dev_name, mdev_type, uuid=None):
        """What the kernel does when Nova's driver makes an mdev: the
        device in libvirt's list and in sysfs, and on a GPU in MIG mode
        the GPU instance behind it (``cloud.GpuState.carve``).
        """
        from nova.tests.fixtures import libvirt as fakelibvirt
        from nova.virt.libvirt import utils as libvirt_utils
        from oslo_utils import uuidutils

        from nova_gpu.tests.harness import cloud
        uuid = uuid or uuidutils.generate_uuid()
        name = libvirt_utils.mdev_uuid2name(uuid)
        self.connection.mdev_info.devices[name] = fakelibvirt.FakeMdevDevice(
            dev_name=name, type_id=mdev_type, parent=dev_name)
        address = cloud._address(dev_name)
        for gpu in self.gpus:
            if self.spec.mig and address in gpu.vfs:
                gpu.carve(uuid)
        self.tree.sync()
        return uuid


def describe(path, hostname, host_dir=None):
    """What the fake host is, for checks (``describe``, JSON): its GPUs'
    addresses, the NVSwitch partitions (ID -> GPU indices, supported)
    and Fabric Manager's state file, the PCIe switch of each GPU and NIC
    PF (``gpu:rdma``), whether its GPUs run mixed-size vGPU mode.
    """
    spec = host_spec(path, hostname)
    gpus = _devices(spec)[0]
    out = {'host': hostname, 'path': path, 'model': spec.model,
           'gpus': [g.address for g in gpus],
           'mixed_size': bool(spec.mixed_size)}
    if spec.partitions is not None:
        out['partitions'] = {
            str(p.id): {'gpus': sorted(p.gpus), 'supported': p.supported}
            for p in spec.partitions.partitions}
        if host_dir is not None:
            out['fabric_manager_state'] = os.path.join(
                host_dir, FABRIC_MANAGER_STATE)
    if spec.rdma is not None:
        out['gpu_switches'] = list(spec.rdma.gpu_switches)
        out['nic_switches'] = {pf: s for pf, _vfs, s in spec.rdma.nics(0)}
    return out


def run(path, sysfs, nova_args, host_dir=None):
    """nova-compute (Nova's main) on the fake host of ``path``."""
    from nova.cmd import compute
    from oslo_config import cfg

    # The host name comes from the unit's file ([DEFAULT] host): parse it
    # the way nova-compute will, before the fake host is built.
    conf = cfg.ConfigOpts()
    conf.register_opt(cfg.StrOpt('host'))
    conf(nova_args, project='nova', default_config_files=[])
    if not conf.host:
        raise SystemExit('fake_compute: the unit\'s file sets no [DEFAULT] '
                         'host (each fake host needs its own name)')
    host = FakeGpuHost(path, conf.host, sysfs, host_dir).start()
    sys.argv = ['nova-compute'] + list(nova_args)
    try:
        return compute.main()
    finally:
        host.stop()


def main(argv=None):
    # Native threading, as Nova 34's nova-compute (nova.tests.functional
    # would otherwise choose eventlet when imported).
    os.environ.setdefault('OS_NOVA_DISABLE_EVENTLET_PATCHING', 'true')
    parser = argparse.ArgumentParser(
        prog='python -m nova_gpu.tests.harness.fake_compute',
        description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest='command', required=True)
    for name in ('path-conf', 'agent-options', 'describe'):
        p = sub.add_parser(name)
        p.add_argument('path', choices=PATHS)
        p.add_argument('host')
        if name != 'path-conf':
            p.add_argument('--dir', help='the fake host\'s directory')
    p = sub.add_parser('agent')
    p.add_argument('path', choices=PATHS)
    p.add_argument('host')
    p.add_argument('--state', required=True,
                   help='where the fake NVML\'s description is written')
    p = sub.add_parser('run')
    p.add_argument('path', choices=PATHS)
    p.add_argument('--sysfs', required=True,
                   help='where the fake sysfs tree is written')
    p.add_argument('--dir', help='the fake host\'s directory (default: '
                   'the parent of --sysfs)')
    argv = list(sys.argv[1:] if argv is None else argv)
    # nova-compute's own arguments follow "--".
    split = argv.index('--') if '--' in argv else len(argv)
    args = parser.parse_args(argv[:split])
    nova_args = argv[split + 1:]
    if args.command in ('path-conf', 'agent-options', 'describe'):
        out = sys.stdout
        # What Nova's modules print while they are imported (a periodic
        # task's notice) goes to stderr: stdout is the file the plugin
        # writes.
        with contextlib.redirect_stdout(sys.stderr):
            if args.command == 'path-conf':
                text = path_conf(args.path, args.host)
            elif args.command == 'describe':
                text = json.dumps(describe(args.path, args.host,
                                           args.dir)) + '\n'
            else:
                text = ''.join('%s\t%s\n' % kv for kv in agent_options(
                    args.path, args.host, args.dir).items())
        out.write(text)
    elif args.command == 'agent':
        return agent(args.path, args.host, args.state, nova_args)
    else:
        return run(args.path, args.sysfs, nova_args, args.dir)
    return 0


def agent(path, hostname, state, agent_args):
    """nova-gpu-agent of the host, with its fake NVML where it has one."""
    from nova_gpu.tests.harness import agent_process
    gpus = fake_nvml(path, hostname)
    if gpus is not None:
        nvml = agent_process.write_fake_nvml(
            os.path.join(state, 'nvml.json'), gpus)
        agent_args = ['--fake-nvml', nvml] + list(agent_args)
    return agent_process.main(agent_args)


if __name__ == '__main__':
    sys.exit(main())
