"""Real nova-gpu-agent processes for tests, benchmarks and the demo.

Pieces usable alone:

* ``agent_config``: the agent's oslo.config file (one template for the
  functional tests, the reliability benchmark and the in-process cloud).
* ``AgentProcess``: ``nova-gpu-agent`` run as a separate process with that
  file, stopped with SIGTERM as an init system would; optionally with NVML
  faked at its boundary (``write_fake_nvml``).
* ``HostSysfs``: a fake sysfs tree (``nova_gpu/tests/unit/agent/fakesys.py``)
built
  from what one of Nova's fake libvirt hosts shows (``nova.tests.fixtures.
  libvirt``): the same PCI functions (vendor and product ids, addresses,
  NUMA nodes, IOMMU groups, drivers, the bridges above them), SR-IOV VFs
  with their PF, mdev types with their instances, NVIDIA's vendor VFIO
  files on VFs, and the mdevs the host has. Only the kernel is faked: the
  agent reads the tree through its ordinary ``[gpu_agent] sysfs_root``.

``AgentReportsMixin`` puts them together for ``nova_gpu.tests.harness.cloud``:
each GPU host of a ``GpuCloudTestCase`` gets its fake sysfs tree and its
own agent process (host and nodename are the host's hypervisor hostname,
so the agent names providers as Nova does), publishing over a real
RabbitMQ into nova-scheduler's report listener (``[gpu_scheduler]
report_listener = true``). NVML is absent, or, on a host with NVLinks
(which only NVML tells), faked at its boundary: the ``pynvml`` module
(``nova_gpu/tests/unit/agent/fakenvml.py``, see ``main``). libvirt is
unreachable
(the agent then reports from sysfs alone and skips its reconcile). When
Nova's libvirt driver creates an mdev on the fake host, the mdev appears
in the host's tree at once, as the kernel would show it, and the agent's
next periodic report carries it.
"""

import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid as uuid_mod

import fixtures
from lxml import etree

# nova-gpu-agent's main module, run with ``python -m``.
SERVICE_MODULE = 'nova_gpu.agent.service'
# This module: runs the agent with a fake NVML (``main``).
RUNNER_MODULE = 'nova_gpu.tests.harness.agent_process'
# What the agent logs after every cycle (nova_gpu.agent.service).
CYCLE_LOG = 'GPU cycle: report generation'
NVIDIA_VENDOR = '10de'
# Datacenter NVIDIA GPUs are 3D controllers; libvirt's XML has no class.
GPU_CLASS = '0x030200'


# -- the agent's configuration ----------------------------------------------

def agent_config(url, topic, workdir, sysfs_root, host, libvirt_uri=None,
                 nodename=None, options=None):
    """The text of a nova-gpu-agent config file.

    ``url``: the broker's transport URL (RPC and notifications);
    ``topic``: ``[gpu_agent] report_topic``; ``workdir`` holds the
    agent's outbox, state (intent journal) and provider config file.
    ``libvirt_uri`` None: a socket nobody listens on, tried once per
    cycle (the agent then skips its reconcile and reports from sysfs).
    ``options``: {section: {option: value}} added or replacing these; a
    value of None leaves the option out (its default applies).
    """
    if libvirt_uri is None:
        libvirt_uri = ('qemu+unix:///system?socket=%s'
                       % os.path.join(workdir, 'no-libvirtd', 'sock'))
    sections = {
        'DEFAULT': {'transport_url': url, 'use_stderr': 'true'},
        'oslo_messaging_notifications': {'transport_url': url},
        'gpu_agent': {
            'host': host,
            'nodename': nodename or host,
            'libvirt_uri': libvirt_uri,
            'sysfs_root': sysfs_root,
            'use_nvml': 'false',
            'reconcile_interval': 0,
            'orphan_grace_period': 0,
            'provider_config_file': os.path.join(
                workdir, 'provider_config', 'nova-gpu.yaml'),
            'outbox_dir': os.path.join(workdir, 'outbox'),
            'state_dir': os.path.join(workdir, 'state'),
            'report_topic': topic,
        },
    }
    for section, values in (options or {}).items():
        sections.setdefault(section, {}).update(values)
    lines = []
    for section, values in sections.items():
        lines.append('[%s]' % section)
        lines += ['%s = %s' % (name, value)
                  for name, value in values.items() if value is not None]
        lines.append('')
    return '\n'.join(lines)


def write_config(path, *args, **kwargs):
    """Write ``agent_config(*args, **kwargs)`` to ``path``; return it."""
    with open(path, 'w') as f:
        f.write(agent_config(*args, **kwargs))
    return path


def command(config_path, fake_nvml=None):
    """The command line of nova-gpu-agent with ``config_path``.

    ``fake_nvml``: a file written by ``write_fake_nvml``; the agent then
    runs (through this module's ``main``) with NVML faked at its boundary,
    the ``pynvml`` module, and needs ``[gpu_agent] use_nvml = true``.
    """
    if fake_nvml is None:
        return [sys.executable, '-m', SERVICE_MODULE,
                '--config-file', config_path]
    return [sys.executable, '-m', RUNNER_MODULE, '--fake-nvml', fake_nvml,
            '--config-file', config_path]


def run_once(config_path, timeout=120):
    """Run one agent cycle (``reconcile_interval = 0``) to its end."""
    return subprocess.run(command(config_path), capture_output=True,
                          text=True, timeout=timeout)


def cycles_logged(log_path):
    """How many cycles the agent logged so far."""
    try:
        with open(log_path, errors='replace') as f:
            return sum(CYCLE_LOG in line for line in f)
    except FileNotFoundError:
        return 0


class AgentProcess(fixtures.Fixture):
    """nova-gpu-agent running with ``config_path``; output to ``log_path``
    (``fake_nvml``: see ``command``).

    Stopped (SIGTERM, then SIGKILL if it does not exit) at cleanup.
    """

    def __init__(self, config_path, log_path, fake_nvml=None):
        super().__init__()
        self.config_path = config_path
        self.log_path = log_path
        self.fake_nvml = fake_nvml
        self.proc = None

    def _setUp(self):
        with open(self.log_path, 'ab') as out:
            self.proc = subprocess.Popen(
                command(self.config_path, self.fake_nvml), stdout=out,
                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.addCleanup(self.stop)

    @property
    def running(self):
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout=30):
        """SIGTERM; return the exit status (SIGKILL after ``timeout``)."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def cycles(self):
        return cycles_logged(self.log_path)

    def wait_cycles(self, count, timeout=60):
        """Wait until ``count`` more cycles are logged; False if the agent
        exited or the time ran out first.
        """
        target = self.cycles() + count
        deadline = time.monotonic() + timeout
        while self.cycles() < target:
            if not self.running or time.monotonic() > deadline:
                return False
            time.sleep(0.1)
        return True

    def log_tail(self, chars=4000):
        try:
            with open(self.log_path, errors='replace') as f:
                return f.read()[-chars:]
        except FileNotFoundError:
            return ''


# -- NVML faked at its boundary ----------------------------------------------

def nvml_bus_id(address):
    """``0000:41:00.0`` (sysfs) -> ``00000000:41:00.0`` (NVML)."""
    domain, rest = address.split(':', 1)
    return '%08x:%s' % (int(domain, 16), rest.upper())


def write_fake_nvml(path, gpus):
    """Describe the GPUs the fake NVML shows, one dict each: ``address``
    (PCI), ``name`` (as NVML names the model), ``memory_mib``,
    ``numa_node``, ``nvlinks`` (PCI addresses at the far end of each
    NVLink), ``mig`` (in MIG mode; False when absent: GPUs are in MIG
    mode only where NVML says so, with no GPU instance at start),
    ``heterogeneous`` (NVML's vGPU heterogeneous mode, mixed-size vGPUs:
    1 on, 0 off, absent: NotSupported) and ``lost`` (fallen off the
    bus: NVML lists it and can say nothing else of it).
    """
    with open(path, 'w') as f:
        json.dump([dict(g) for g in gpus], f, indent=1)
    return path


def _install_fake_nvml(path):
    """Make ``import pynvml`` give the fake described in ``path``."""
    from nova_gpu.tests.unit.agent import fakenvml
    with open(path) as f:
        gpus = json.load(f)
    fake = fakenvml.FakePynvml([
        fakenvml.FakeGpu(nvml_bus_id(g['address']), g['name'],
                         g['memory_mib'], numa=g.get('numa_node', 0),
                         links=[nvml_bus_id(a) for a in g.get('nvlinks', ())],
                         mig=bool(g.get('mig', False)))
        for g in gpus])
    for dev, g in zip(fake.gpus, gpus):
        dev.heterogeneous = g.get('heterogeneous')
    for g in gpus:
        if g.get('lost'):
            fake.lose(g['address'])
    sys.modules['pynvml'] = fake
    return fake


def main(argv=None):
    """nova-gpu-agent with a fake NVML: ``--fake-nvml PATH`` then the
    agent's own arguments.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ['--fake-nvml']:
        _install_fake_nvml(argv[1])
        argv = argv[2:]
    from nova_gpu.agent import service
    return service.main(argv)


# -- a fake sysfs tree from a fake libvirt host -----------------------------

def _address(libvirt_name):
    """``pci_0000_41_00_0`` -> ``0000:41:00.0``."""
    return '{}:{}:{}.{}'.format(*libvirt_name[4:].split('_'))


def _xml_address(el):
    return '%04x:%02x:%02x.%x' % tuple(
        int(el.get(k), 16) for k in ('domain', 'bus', 'slot', 'function'))


@dataclasses.dataclass
class MdevType:
    id: str
    name: str
    available: int
    device_api: str = 'vfio-pci'


@dataclasses.dataclass
class PciNode:
    """A PCI node device as libvirt describes it (``virNodeDevice``)."""

    name: str
    address: str
    vendor_id: str
    product_id: str
    driver: str = None
    numa_node: int = 0
    iommu_group: int = None
    bridges: tuple = ()        # from the root port down (its sysfs path)
    physfn: str = None         # a VF's PF address
    vfs: tuple = ()            # a PF's VF addresses
    mdev_types: tuple = ()     # MdevType
    # NVIDIA vendor VFIO (vGPU 17+) on a VF: {type id: name} and the type
    # preset; libvirt does not show them, the fake device carries them.
    creatable_vgpu_types: dict = None
    current_vgpu_type: int = 0

    @classmethod
    def from_xml(cls, xml):
        root = etree.fromstring(xml)
        pci = root.find("capability[@type='pci']")
        address = '%04x:%02x:%02x.%x' % tuple(
            int(pci.findtext(k)) for k in ('domain', 'bus', 'slot',
                                           'function'))
        path = (root.findtext('path') or '').split('/')
        bridges = tuple(p for p in path[:-1] if re.fullmatch(
            r'[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]', p))
        numa = pci.find('numa')
        group = pci.find('iommuGroup')
        physfn = pci.find("capability[@type='phys_function']/address")
        vfs = pci.findall("capability[@type='virt_functions']/address")
        types = tuple(
            MdevType(t.get('id'), t.findtext('name') or t.get('id'),
                     int(t.findtext('availableInstances') or 0),
                     t.findtext('deviceAPI') or 'vfio-pci')
            for t in pci.findall("capability[@type='mdev_types']/type"))
        return cls(
            name=root.findtext('name'), address=address,
            vendor_id=pci.find('vendor').get('id').lower()[2:],
            product_id=pci.find('product').get('id').lower()[2:],
            driver=root.findtext('driver/name'),
            numa_node=int(numa.get('node')) if numa is not None else -1,
            iommu_group=(int(group.get('number')) if group is not None
                         else None),
            bridges=bridges,
            physfn=_xml_address(physfn) if physfn is not None else None,
            vfs=tuple(_xml_address(a) for a in vfs), mdev_types=types)


def pci_nodes(conn, vendor_vfio=None):
    """The PCI node devices of a fake libvirt connection, PFs first.

    Each device's XML is what Nova's libvirt driver reads. libvirt does
    not show NVIDIA's vendor VFIO files: ``vendor_vfio`` gives them, VF
    address -> ({type id: name} creatable, type id preset).
    """
    nodes = []
    for dev in conn.pci_info.devices.values():
        node = PciNode.from_xml(dev.XMLDesc(0))
        if node.address in (vendor_vfio or {}):
            creatable, current = vendor_vfio[node.address]
            node.creatable_vgpu_types = dict(creatable)
            node.current_vgpu_type = int(current or 0)
        nodes.append(node)
    return sorted(nodes, key=lambda n: (n.physfn is not None, n.address))


def parse_mdev(xml):
    """(uuid, parent PCI address, mdev type) of an mdev node device."""
    root = etree.fromstring(xml)
    name = root.findtext('name')
    return (name[len('mdev_'):].replace('_', '-'),
            _address(root.findtext('parent')),
            root.find("capability[@type='mdev']/type").get('id'))


def libvirt_mdevs(conn):
    """uuid -> (parent address, type) of a fake libvirt host's mdevs."""
    result = {}
    for dev in conn.mdev_info.devices.values():
        uuid, parent, type_id = parse_mdev(dev.XMLDesc(0))
        result[uuid] = (parent, type_id)
    return result


def build_sysfs(fs, nodes, bridges=None):
    """Add ``nodes``' NVIDIA functions to the FakeSysfs ``fs``.

    PFs go below their bridges (``bridges``: {PF address: bridges from
    the root port down}, where the tree places them otherwise); VFs
    beside their PF with ``physfn`` and ``virtfnN`` links; mdev types
    with their available instances; vendor VFIO files where a VF has
    them. Other vendors' devices are left
    out: the agent only looks at NVIDIA GPUs.
    """
    from nova_gpu.tests.unit.agent import fakesys
    nvidia = [n for n in nodes if n.vendor_id == NVIDIA_VENDOR]
    vf_index = {}
    for node in nvidia:
        for i, vf in enumerate(node.vfs):
            vf_index[vf] = (node.address, i)
    for node in nvidia:
        common = dict(numa_node=node.numa_node, driver=node.driver,
                      pci_class=GPU_CLASS, iommu_group=node.iommu_group)
        if node.physfn is None:
            fs.add_pci(node.address, '0x' + node.product_id,
                       bridges=(bridges or {}).get(node.address)
                       or node.bridges or None, **common)
        else:
            pf, index = vf_index.get(node.address, (node.physfn, None))
            fs.add_pci(node.address, '0x' + node.product_id,
                       parent_rel=os.path.dirname(fs.dev_rel(pf)), **common)
            fakesys._link(fs.dev_rel(pf),
                          fs.path(fs.dev_rel(node.address), 'physfn'),
                          fs.root)
            if index is None:  # a VF its PF does not list: append it
                index = sum(1 for n in os.listdir(fs.path(fs.dev_rel(pf)))
                            if n.startswith('virtfn'))
            fakesys._link(fs.dev_rel(node.address),
                          fs.path(fs.dev_rel(pf), 'virtfn%d' % index),
                          fs.root)
            count = sum(1 for n in os.listdir(fs.path(fs.dev_rel(pf)))
                        if n.startswith('virtfn'))
            for name in ('sriov_totalvfs', 'sriov_numvfs'):
                fakesys._write(fs.path(fs.dev_rel(pf), name),
                               '%d\n' % count)
        for t in node.mdev_types:
            fs.add_mdev_type(node.address, t.id, t.name, t.available,
                             device_api=t.device_api)
        if node.creatable_vgpu_types:
            nv = fs.path(fs.dev_rel(node.address), 'nvidia')
            fakesys._write(os.path.join(nv, 'creatable_vgpu_types'),
                           'ID    : vGPU Name\n' + ''.join(
                               '%-5s : %s\n' % (k, v) for k, v in sorted(
                                   node.creatable_vgpu_types.items())))
            fakesys._write(os.path.join(nv, 'current_vgpu_type'),
                           '%d\n' % node.current_vgpu_type)
    return fs


class HostSysfs:
    """The fake sysfs tree of one fake libvirt host, kept in step with it.

    ``sync`` makes the tree's mdevs those of the libvirt host (created
    where libvirt has a new one, removed where it dropped one), as the
    kernel would show them.
    """

    def __init__(self, conn, root, vendor_vfio=None, layout=None):
        """``layout(fs)``, when given, adds what sits around the GPUs
        (PCIe switches, NICs) first and returns ``build_sysfs``'s
        ``bridges``.
        """
        from nova_gpu.tests.unit.agent import fakesys
        self.conn = conn
        self.fs = fakesys.FakeSysfs(root)
        self.nodes = pci_nodes(conn, vendor_vfio)
        build_sysfs(self.fs, self.nodes,
                    layout(self.fs) if layout is not None else None)
        self._nvidia = {n.address for n in self.nodes
                        if n.vendor_id == NVIDIA_VENDOR}
        self.sync()

    @property
    def root(self):
        return self.fs.root

    def sync(self):
        """Mirror the libvirt host's mdevs; return (added, removed)."""
        wanted = {uuid: parent_type
                  for uuid, parent_type in libvirt_mdevs(self.conn).items()
                  if parent_type[0] in self._nvidia}
        have = set(self.fs.mdevs())
        added = sorted(set(wanted) - have)
        removed = sorted(have - set(wanted))
        for uuid in removed:
            self.fs.remove_mdev(uuid)
        for uuid in added:
            parent, type_id = wanted[uuid]
            self.fs.materialise_mdev(parent, type_id, uuid)
        return added, removed


# -- agents for the in-process cloud -----------------------------------------

class AgentReportsMixin:
    """GPU reports from real nova-gpu-agent processes, for a
    ``GpuCloudTestCase`` (list this mixin first among the bases).

    The scheduler starts with ``[gpu_scheduler] report_listener = true``
    whatever ``NOVA_CONF`` says, and listens on a real RabbitMQ
    (``broker_url``: the one on 127.0.0.1:5672, else a private node the
    test starts) on a topic of its own, deleted at the end. Each GPU host
    gets a ``HostSysfs`` tree, which shows every mdev Nova's driver makes
    on the host as it makes it, and an agent process publishing every
    ``AGENT_INTERVAL`` seconds. ``sync_gpu_reports``, the harness's point
    where reports must be current, starts the agents the first time and
    waits until every listening scheduler's view holds a report each agent
    took after the call, instead of building reports itself.
    """

    # Seconds between two agent cycles ([gpu_agent] reconcile_interval).
    AGENT_INTERVAL = 1
    # Seconds to wait for a fresh report of every host.
    REPORT_TIMEOUT = 60

    def broker_url(self):
        """The transport URL of the broker the reports go through."""
        from nova_gpu.tests.functional.agent import rabbit
        return self.useFixture(rabbit.SharedOrPrivateRabbit()).url

    def _setup_scheduler_service(self):
        # Before the scheduler starts: its listener connects at start.
        self.report_url = self.broker_url()
        self.report_topic = 'nova_gpu_reports_%s' % uuid_mod.uuid4().hex[:8]
        self.flags_for_every_service('oslo_messaging_notifications',
                                     transport_url=self.report_url)
        self.flags_for_every_service('gpu_scheduler',
                                     report_topic=self.report_topic,
                                     report_listener=True)
        self.agent_hosts = {}   # hostname -> HostSysfs
        self.agents = {}        # hostname -> AgentProcess
        self.agent_dirs = {}
        # Runs last, once the agents and the scheduler are stopped: the
        # topic's queue and each listener's pool queue (report_views).
        self.report_queues = ['%s.info' % self.report_topic]
        self.addCleanup(delete_queues, self.report_url, self.report_queues)
        return super()._setup_scheduler_service()

    def add_gpu_host(self, spec):
        compute = super().add_gpu_host(spec)
        workdir = tempfile.mkdtemp(prefix='ngpu-agent-%s-' % spec.name)
        self.addCleanup(shutil.rmtree, workdir, ignore_errors=True)
        self.agent_dirs[spec.name] = workdir
        conn = compute.driver._host.get_connection()
        self.agent_hosts[spec.name] = HostSysfs(
            conn, os.path.join(workdir, 'sys'), self._vendor_vfio(spec))
        return compute

    def _vendor_vfio(self, spec):
        """The vendor VFIO files of a ``vfio`` host's VFs: the host's vGPU
        type preset on each, numbered as the cloud numbers mdev types.
        """
        from nova_gpu.tests.harness import cloud
        if getattr(spec, 'path', None) != getattr(cloud, 'VFIO', None):
            return {}
        type_id = int(cloud.mdev_type_id(spec.vgpu_type).split('-')[1])
        creatable = {type_id: 'NVIDIA %s' % spec.vgpu_type}
        return {vf: (creatable, type_id)
                for state in self.gpu_states(spec.name) for vf in state.vfs}

    def _create_mdev(self, dev_name, mdev_type, uuid=None):
        # Nova's libvirt driver made an mdev on the current fake host: the
        # kernel shows it in that host's sysfs at once.
        uuid = super()._create_mdev(dev_name, mdev_type, uuid=uuid)
        host = self.agent_hosts.get(self._current_host)
        if host is not None:
            host.sync()
        return uuid

    def _pci_resource_classes(self, spec):
        """``[gpu_agent] pci_resource_classes`` of a PCI-in-Placement host:
        the classes the cloud's ``[pci] device_spec`` gives its devices.
        """
        from nova_gpu.tests.harness import cloud
        names = getattr(self, 'path_names', None)
        path = getattr(spec, 'path', None)
        if names is None or path is None:
            return {}
        if path == getattr(cloud, 'VFIO', None):
            return {spec.vgpu_type: names.vfio_rc}
        if path == getattr(cloud, 'PASSTHROUGH', None):
            model = cloud.catalog_mod.load_catalog().model(spec.model)
            return {model.pci_device_ids[0]: names.whole_rc}
        return {}

    def _fake_nvml(self, hostname):
        """The fake NVML of a host whose GPUs have NVLinks (only NVML tells
        them), else None: NVML is absent, as on a host without the
        driver. Not for MIG hosts (this fake shows no GPU instances).
        """
        spec = self._host_specs[hostname]
        mixed = getattr(spec, 'mixed_size', False)
        if not (spec.nvlink or mixed) or getattr(spec, 'mig', False):
            return None
        from nova_gpu.core import catalog as catalog_mod
        catalog = catalog_mod.load_catalog()
        pfs = [n for n in self.agent_hosts[hostname].nodes
               if n.vendor_id == NVIDIA_VENDOR and n.physfn is None]
        gpus = []
        for i, node in enumerate(pfs):
            model = catalog.model_for_pci(node.product_id)
            gpus.append({
                'address': node.address,
                'name': (model.nvml_names or (model.name,))[0],
                'memory_mib': model.framebuffer_mib,
                'numa_node': max(node.numa_node, 0),
                'nvlinks': [pfs[j].address for pair in spec.nvlink
                            if i in pair for j in pair if j != i],
                'lost': i in self.lost_gpus(hostname),
                'heterogeneous': 1 if mixed else None})
        return write_fake_nvml(os.path.join(self.agent_dirs[hostname],
                                            'nvml.json'), gpus)

    def start_gpu_agent(self, hostname):
        """Start (or restart) the agent of ``hostname``."""
        old = self.agents.pop(hostname, None)
        if old is not None:
            old.stop()
        workdir = self.agent_dirs[hostname]
        options = {'reconcile_interval': self.AGENT_INTERVAL,
                   'libvirt_retries': 0, 'remove_orphans': 'false'}
        nvml = self._fake_nvml(hostname)
        options['use_nvml'] = 'true' if nvml else 'false'
        classes = self._pci_resource_classes(self._host_specs[hostname])
        if classes:
            options['pci_resource_classes'] = ','.join(
                '%s:%s' % kv for kv in sorted(classes.items()))
        options.update(self.agent_options(hostname))
        path = write_config(
            os.path.join(workdir, 'nova-gpu.conf'), self.report_url,
            self.report_topic, workdir, self.agent_hosts[hostname].root,
            host=hostname, nodename=hostname, options={'gpu_agent': options})
        agent = AgentProcess(path, os.path.join(workdir, 'agent.log'),
                             fake_nvml=nvml)
        self.agents[hostname] = self.useFixture(agent)
        return agent

    def agent_options(self, hostname):
        """More ``[gpu_agent]`` options for the agent of ``hostname``."""
        return {}

    def lost_gpus(self, hostname):
        """Indices of the GPUs of ``hostname`` (a host with NVLinks, whose
        NVML is faked) that have fallen off the bus: NVML lists them and
        can say nothing else of them.
        """
        return ()

    def stop_gpu_agent(self, hostname):
        """Stop the agent of ``hostname``; return its exit status.

        ``sync_gpu_reports`` then fails for that host (its agent exited)
        until ``start_gpu_agent`` starts it again.
        """
        return self.agents[hostname].stop()

    def agent_runs_on(self, spec):
        """Whether a real agent reports ``spec``'s host. Not a MIG host:
        MIG instances are NVML's alone, and the fake NVML here shows none;
        the harness reports such a host as before.
        """
        return not getattr(spec, 'mig', False)

    def sync_gpu_reports(self, hostnames=None):
        """Wait for a report of each host (``hostnames``) that its agent
        took after this call, in the view of every scheduler service that
        listens for reports; the first call starts the agents.
        """
        hostnames = list(hostnames or self._host_specs)
        played = [h for h in hostnames
                  if not self.agent_runs_on(self._host_specs[h])]
        if played:
            super().sync_gpu_reports(played)
        hostnames = [h for h in hostnames if h not in played]
        if not hostnames:
            return
        # The agent processes cannot reach this process's Placement (it is
        # behind wsgi-intercept): the harness keeps their heads.
        self.keep_gpu_heads(hostnames)
        for hostname in hostnames:
            if hostname not in self.agents:
                self.start_gpu_agent(hostname)
        # A report's generation is the agent's clock in ms when it
        # numbered the report, after its discovery; the one after a
        # report numbered now or later was discovered after this call.
        since = int(time.time() * 1000)
        seen = self._wait_reports(hostnames, lambda h: since)
        self._wait_reports(hostnames, lambda h: seen[h] + 1)

    def report_views(self):
        """The views of the scheduler services whose listener runs."""
        from nova_gpu.scheduler import listener
        views = []
        for service in getattr(self, 'schedulers', ()):
            found = listener.listener_of(service.manager)
            if found is not None and found.running:
                views.append(found.view)
                # oslo.messaging names a pooled listener's queue after
                # its pool.
                pool = getattr(getattr(found, '_server', None), '_pool',
                               None)
                if pool and pool not in self.report_queues:
                    self.report_queues.append(pool)
        return views

    def _wait_reports(self, hostnames, minimum):
        """Wait until every listening view holds, for each host, a report
        numbered ``minimum(host)`` or more whose providers are resolved in
        Placement; return the lowest such number per host.
        """
        views = self.report_views()
        deadline = time.monotonic() + self.REPORT_TIMEOUT
        while True:
            found, missing = {}, []
            for hostname in hostnames:
                for view in views:
                    entry = view.get(hostname)
                    if (entry is None or entry.boot_id is None
                            or entry.generation < minimum(hostname)
                            or len(entry.uuids) < len(entry.providers)):
                        missing.append(hostname)
                        break
                    found[hostname] = min(
                        found.get(hostname, entry.generation),
                        entry.generation)
            if not missing:
                return found
            dead = [h for h in missing if not self.agents[h].running]
            if dead or time.monotonic() > deadline:
                late = (dead or missing)[0]
                self.fail('no fresh GPU report of %s (%s); agent log of %s:'
                          '\n%s' % (', '.join(missing),
                                    'agent exited' if dead else
                                    'waited %ds' % self.REPORT_TIMEOUT,
                                    late, self.agents[late].log_tail()))
            time.sleep(0.05)


def delete_queues(url, names):
    """Delete the broker queues ``names`` (a test's own topic queues, which
    would otherwise keep every report sent on the broker); best effort.
    """
    import kombu
    # kombu names oslo.messaging's rabbit:// scheme amqp://
    url = re.sub(r'^rabbit://', 'amqp://', url)
    try:
        with kombu.Connection(url, connect_timeout=5) as conn:
            channel = conn.channel()
            for name in names:
                channel.queue_delete(name)
    except Exception:  # the broker is gone: nothing is left to delete
        pass


if __name__ == '__main__':
    sys.exit(main())
