"""An in-process cloud with GPU hosts: real Nova, real Placement.

Built on Nova's own functional harness (``nova.tests.functional``): the
API, conductor, scheduler, Placement and nova-compute (libvirt driver) run
in this process; only the hypervisor is fake (``nova.tests.fixtures.
libvirt``), with mdev-capable PCI devices standing in for NVIDIA GPUs.

Each fake GPU carries the PCI device id of its model and exposes the
catalog's vGPU types as mdev types (``mdev_type_id``), so nova-compute
reports one VGPU inventory per physical GPU under the provider name
``<host>_pci_<address>`` exactly as on real hardware. No nova-gpu-agent
runs here; ``sync_gpu_reports`` plays its part: it builds each host's GPU
report from what the fake host exposes (PCI ids, NUMA nodes, the mdev type
nova-compute enabled per GPU, the NVLink pairs a real agent would read from
NVML, and the VGPU usage of each GPU provider in Placement) and hands it to
the scheduler through the notification endpoint, the same code path as in
production.

A host built with ``mig=True`` runs its GPUs in MIG mode with a MIG-backed
vGPU type (e.g. A100-2-10C on MIG 2g.10gb): to Nova this is still one mdev
type per GPU with VGPU inventory = max instances; the report says
``mig_enabled`` and lists each vGPU as the MIG slot behind it. The slot's
start slice is the one the scheduler's view chose for that instance (its
last decision on the host, or a claim it counted), kept for the instance's
life; when the view chose none (stock Nova, a multi-create the view did not
see) it is the first free start slice in order, as the driver would pick.

Use ``GpuCloudTestCase`` as a test base class, or ``start_cloud`` from a
script (the all-in-one demo).
"""

import collections
import dataclasses
import itertools
import os
import re
import sys
import time

import fixtures
from nova.tests import fixtures as nova_fixtures
from nova.tests.fixtures import libvirt as fakelibvirt
from nova.tests.functional.libvirt import test_vgpu
from oslo_config import cfg

from nova_gpu.core import catalog as catalog_mod
from nova_gpu.core import fragmentation
from nova_gpu.core import host as host_mod
from nova_gpu.core import report as report_mod
from nova_gpu.core import request as request_mod
from nova_gpu.scheduler import flavor as flavor_mod
from nova_gpu.scheduler import listener
from nova_gpu.scheduler import view as view_mod

CONF = cfg.CONF
IMAGE = '155d900f-4e14-4e4c-a73d-069cbf4541e6'  # in Nova's fake Glance

# nova.conf as an operator writes it to enable the plugin.
PLUGIN_CONF = {
    'filter_scheduler': {
        'available_filters': ['nova.scheduler.filters.all_filters',
                              'nova_gpu.scheduler.filters.GpuFilter'],
        'enabled_filters': ['ComputeFilter', 'ComputeCapabilitiesFilter',
                            'ImagePropertiesFilter',
                            'ServerGroupAntiAffinityFilter',
                            'ServerGroupAffinityFilter',
                            'NUMATopologyFilter', 'GpuFilter'],
        'weight_classes': [
            'nova.scheduler.weights.all_weighers',
            'nova_gpu.scheduler.weighers.GpuFragmentationWeigher',
            'nova_gpu.scheduler.weighers.GpuTopologyWeigher'],
    },
    'gpu_scheduler': {
        # Above the sum of Nova's spreading weighers (RAM, CPU, disk, I/O),
        # so that GPU packing decides on GPU hosts.
        'fragmentation_weight_multiplier': 10.0,
        'topology_weight_multiplier': 10.0,
        # Reports come from sync_gpu_reports, not a message bus.
        'report_listener': False,
    },
}
# The same cloud without the plugin: Nova's defaults.
STOCK_CONF = {
    'filter_scheduler': {
        'enabled_filters': ['ComputeFilter', 'ComputeCapabilitiesFilter',
                            'ImagePropertiesFilter',
                            'ServerGroupAntiAffinityFilter',
                            'ServerGroupAffinityFilter',
                            'NUMATopologyFilter'],
    },
}


@dataclasses.dataclass(frozen=True)
class GpuHost:
    """A fake compute host: ``gpus`` GPUs of ``model``.

    Each GPU is enabled for the vGPU type ``vgpu_type``; ``numa`` gives each
    GPU's NUMA node (2 nodes), ``nvlink`` the NVLink-connected pairs (as
    NVML would). ``mig``: the GPUs run in MIG mode and ``vgpu_type`` is a
    MIG-backed vGPU type.
    """

    name: str
    model: str
    vgpu_type: str
    gpus: int = 4
    numa: tuple = None
    nvlink: tuple = ()
    mig: bool = False

    def numa_of(self, index):
        return self.numa[index] if self.numa else index * 2 // self.gpus


_CATALOG = catalog_mod.load_catalog()


def mdev_type_id(profile):
    """The fake mdev type id of a catalog vGPU type (nvidia-<n>)."""
    return 'nvidia-%d' % (600 + _CATALOG.vgpu_profile_names().index(profile))


def profile_of_type(type_id):
    return _CATALOG.vgpu_profile_names()[int(type_id.split('-')[1]) - 600]


class FakeGpu(fakelibvirt.FakePCIDevice):
    """An NVIDIA GPU: its model's PCI id, one vGPU type as mdev type."""

    _types = re.compile(r"<capability type='mdev_types'>.*?</capability>",
                        re.S)

    def __init__(self, model, profile, **kw):
        self.gpu_model = _CATALOG.model(model)
        self.gpu_profile = self.gpu_model.vgpu_profile(profile)
        # Set once the host runs: counts the mdevs created on this GPU, so
        # that availableInstances drops as on a real driver.
        self.connection = None
        super().__init__(
            'MDEV_TYPES', prod_id=self.gpu_model.pci_device_ids[0],
            prod_name=(self.gpu_model.nvml_names or (model,))[0], **kw)

    def generate_xml(self, skip_capability=False):
        super().generate_xml(skip_capability)
        if skip_capability:
            return
        types = (
            "<capability type='mdev_types'><type id='%s'>"
            "<name>NVIDIA %s</name><deviceAPI>vfio-pci</deviceAPI>"
            "<availableInstances>@AVAILABLE@</availableInstances></type>"
            "</capability>" % (mdev_type_id(self.gpu_profile.name),
                               self.gpu_profile.name))
        self.pci_device = self._types.sub(types, self.pci_device)

    def XMLDesc(self, flags):
        used = 0
        if self.connection is not None:
            parent = '<parent>pci_%s</parent>' % re.sub('[:.]', '_',
                                                        self.address)
            used = sum(1 for mdev in
                       self.connection.mdev_info.devices.values()
                       if parent in mdev.xml)
        return self.pci_device.replace(
            '@AVAILABLE@', str(self.gpu_profile.max_instances - used))


# Tries to enter a cell before giving up (Nova's fixture alone: 3).
CELL_SWITCH_TRIES = 20


class _PatientTargetCell:
    """``nova.context.target_cell`` of Nova's test fixture, retried.

    Nova's ``CellDatabases`` fixture switches one global database state
    between cells and, when concurrent requests keep switching it under
    it, gives up after three tries: the context manager does not yield
    (``RuntimeError: generator didn't yield``) before its body ran. Under
    tens of concurrent boots that is the harness failing, not Nova, so
    entering is tried again, a little later each time.
    """

    def __init__(self, target_cell, context, cell_mapping):
        self._target_cell = target_cell
        self._args = (context, cell_mapping)
        self._entered = None

    def __enter__(self):
        for attempt in range(CELL_SWITCH_TRIES):
            manager = self._target_cell(*self._args)
            try:
                result = manager.__enter__()
            except RuntimeError as e:
                if ("didn't yield" not in str(e)
                        or attempt == CELL_SWITCH_TRIES - 1):
                    raise
                time.sleep(0.01 * (attempt + 1))
                continue
            self._entered = manager
            return result

    def __exit__(self, *exc_info):
        return self._entered.__exit__(*exc_info)


def _patient_cell_switching(case):
    import nova.context
    target_cell = nova.context.target_cell
    case.useFixture(fixtures.MonkeyPatch(
        'nova.context.target_cell',
        lambda context, cell_mapping: _PatientTargetCell(
            target_cell, context, cell_mapping)))


class _ToServer:
    """A SchedulerAPI whose RPC client sends to one scheduler ``server``."""

    class _Client:
        def __init__(self, client, server):
            self._client = client
            self._server = server

        def prepare(self, **kw):
            return self._client.prepare(server=self._server, **kw)

        def __getattr__(self, name):
            return getattr(self._client, name)

    def __init__(self, api, server):
        self.client = self._Client(api.client, server)


def _round_robin(case, servers):
    """Hand scheduling requests to the schedulers in turn.

    RabbitMQ gives a queue's messages to its consumers in turn; Nova's
    fake transport gives each to whichever listener polls first, which
    here is always the first scheduler. Each ``select_destinations`` call
    is sent to the next scheduler by name instead.
    """
    from nova.scheduler import rpcapi
    real = rpcapi.SchedulerAPI.select_destinations
    turn = itertools.cycle(servers)

    def select_destinations(api, *args, **kwargs):
        return real(_ToServer(api, next(turn)), *args, **kwargs)
    case.useFixture(fixtures.MonkeyPatch(
        'nova.scheduler.rpcapi.SchedulerAPI.select_destinations',
        select_destinations))


def _gpu_plugins(service):
    """The GpuFilter and GPU weigher objects of a nova-scheduler service."""
    from nova_gpu.scheduler import filters as filters_mod
    from nova_gpu.scheduler import weighers as weighers_mod
    hm = service.manager.host_manager
    return [obj for obj in list(hm.enabled_filters) + list(hm.weighers)
            if isinstance(obj, (filters_mod.GpuFilter,
                                weighers_mod._GpuWeigher))]


def _own_view(service):
    """Give ``service``'s GPU filter and weighers a view of their own.

    Where the plugin already keeps one view per scheduler service, that
    view is used as it is; where it keeps one per process (``get_view``),
    the service's filter and weighers get a fresh one here.
    """
    plugins = _gpu_plugins(service)
    if not plugins:
        return None  # stock Nova: nothing reads a view
    # The process-wide view, where the plugin still has one.
    shared = getattr(view_mod, 'get_view', lambda: None)()
    current = {id(p.view): p.view for p in plugins}
    if len(current) == 1 and shared not in current.values():
        return next(iter(current.values()))
    view = view_mod.GpuView(resolver=view_mod.PlacementResolver())
    for plugin in plugins:
        plugin._view = view
        if plugin.view is not view:
            raise RuntimeError('cannot give %s of %s its own GPU view'
                               % (type(plugin).__name__, service.host))
    return view


def _pci_info(spec, bus):
    info = fakelibvirt.HostPCIDevicesInfo(num_pci=0, num_pfs=0, num_vfs=0)
    for slot in range(spec.gpus):
        name = 'pci_0000_%02x_%02x_0' % (bus, slot)
        info.devices[name] = FakeGpu(
            spec.model, spec.vgpu_type, bus=bus, slot=slot, function=0,
            iommu_group=40 + slot, numa_node=spec.numa_of(slot))
    return info


def _address(libvirt_name):
    return '{}:{}:{}.{}'.format(*libvirt_name[4:].split('_'))


class GpuCloudTestCase(test_vgpu.VGPUTestBase):
    """Nova + Placement in process with the ``HOSTS`` GPU hosts started.

    ``NOVA_CONF`` is applied (group -> option -> value) before the
    scheduler starts, as nova.conf would be.
    """

    HOSTS = ()
    NOVA_CONF = PLUGIN_CONF
    USES_PLUGIN = True
    # nova-scheduler services started, each with its own GPU view fed by
    # the same reports (as several scheduler hosts in production).
    SCHEDULERS = 1

    def _setup_scheduler_service(self):
        # Runs before any service starts: the place for nova.conf.
        self.flags(api_paste_config=os.path.join(
            sys.prefix, 'etc', 'nova', 'api-paste.ini'), group='wsgi')
        for group, values in self.NOVA_CONF.items():
            self.flags(group=group, **values)
        self.gpu_view = view_mod.set_view(
            view_mod.GpuView(resolver=view_mod.PlacementResolver()))
        self.addCleanup(view_mod.set_view, None)
        self._generations = itertools.count(1)
        first = self.start_service('scheduler')
        self.schedulers = [first]
        self.gpu_views = [self.gpu_view]
        for n in range(1, self.SCHEDULERS):
            # Nova's start_service allows one scheduler; the fixture under
            # it does not mind. Both consume the same RPC topic.
            service = self.useFixture(nova_fixtures.ServiceFixture(
                'scheduler', host='scheduler-%d' % n)).service
            self.addCleanup(service.stop)
            self.schedulers.append(service)
            view = _own_view(service)
            if view is not None:
                self.gpu_views.append(view)
        if len(self.schedulers) > 1:
            _round_robin(self, [s.host for s in self.schedulers])
        return first

    def setUp(self):
        super().setUp()
        _patient_cell_switching(self)
        self._host_specs = {}
        self._buses = {}
        self._rp_uuids = {}  # provider name -> UUID, see _provider_get
        # provider name -> {consumer UUID: [MIG Slot, ...]}
        self._mig_slots = collections.defaultdict(dict)
        by_type = collections.defaultdict(list)
        for i, spec in enumerate(self.HOSTS):
            bus = 0x41 + i
            self._buses[spec.name] = bus
            by_type[mdev_type_id(spec.vgpu_type)].extend(
                '0000:%02x:%02x.0' % (bus, slot) for slot in range(spec.gpus))
        self.flags(enabled_mdev_types=sorted(by_type), group='devices')
        import nova.conf
        nova.conf.devices.register_dynamic_opts(CONF)
        for type_id, addresses in by_type.items():
            self.flags(device_addresses=addresses, group='mdev_' + type_id)
        for spec in self.HOSTS:
            self.add_gpu_host(spec)
        self.sync_gpu_reports()

    def add_gpu_host(self, spec):
        self._host_specs[spec.name] = spec
        self.start_compute(
            hostname=spec.name,
            pci_info=_pci_info(spec, self._buses[spec.name]),
            libvirt_version=self.FAKE_LIBVIRT_VERSION,
            qemu_version=self.FAKE_QEMU_VERSION)
        compute = self.computes[spec.name]
        conn = compute.driver._host.get_connection()
        for dev in conn.pci_info.devices.values():
            dev.connection = conn
        return compute

    # -- the agent's part -------------------------------------------------

    def gpu_report(self, hostname):
        """The GPU report nova-gpu-agent would publish for ``hostname``."""
        spec = self._host_specs[hostname]
        compute = self.computes[hostname]
        conn = compute.driver._host.get_connection()
        gpus = sorted((dev for dev in conn.pci_info.devices.values()
                       if isinstance(dev, FakeGpu)),
                      key=lambda d: d.address)
        index_of = {dev.address: i for i, dev in enumerate(gpus)}
        info = conn.host_info
        cells = info.cpu_nodes
        raw = []
        for i, dev in enumerate(gpus):
            model = _CATALOG.model_for_pci(dev.prod_id)
            # What nova-compute enabled on this GPU ([devices] and
            # [mdev_*] device_addresses); read directly, since the test base
            # patches _get_vgpu_type_per_pgpu to track the current host.
            type_id = (compute.driver.pgpu_type_mapping.get(dev.address)
                       or compute.driver.pgpu_type_default)
            profile = profile_of_type(type_id) if type_id else None
            provider = '%s_pci_%s' % (hostname,
                                      re.sub('[:.]', '_', dev.address))
            if spec.mig:
                devices = [{'kind': host_mod.MIG, 'detail': list(s.detail)}
                           for s in self._mig_devices(hostname, provider,
                                                      i, model, profile)]
            else:
                devices = [{'kind': host_mod.VGPU, 'detail': profile}
                           ] * self._vgpu_usage(provider)
            peers = [index_of[gpus[j].address]
                     for pair in spec.nvlink if i in pair
                     for j in pair if j != i]
            raw.append({
                'index': i, 'address': dev.address, 'model': model.name,
                'numa_node': dev.numa_node, 'pcie_switch': None,
                'nvlink_peers': sorted(peers), 'mig_enabled': spec.mig,
                'vgpu_types': [profile] if profile else None,
                'provider': provider, 'devices': devices})
        return {
            'version': report_mod.VERSION, 'host': hostname,
            'nodename': hostname, 'generation': next(self._generations),
            'cpu_milli': info.cpus * 1000,
            'memory_mib': info.kB_mem // 1024,
            'numa_cells': [{'id': n, 'cpu_milli': info.cpus * 1000 // cells,
                            'memory_mib': info.kB_mem // 1024 // cells}
                           for n in range(cells)],
            'gpus': raw}

    def _provider_get(self, provider_name, what):
        """GET ``/resource_providers/<uuid>/<what>`` of a named provider;
        None while Placement has no such provider.

        The name's UUID is remembered: reports are built often (every
        state change, and in the reliability runs many times a second).
        """
        for _attempt in range(2):
            uuid = self._rp_uuids.get(provider_name)
            if uuid is None:
                rps = self.placement.get(
                    '/resource_providers?name=%s' % provider_name).body[
                    'resource_providers']
                if not rps:
                    return None
                uuid = self._rp_uuids[provider_name] = rps[0]['uuid']
            resp = self.placement.get('/resource_providers/%s/%s'
                                      % (uuid, what))
            if resp.status == 200:
                return resp.body
            # Deleted and made again (a compute restarted): look it up.
            self._rp_uuids.pop(provider_name, None)
        return None

    def _vgpu_usage(self, provider_name):
        body = self._provider_get(provider_name, 'usages')
        return body['usages'].get('VGPU', 0) if body else 0

    def _vgpu_consumers(self, provider_name):
        """Consumer UUID -> VGPU count on the provider, from Placement."""
        body = self._provider_get(provider_name, 'allocations')
        if not body:
            return {}
        return {consumer: alloc['resources'].get('VGPU', 0)
                for consumer, alloc in body['allocations'].items()
                if alloc['resources'].get('VGPU')}

    def _mig_devices(self, hostname, provider, index, model, profile):
        """The MIG slots of GPU ``index``'s vGPUs (see the module doc)."""
        consumers = self._vgpu_consumers(provider)
        known = self._mig_slots[provider]
        for gone in set(known) - set(consumers):
            del known[gone]
        gpu = host_mod.Gpu(index, model, mig_enabled=True,
                           vgpu_types=[profile])
        for slots in known.values():
            for slot in slots:
                gpu.take(slot)
        request = request_mod.GpuRequest(host_mod.VGPU, profile)
        for consumer, count in sorted(consumers.items()):
            slots = known.setdefault(consumer, [])
            if len(slots) >= count:
                continue
            chosen = self._view_choices(hostname, consumer, index)
            while len(slots) < count:
                free = fragmentation.unit_slots(gpu, request)
                if not free:
                    raise RuntimeError('%s: no MIG slot left for the vGPU of '
                                       '%s' % (provider, consumer))
                slot = next((s for s in chosen if s in free), free[0])
                gpu.take(slot)
                slots.append(slot)
        return [s for _c, slots in sorted(known.items()) for s in slots]

    def _view_choices(self, hostname, consumer, index):
        """MIG slots on GPU ``index`` the scheduler's view chose, best
        first: its decision for ``consumer``, then the claims it counted.
        """
        placements = []
        for view in self._views():
            entry = view.get(hostname)
            if entry is None:
                continue
            last = entry.last
            if (last is not None and last.ranked is not None
                    and last.instance_uuid == consumer):
                placements.insert(0, last.ranked.choice.placement)
            placements.extend(p for _expiry, p in entry.pending)
        return [s for p in placements for s in p.slots
                if s.gpu == index and s.kind == host_mod.MIG]

    def mig_slots_of(self, server):
        """GPU provider name -> MIG slots of the server's vGPUs."""
        return {provider: list(by_consumer[server['id']])
                for provider, by_consumer in self._mig_slots.items()
                if by_consumer.get(server['id'])}

    def _views(self):
        """Every scheduler's GPU view (``gpu_view`` is the first one's)."""
        return [self.gpu_view] + getattr(self, 'gpu_views', [])[1:]

    def sync_gpu_reports(self, hostnames=None):
        """Publish every host's report (or ``hostnames``') to the
        schedulers' views.
        """
        endpoints = [listener.ReportEndpoint(view)
                     for view in self._views()]
        for hostname in hostnames or self._host_specs:
            report = self.gpu_report(hostname)
            for endpoint in endpoints:
                endpoint.info({}, '%s.%s' % (listener.PUBLISHER, hostname),
                              listener.EVENT_TYPE, report, {})

    def _wait_for_state_change(self, server, expected_status, *args,
                               **kwargs):
        server = super()._wait_for_state_change(server, expected_status,
                                                *args, **kwargs)
        # The agent reports after every device change.
        self.sync_gpu_reports()
        return server

    # -- helpers for tests and the demo -----------------------------------

    def create_gpu_flavor(self, extra_specs, memory_mb=2048, vcpu=2,
                          name=None, **kw):
        """A flavor with ``gpu:`` extra specs plus the Placement keys.

        ``kw``: more of ``_create_flavor``'s arguments (disk, ephemeral...).
        """
        specs = dict(extra_specs)
        if not any(k.startswith('resources') for k in specs):
            parsed = flavor_mod.parse(specs, vcpus=vcpu, memory_mb=memory_mb)
            specs.update(flavor_mod.placement_extra_specs(parsed))
        return self._create_flavor(memory_mb=memory_mb, vcpu=vcpu,
                                   name=name, extra_spec=specs, **kw)

    def boot(self, flavor_id, expected_state='ACTIVE', **kw):
        return self._create_server(image_uuid=IMAGE, flavor_id=flavor_id,
                                   networks='none',
                                   expected_state=expected_state, **kw)

    def gpu_providers_of(self, server):
        """Names of the GPU providers holding the server's vGPUs."""
        allocations = self._get_allocations_by_server_uuid(server['id'])
        names = []
        for rp_uuid, alloc in allocations.items():
            if 'VGPU' in alloc['resources']:
                names.append(self.placement.get(
                    '/resource_providers/%s' % rp_uuid).body['name'])
        return sorted(names)

    def provider_name(self, hostname, index):
        """Provider name of GPU ``index`` (PCI order) on ``hostname``."""
        return '%s_pci_0000_%02x_%02x_0' % (hostname, self._buses[hostname],
                                            index)

    def gpu_index(self, provider_name):
        return int(provider_name.rsplit('_', 2)[-2], 16)

    def vgpu_usage(self, hostname):
        """GPU index -> (used, total) VGPU of ``hostname``'s providers."""
        spec = self._host_specs[hostname]
        result = {}
        for i in range(spec.gpus):
            rps = self.placement.get('/resource_providers?name=%s'
                                     % self.provider_name(hostname, i)).body[
                'resource_providers']
            uuid = rps[0]['uuid']
            total = self._get_provider_inventory(uuid)['VGPU']['total']
            result[i] = (self._get_provider_usages(uuid)['VGPU'], total)
        return result


def start_cloud(hosts, nova_conf=None):
    """Start the cloud outside a test runner; call ``.doCleanups()`` to stop.

    Returns the running GpuCloudTestCase: use ``create_gpu_flavor``,
    ``boot``, ``gpu_providers_of``, ``api`` and ``placement`` on it.
    """
    attrs = {'HOSTS': tuple(hosts), 'runTest': lambda self: None}
    if nova_conf is not None:
        attrs['NOVA_CONF'] = nova_conf
    case = type('GpuCloud', (GpuCloudTestCase,), attrs)()
    case.useFixture(fixtures.EnvironmentVariable('OS_TEST_TIMEOUT', '0'))
    case.setUp()
    return case
