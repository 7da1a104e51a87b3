"""What a boot waits for: ``select_destinations`` end to end, per path.

Issue #26 asks what a user feels, not what a host costs: the scheduler
manager's ``select_destinations`` (Placement's ``GET
/allocation_candidates``, Nova's ``HostManager`` reading the compute
nodes and services of the candidates, filters, weighers, and the claim,
``PUT /allocations``), with stock Nova's configuration of a path and with
the plugin added.

Method. One process runs real Nova 34 and real Placement in process
(``nova_gpu.tests.harness.cloud.start_cloud`` with no hosts: Nova's
functional fixtures, Placement on its sqlite file, Nova's cell database
in memory). The GPU hosts are written straight into the databases, which
is hundreds of times faster than starting a nova-compute per host: one
host is made through the objects (Nova's ``Service`` and ``ComputeNode``)
and its rows copied for the others; Placement's rows (the compute node's
provider with VCPU, MEMORY_MB and DISK_GB, its nested GPU providers named
as Nova names them, their inventories, and allocations of existing
servers: hosts already use 0 to 75 % of their GPUs, with the CPUs,
memory and disk those servers take) are inserted in bulk. Every
scheduler's ``HostManager`` is told that every host's instance list is
current (as running nova-computes keep it), so no configuration reads
instances per host.

Three scheduler managers run side by side on the same databases, each
made under its own configuration (``etc/nova`` through
``nova_gpu.tests.harness.service_conf``): ``stock`` (Nova's
``SchedulerManager``, Nova's filters of the GPU paths, Nova's weighers:
the harness's ``STOCK_CONF``), ``plugin`` (``GpuSchedulerManager``,
``nova-scheduler.conf``: the default) and ``large-cloud``
(``nova-scheduler.conf`` + ``nova-scheduler-large-cloud.conf``). The
plugin's GPU view of each is fed each host's GPU report directly
(``view.ingest`` + ``set_provider_uuids``) instead of over RabbitMQ.
Every request is a fresh ``RequestSpec`` built as nova-api and
nova-conductor build it (``RequestSpec.from_components``), with the
flavor of its configuration: ``resources:VGPU=1`` for stock, ``gpu:profile``
plus the plugin's Placement keys (``flavor.placement_extra_specs``) for
the plugin; the call is ``select_destinations(..., return_objects=True,
return_alternates=True)`` as the conductor makes it.

Latency: ``--requests`` rounds, each one request per configuration in a
rotating order (so the machine's load falls on all alike); the claim is
deleted after each request, untimed. Median and p90 of wall time.
Throughput: ``--threads`` threads send ``--burst`` requests each to one
configuration's manager, the configurations taking turns, ``--bursts``
times; requests per second of each burst, the median counts; claims are
deleted after each burst, untimed. The claims of the bursts are counted
(``nova.scheduler.utils.claim_resources``): tried, lost (Placement
refused: a concurrent request took the room first) and, for the plugin,
requests scheduled again after lost claims. Ratios are to stock measured
in the same run. Nova's ``[scheduler] max_placement_results`` (1000) caps what
Placement returns: the filters and weighers see the hosts of 1,000
candidates, whatever the cloud's size; what grows with the cloud is
Placement's query and Nova's reading of services.

Run: ``python -m nova_gpu.bench.select_destinations [--hosts 1000 10000]
[--paths vgpu-vf,vgpu-pf] [--quick]``.
"""

import argparse
import collections
import concurrent.futures
import datetime
import functools
import logging
import statistics
import sys
import threading
import time
import uuid as uuid_mod

from nova_gpu.bench import claims as claims_mod
from nova_gpu import tables

# path -> (model, vGPU type, GPUs per host, harness path)
PATHS = collections.OrderedDict((
    ('vgpu-vf', ('A100-40GB', 'A100-10C', 4, 'vf_mdev')),
    ('vgpu-pf', ('T4', 'T4-4C', 4, 'pf_mdev')),
    # Vendor-VFIO VFs, pooled per PF (PCI in Placement).
    ('pci-pool', ('H100-80GB', 'H100-10C', 4, 'vfio')),
    # Whole GPUs (PCI in Placement).
    ('passthrough', ('H100-80GB', None, 8, 'passthrough')),
))
# The PCI paths: Nova's PCI devices, in Placement (nova-gpu-pci.conf in
# every configuration, stock's too), asked through [pci] alias.
PCI_PATHS = ('vfio', 'passthrough')
# Stock Nova's flavor on the PCI paths (the mdev paths: resources:VGPU=1).
STOCK_SPECS = {'vfio': {'pci_passthrough:alias': 'nvidia-vgpu:1'},
               'passthrough': {'pci_passthrough:alias': 'nvidia-gpu:1'}}
# PCI vendor and device ids of the fake hosts' H100 SXM5 PF and its VFs.
PCI_VENDOR, PCI_PF, PCI_VF = '10de', '2330', '2330'
CONFIGS = ('stock', 'plugin', 'large-cloud')
HOSTS = (1000, 10000)
CPUS = 64
MEMORY_MB = 524288
DISK_GB = 4000
CPU_RATIO = 4.0
# Each server (existing or requested): 8 vCPUs, 32 GiB, 40 GB, one vGPU.
FLAVOR = {'vcpus': 8, 'memory_mb': 32768, 'root_gb': 40}
# Share of a host's vGPUs already taken, host by host (0 to 75 %).
USAGE = (0.0, 0.25, 0.5, 0.75, 0.25, 0.5, 0.0, 0.5)
FULL = {'requests': 30, 'threads': 4, 'burst': 5, 'bursts': 3}
QUICK = {'requests': 8, 'threads': 4, 'burst': 3, 'bursts': 2}
TARGET_LATENCY = 1.05   # plugin / stock, at most
TARGET_THROUGHPUT = 0.95  # plugin / stock, at least


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        prog='python -m nova_gpu.bench.select_destinations',
        description=__doc__.splitlines()[0])
    parser.add_argument('--hosts', nargs='+', type=int, default=None,
                        help='cloud sizes (default: 1000 10000; '
                        '--quick: 1000)')
    parser.add_argument('--paths', default=None,
                        help='comma-separated, of: %s (default: all; '
                        '--quick: vgpu-vf)' % ', '.join(PATHS))
    parser.add_argument('--quick', action='store_true',
                        help='fewer requests, one size, one path')
    parser.add_argument('--configs', default=','.join(CONFIGS),
                        help='comma-separated, of: %s (stock always: the '
                        'ratios are to it; each other one builds a view of '
                        'every host, minutes at 10,000 hosts)'
                        % ', '.join(CONFIGS))
    for name in FULL:
        parser.add_argument('--' + name, type=int, default=None)
    args = parser.parse_args(argv)
    if args.paths is None:
        args.paths = ['vgpu-vf'] if args.quick else list(PATHS)
    else:
        args.paths = [p for p in args.paths.split(',') if p]
    unknown = [p for p in args.paths if p not in PATHS]
    if unknown:
        parser.error('no such path: %s (paths: %s)' % (
            ', '.join(unknown), ', '.join(PATHS)))
    wanted = {c for c in args.configs.split(',') if c}
    if wanted - set(CONFIGS):
        parser.error('no such configuration: %s (configurations: %s)' % (
            ', '.join(sorted(wanted - set(CONFIGS))), ', '.join(CONFIGS)))
    args.configs = tuple(c for c in CONFIGS if c in wanted or c == 'stock')
    if args.hosts is None:
        args.hosts = [1000] if args.quick else list(HOSTS)
    if any(n < 1 for n in args.hosts):
        parser.error('a number of hosts is a positive integer')
    for name, value in (QUICK if args.quick else FULL).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    return args


def plan(args):
    """[(path, hosts)] in the order they run."""
    return [(path, n) for n in args.hosts for path in args.paths]


def _percentile(values, share):
    values = sorted(values)
    return values[min(len(values) - 1, int(share * len(values)))]


class _Host:
    """One fake GPU host: its names, provider UUIDs and usage."""

    def __init__(self, path, index):
        model, vgpu_type, gpus, kind = PATHS[path]
        self.name = 'gpu%05d' % index
        self.uuid = str(uuid_mod.uuid5(uuid_mod.NAMESPACE_DNS, self.name))
        self.kind = kind
        self.vgpu_type = vgpu_type
        self.model = model
        # [(GPU address, [(provider name, provider uuid, total)])]
        self.gpus = []
        from nova_gpu.core import report as report_mod
        from nova_gpu.tests.harness import cloud
        per_gpu = _per_gpu(model, vgpu_type)
        # The VFs of each PF (SR-IOV paths).
        self.vfs = {}
        for g in range(gpus):
            bus = 0x41 + g
            pf = cloud.pci_address(bus, 0, 0)
            vfs = [cloud.pci_address(bus, (4 + n) // 8, (4 + n) % 8)
                   for n in range(per_gpu)]
            if kind == cloud.VF_MDEV:
                units = [(vf, 1) for vf in vfs]
            else:
                units = [(pf, per_gpu)]
            if kind == cloud.VFIO:
                self.vfs[pf] = vfs
            name_of = (report_mod.pci_provider_name if kind in PCI_PATHS
                       else report_mod.mdev_provider_name)
            self.gpus.append((pf, [
                (name_of(self.name, address),
                 str(uuid_mod.uuid5(uuid_mod.NAMESPACE_DNS,
                                    self.name + address)), total, address)
                for address, total in units]))
        capacity = gpus * per_gpu
        self.used = int(USAGE[index % len(USAGE)] * capacity)

    def providers(self):
        return [p for _pf, ps in self.gpus for p in ps]

    def used_units(self):
        """[(provider uuid, consumer uuid)] of the existing servers."""
        out = []
        left = self.used
        for _name, rp, total, _addr in self.providers():
            for k in range(total):
                if left <= 0:
                    return out
                out.append((rp, str(uuid_mod.uuid5(
                    uuid_mod.NAMESPACE_DNS, '%s-%d' % (rp, k)))))
                left -= 1
        return out

    def pci_pools(self):
        """The compute node's PCI device pools as nova-compute reports
        them with ``[filter_scheduler] pci_in_placement`` (one pool per PF
        or per PF's VFs, tagged with its provider; ``count`` the free
        devices), or None on the mdev paths.
        """
        if self.kind not in PCI_PATHS:
            return None
        taken = collections.Counter(rp for rp, _c in self.used_units())
        pools = []
        for i, (pf, providers) in enumerate(self.gpus):
            for _name, rp, total, _addr in providers:
                pools.append({
                    'vendor_id': PCI_VENDOR,
                    'product_id': PCI_VF if self.vfs else PCI_PF,
                    'numa_node': i * 2 // len(self.gpus),
                    'dev_type': 'type-VF' if self.vfs else 'type-PF',
                    'address': pf, 'rp_uuid': rp,
                    'count': total - taken[rp]})
        return pools

    def report(self):
        from nova_gpu.core import host as host_mod
        from nova_gpu.core import report as report_mod
        from nova_gpu.tests.harness import cloud
        taken = collections.Counter(rp for rp, _c in self.used_units())
        gpus = []
        kind = {cloud.VF_MDEV: report_mod.VF_MDEV,
                cloud.VFIO: report_mod.PCI_POOL,
                cloud.PASSTHROUGH: report_mod.PCI_DEVICE}.get(
                    self.kind, report_mod.PF_MDEV)
        rc = _resource_class(self.kind)
        for i, (pf, providers) in enumerate(self.gpus):
            devices = []
            for _n, rp, _t, _a in providers:
                for k in range(taken[rp]):
                    instance = str(uuid_mod.uuid5(uuid_mod.NAMESPACE_DNS,
                                                  '%s-%d' % (rp, k)))
                    if self.vgpu_type is None:
                        devices.append({'kind': host_mod.WHOLE,
                                        'instance': instance})
                        continue
                    device = {'kind': host_mod.VGPU,
                              'detail': self.vgpu_type,
                              'instance': instance}
                    if self.kind == cloud.VFIO:
                        device['vf'] = self.vfs[pf][k]
                    else:
                        device['uuid'] = str(uuid_mod.uuid5(
                            uuid_mod.NAMESPACE_DNS, '%s-mdev-%d' % (rp, k)))
                    devices.append(device)
            gpus.append({
                'index': i, 'address': pf, 'model': self.model,
                'numa_node': i * 2 // len(self.gpus), 'pcie_switch': None,
                'nvlink_peers': [], 'mig_enabled': False,
                'vgpu_types': [self.vgpu_type] if self.vgpu_type else [],
                'providers': [report_mod.provider_dict(
                    name, kind, address, rc, self.vgpu_type,
                    vfs=self.vfs.get(address, ()))
                    for name, _rp, _t, address in providers],
                'devices': devices, 'idle_mdevs': [],
                'idle_gpu_instances': []})
        return {
            'version': report_mod.VERSION, 'host': self.name,
            'nodename': self.name, 'generation': 1,
            'cpu_milli': CPUS * 1000, 'memory_mib': MEMORY_MB,
            'numa_cells': [{'id': n, 'cpu_milli': CPUS * 500,
                            'memory_mib': MEMORY_MB // 2} for n in (0, 1)],
            'gpus': gpus}


@functools.lru_cache()
def _per_gpu(model, vgpu_type):
    from nova_gpu.tests.harness import cloud
    if vgpu_type is None:
        return 1  # a whole GPU
    return cloud.GpuHost('x', model, vgpu_type).profile().max_instances


def _resource_class(kind):
    from nova_gpu.core import report as report_mod
    return {'vfio': report_mod.VFIO_VGPU_RC,
            'passthrough': report_mod.WHOLE_GPU_RC}.get(kind,
                                                        report_mod.VGPU_RC)


def _placement_rows(hosts):
    """Insert the hosts' providers, inventories and usage into Placement's
    database, in bulk (its own tables, as Placement writes them).
    """
    import sqlalchemy as sa

    from placement import db_api
    engine = db_api.placement_context_manager.writer.get_engine()
    meta = sa.MetaData()
    meta.reflect(engine)
    t = meta.tables
    now = datetime.datetime.utcnow()
    with engine.begin() as conn:
        rcs = {name: rid for rid, name in conn.execute(
            sa.select(t['resource_classes'].c.id,
                      t['resource_classes'].c.name))}
        if not rcs:
            raise RuntimeError('Placement has not synced its resource '
                               'classes')
        owner = conn.execute(sa.select(t['traits'].c.id).where(
            t['traits'].c.name == 'OWNER_NOVA')).scalar()
        project = conn.execute(t['projects'].insert().values(
            external_id='bench-project',
            created_at=now)).inserted_primary_key[0]
        user = conn.execute(t['users'].insert().values(
            external_id='bench-user', created_at=now)).inserted_primary_key[0]
        next_id = (conn.execute(sa.select(sa.func.max(
            t['resource_providers'].c.id))).scalar() or 0) + 1
        rps, inventories, consumers, allocations = [], [], [], []
        traits = []
        for host in hosts:
            root = next_id
            next_id += 1
            rps.append({'id': root, 'uuid': host.uuid, 'name': host.name,
                        'generation': 1, 'root_provider_id': root,
                        'parent_provider_id': None, 'created_at': now})
            # Nova 34 asks for root_required=OWNER_NOVA.
            traits.append({'trait_id': owner, 'resource_provider_id': root,
                           'created_at': now})
            for rc, total, ratio, reserved in (
                    ('VCPU', CPUS, CPU_RATIO, 0),
                    ('MEMORY_MB', MEMORY_MB, 1.0, 512),
                    ('DISK_GB', DISK_GB, 1.0, 0)):
                inventories.append({
                    'resource_provider_id': root,
                    'resource_class_id': rcs[rc], 'total': total,
                    'reserved': reserved, 'min_unit': 1, 'max_unit': total,
                    'step_size': 1, 'allocation_ratio': ratio,
                    'created_at': now})
            ids = {}
            rc = _resource_class(host.kind)
            for name, rp, total, _addr in host.providers():
                ids[rp] = next_id
                rps.append({'id': next_id, 'uuid': rp, 'name': name,
                            'generation': 1, 'root_provider_id': root,
                            'parent_provider_id': root, 'created_at': now})
                if host.kind in PCI_PATHS:
                    # Nova 34 asks OWNER_NOVA of PCI request groups too.
                    traits.append({'trait_id': owner,
                                   'resource_provider_id': next_id,
                                   'created_at': now})
                inventories.append({
                    'resource_provider_id': next_id,
                    'resource_class_id': rcs[rc], 'total': total,
                    'reserved': 0, 'min_unit': 1, 'max_unit': total,
                    'step_size': 1, 'allocation_ratio': 1.0,
                    'created_at': now})
                next_id += 1
            for rp, consumer in host.used_units():
                consumers.append({'uuid': consumer, 'project_id': project,
                                  'user_id': user, 'generation': 1,
                                  'created_at': now})
                for provider, rc, used in (
                        (root, 'VCPU', FLAVOR['vcpus']),
                        (root, 'MEMORY_MB', FLAVOR['memory_mb']),
                        (root, 'DISK_GB', FLAVOR['root_gb']),
                        (ids[rp], rc, 1)):
                    allocations.append({
                        'resource_provider_id': provider,
                        'consumer_id': consumer,
                        'resource_class_id': rcs[rc], 'used': used,
                        'created_at': now})
        for table, rows in (('resource_providers', rps),
                            ('inventories', inventories),
                            ('resource_provider_traits', traits),
                            ('consumers', consumers),
                            ('allocations', allocations)):
            for start in range(0, len(rows), 5000):
                conn.execute(t[table].insert(), rows[start:start + 5000])
    return len(rps), len(allocations)


def _cell_rows(ctxt, hosts):
    """The hosts' services and compute nodes in cell1's database: the
    first made through Nova's objects, the others copies of its rows.
    """
    import sqlalchemy as sa

    from nova import context as nova_context
    from nova.db.main import api as main_db
    from nova import objects

    cell = next(c for c in objects.CellMappingList.get_all(ctxt)
                if c.name == 'cell1')
    first = hosts[0]
    with nova_context.target_cell(ctxt, cell) as cctxt:
        service = objects.Service(cctxt, host=first.name,
                                  binary='nova-compute', topic='compute',
                                  report_count=1, disabled=False,
                                  forced_down=False)
        service.create()
        topology = _numa_topology()
        node = objects.ComputeNode(
            cctxt, host=first.name, hypervisor_hostname=first.name,
            uuid=first.uuid, service_id=service.id, vcpus=CPUS,
            memory_mb=MEMORY_MB, local_gb=DISK_GB, vcpus_used=0,
            memory_mb_used=0, local_gb_used=0, free_ram_mb=MEMORY_MB,
            free_disk_gb=DISK_GB, current_workload=0, running_vms=0,
            hypervisor_type='QEMU', hypervisor_version=8002000,
            cpu_info='{}', disk_available_least=DISK_GB,
            host_ip='192.0.2.1', supported_hv_specs=[], stats={},
            numa_topology=topology._to_json(), cpu_allocation_ratio=CPU_RATIO,
            ram_allocation_ratio=1.0, disk_allocation_ratio=1.0,
            mapped=1, pci_device_pools=_pci_pools(first))
        node.create()
        engine = main_db.get_engine(context=cctxt)
        meta = sa.MetaData()
        meta.reflect(engine, only=('services', 'compute_nodes'))
        services, nodes = meta.tables['services'], meta.tables['compute_nodes']
        with engine.begin() as conn:
            s_row = dict(conn.execute(sa.select(services).where(
                services.c.id == service.id)).mappings().one())
            n_row = dict(conn.execute(sa.select(nodes).where(
                nodes.c.id == node.id)).mappings().one())
            s_next = conn.execute(sa.select(sa.func.max(
                services.c.id))).scalar() + 1
            n_next = conn.execute(sa.select(sa.func.max(
                nodes.c.id))).scalar() + 1
            s_rows, n_rows = [], []
            for i, host in enumerate(hosts[1:]):
                s_rows.append(dict(s_row, id=s_next + i, host=host.name,
                                   uuid=str(uuid_mod.uuid4())))
                used = host.used
                n_rows.append(dict(
                    n_row, id=n_next + i, service_id=s_next + i,
                    host=host.name,
                    hypervisor_hostname=host.name, uuid=host.uuid,
                    vcpus_used=used * FLAVOR['vcpus'],
                    memory_mb_used=used * FLAVOR['memory_mb'],
                    local_gb_used=used * FLAVOR['root_gb'],
                    free_ram_mb=MEMORY_MB - used * FLAVOR['memory_mb'],
                    free_disk_gb=DISK_GB - used * FLAVOR['root_gb'],
                    running_vms=used, pci_stats=_pci_stats(host)))
            for start in range(0, len(s_rows), 5000):
                conn.execute(services.insert(), s_rows[start:start + 5000])
                conn.execute(nodes.insert(), n_rows[start:start + 5000])


def _pci_pools(host):
    from nova import objects
    pools = host.pci_pools()
    if pools is None:
        return None
    return objects.PciDevicePoolList(objects=[
        objects.PciDevicePool.from_dict(pool) for pool in pools])


def _pci_stats(host):
    """The ``pci_stats`` column of ``host``'s compute node (as
    ``ComputeNode`` writes its ``pci_device_pools``).
    """
    from oslo_serialization import jsonutils
    pools = _pci_pools(host)
    return None if pools is None else jsonutils.dumps(
        pools.obj_to_primitive())


def _numa_topology():
    from nova import objects
    cells = []
    half = CPUS // 2
    for cid in range(2):
        cpus = set(range(cid * half, (cid + 1) * half))
        cells.append(objects.NUMACell(
            id=cid, socket=cid, cpuset=cpus, pcpuset=set(),
            memory=MEMORY_MB // 2, cpu_usage=0, memory_usage=0,
            pinned_cpus=set(), siblings=[{c} for c in sorted(cpus)],
            mempages=[objects.NUMAPagesTopology(
                size_kb=4, total=MEMORY_MB // 2 * 256, used=0)],
            network_metadata=objects.NetworkMetadata(physnets=set(),
                                                     tunneled=False)))
    return objects.NUMATopology(cells=cells)


def _config_values(name, pci=False):
    """{(group, option): value} nova-scheduler runs ``name`` with
    (``pci``: with ``nova-gpu-pci.conf``, as every service of a cloud
    with a PCI path).
    """
    from nova_gpu.tests.harness import cloud
    from nova_gpu.tests.harness import service_conf
    files = {'plugin': service_conf.SERVICE_FILES[service_conf.SCHEDULER],
             'large-cloud': service_conf.LARGE_CLOUD_FILES}
    values = {('filter_scheduler', 'available_filters'):
              ['nova.scheduler.filters.all_filters'],
              ('filter_scheduler', 'weight_classes'):
              ['nova.scheduler.weights.all_weighers'],
              ('filter_scheduler', 'shuffle_best_same_weighed_hosts'): False}
    if name == 'stock':
        values.update(((g, o), v) for g, opts in cloud.STOCK_CONF.items()
                      for o, v in opts.items())
    else:
        values.update(service_conf.merge(files[name]))
    if pci:
        values.update(service_conf.merge([service_conf.PCI_FILE]))
    values[('gpu_scheduler', 'report_listener')] = False
    return values


def _apply(values):
    from nova.pci import request as pci_request
    from oslo_config import cfg
    for (group, option), value in values.items():
        cfg.CONF.set_override(option, value, group)
    # Nova reads [pci] alias once per process (functools.cache).
    pci_request.get_alias_from_config.cache_clear()


class Bench:
    """The cloud, its hosts, and the three schedulers of one (path, n)."""

    def __init__(self, case, path, n, log, configs=CONFIGS):
        from nova import context as nova_context
        from nova import objects
        from nova.scheduler import manager as nova_manager
        from oslo_config import cfg

        from nova_gpu.scheduler import gpu_spec as flavor_mod
        from nova_gpu.scheduler import manager as gpu_manager
        from nova_gpu.scheduler import view as view_mod

        self.case = case
        self.path = path
        self.ctxt = nova_context.RequestContext(
            'bench-user', 'bench-project', is_admin=True)
        admin = nova_context.get_admin_context()
        start = time.perf_counter()
        model, vgpu_type, _gpus, kind = PATHS[path]
        pci = kind in PCI_PATHS
        if pci:
            rc = _resource_class(kind)
            case.placement.put('/resource_classes/%s' % rc, None,
                               version='1.7')
        self.configs = configs
        self.values = {name: _config_values(name, pci) for name in configs}
        self.hosts = [_Host(path, i) for i in range(n)]
        providers, allocations = _placement_rows(self.hosts)
        _cell_rows(admin, self.hosts)
        log('  %s x %d: %d providers, %d allocations, compute nodes: '
            '%.0f s' % (path, n, providers, allocations,
                        time.perf_counter() - start))
        # Services were last seen when they were made: up for the run.
        cfg.CONF.set_override('service_down_time', 10 ** 7)
        self.managers, self.flavors = {}, {}
        for name in configs:
            _apply(self.values[name])
            cls = (nova_manager.SchedulerManager if name == 'stock'
                   else gpu_manager.GpuSchedulerManager)
            manager = cls()
            manager.init_host(None)
            for info in manager.host_manager._instance_info.values():
                info['updated'] = True
            for host in self.hosts:
                manager.host_manager._instance_info.setdefault(
                    host.name, {'instances': {}, 'updated': True})
            self.managers[name] = manager
            if name == 'stock':
                specs = dict(STOCK_SPECS.get(kind, {'resources:VGPU': '1'}))
            else:
                specs = ({'gpu:model': model, 'gpu:kind': 'whole'}
                         if vgpu_type is None else
                         {'gpu:profile': vgpu_type})
                if kind == 'vfio':
                    specs['gpu:backend'] = 'vfio'
                parsed = flavor_mod.parse(specs, vcpus=FLAVOR['vcpus'],
                                          memory_mb=FLAVOR['memory_mb'])
                specs.update(flavor_mod.placement_extra_specs(parsed))
                view = view_mod.of_service(manager)
                for host in self.hosts:
                    view.ingest(host.report())
                    view.set_provider_uuids(host.name, {
                        p[0]: p[1] for p in host.providers()})
            self.flavors[name] = objects.Flavor(
                name='bench-' + name, flavorid='bench-' + name,
                vcpus=FLAVOR['vcpus'], memory_mb=FLAVOR['memory_mb'],
                root_gb=FLAVOR['root_gb'], ephemeral_gb=0, swap=0,
                rxtx_factor=1.0, is_public=True, disabled=False,
                extra_specs=specs)
        log('  schedulers ready: %.0f s' % (time.perf_counter() - start))

    def spec(self, name):
        from nova import objects
        from nova.pci import request as pci_request
        # nova-api's configuration (the PCI aliases) builds the request.
        _apply(self.values[name])
        flavor = self.flavors[name]
        instance = str(uuid_mod.uuid4())
        spec = objects.RequestSpec.from_components(
            self.ctxt, instance, objects.ImageMeta(
                properties=objects.ImageMetaProps()),
            flavor, None, pci_request.get_pci_requests_from_flavor(flavor),
            {}, None, None)
        # from_components made the PCI request groups (pci_in_placement).
        return instance, spec

    def select(self, name, instance, spec):
        """One select_destinations; the host chosen (None: NoValidHost)."""
        from nova import exception
        _apply(self.values[name])
        try:
            result = self.managers[name].select_destinations(
                self.ctxt, spec_obj=spec, instance_uuids=[instance],
                return_objects=True, return_alternates=True)
        except Exception as e:
            inner = getattr(e, 'exc_info', (None, e))[1]
            if isinstance(inner, exception.NoValidHost):
                return None
            raise
        return result[0][0].compute_node_uuid

    def unclaim(self, instances):
        client = self.managers['stock'].placement_client
        for instance in instances:
            client.delete_allocation_for_instance(self.ctxt, instance,
                                                  force=True)

    def latency(self, requests):
        times = collections.defaultdict(list)
        refused = collections.Counter()
        for r in range(requests):
            k = r % len(self.configs)
            order = self.configs[k:] + self.configs[:k]
            for name in order:
                instance, spec = self.spec(name)
                start = time.perf_counter()
                host = self.select(name, instance, spec)
                times[name].append(time.perf_counter() - start)
                if host is None:
                    refused[name] += 1
                self.unclaim([instance])
        return times, refused

    def throughput(self, threads, burst, bursts):
        """Requests per second of each burst, per configuration, and the
        claims Nova made in them: ``(rates, claims)``, ``claims[name]`` =
        ``[tried, refused by Placement, requests scheduled again]``.
        """
        rates = collections.defaultdict(list)
        claims = collections.defaultdict(claims_mod.Claims)
        retries = collections.Counter()
        lock = threading.Lock()
        for b in range(bursts):
            k = b % len(self.configs)
            order = self.configs[k:] + self.configs[:k]
            for name in order:
                specs = [self.spec(name) for _ in range(threads * burst)]
                _apply(self.values[name])
                manager = self.managers[name]
                placed = []
                retried = getattr(manager, 'claim_retries',
                                  {}).get('retried', 0)

                def one(item):
                    instance, spec = item
                    try:
                        manager.select_destinations(
                            self.ctxt, spec_obj=spec,
                            instance_uuids=[instance], return_objects=True,
                            return_alternates=True)
                    except Exception:  # NoValidHost: not placed
                        return
                    with lock:
                        placed.append(instance)

                with claims_mod.counted(claims[name]), \
                        concurrent.futures.ThreadPoolExecutor(threads) as pool:
                    start = time.perf_counter()
                    list(pool.map(one, specs))
                    elapsed = time.perf_counter() - start
                rates[name].append(len(specs) / elapsed)
                retries[name] += getattr(manager, 'claim_retries',
                                         {}).get('retried', 0) - retried
                self.unclaim([i for i, _s in specs])
        return rates, {name: (c.tried, c.refused, retries[name])
                       for name, c in claims.items()}


def _start_cloud():
    from nova_gpu.tests.harness import cloud
    case = cloud.start_cloud(())
    # nova-scheduler's default: INFO (Nova's test fixture formats every
    # DEBUG line, which a production scheduler does not).
    logging.getLogger().setLevel(logging.INFO)
    # Placement syncs its standard resource classes on its first request.
    case.placement.get('/resource_classes')
    return case


def run(quick=False, argv=None, out=sys.stdout):
    args = parse_args(argv if argv is not None
                      else (['--quick'] if quick else []))

    def log(line):
        out.write(line + '\n')
        out.flush()

    rows = []
    verdicts = []
    for path, n in plan(args):
        log('%s, %d hosts:' % (path, n))
        case = _start_cloud()
        try:
            bench = Bench(case, path, n, log, args.configs)
            # Untimed: each scheduler's first request (lazy imports, the
            # report client's first call, the view's first rebuild).
            for name in args.configs:
                instance, spec = bench.spec(name)
                bench.select(name, instance, spec)
                bench.unclaim([instance])
            times, refused = bench.latency(args.requests)
            rates, claims = bench.throughput(args.threads, args.burst,
                                             args.bursts)
        finally:
            case.doCleanups()
        stock_med = statistics.median(times['stock'])
        stock_rate = statistics.median(rates['stock'])
        for name in args.configs:
            med = statistics.median(times[name])
            p90 = _percentile(times[name], 0.9)
            rate = statistics.median(rates[name])
            tried, lost, again = claims[name]
            rows.append((path, n, name, len(times[name]), refused[name],
                         med * 1e3, p90 * 1e3, med / stock_med,
                         rate, rate / stock_rate,
                         '%d / %d / %d' % (lost, tried, again)))
            if name != 'stock':
                verdicts.append((path, n, name, med / stock_med,
                                 rate / stock_rate))
    header = ('path', 'hosts', 'scheduler', 'requests', 'NoValidHost',
              'median ms', 'p90 ms', 'x stock', 'req/s (%d threads)'
              % args.threads, 'x stock ', 'claims lost / tried / again')
    out.write(tables.text(header, rows, float_format='%.2f') + '\n')
    ok = True
    for path, n, name, lat, thr in verdicts:
        good = lat <= TARGET_LATENCY and thr >= TARGET_THROUGHPUT
        ok = ok and good
        out.write('  %s %d hosts %-13s: latency %+.1f %% (target <= +5 %%), '
                  'throughput %.0f %% of stock (target >= 95 %%): %s\n' % (
                      path, n, name, (lat - 1) * 100, thr * 100,
                      'meets' if good else 'MISSES'))
    return ok


def main(argv=None):
    run(argv=sys.argv[1:] if argv is None else argv)
    return 0


if __name__ == '__main__':
    sys.exit(main())
