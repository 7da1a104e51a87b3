"""The cloud's GPU hosts and servers as the move planner sees them.

Hosts come from nova-gpu-exporter's read-only JSON API (each GPU's
devices, validated by the report parser); servers from Nova's server list
and their GPU allocations in Placement, each allocation turned into the
device it stands for through the exporter's providers. Only mdev-backed
vGPU guests are movable: Nova live-migrates a vGPU guest (since 29.0)
when the destination offers the same mdev type, and PCI devices
(whole-GPU passthrough, vendor-VFIO VFs, bare MIG instances) do not
live-migrate.

Nothing here talks to OpenStack: ``read_servers`` and ``read_cloud`` take
the cloud as a port from the adapter (``nova_gpu.cloud_api.Cloud``, or a
stand-in with the same three calls), so that ``openstack gpu defrag`` and
``nova-gpu-defrag`` read the cloud the same way:

* ``servers()``: every server of all projects, each with ``id``,
  ``host`` (its compute host), ``status`` and ``image_id`` (None when
  booted from a volume);
* ``allocations(server_id)``: its Placement allocations, {provider name:
  {resource class: amount}};
* ``image_property(image_id, key)``: a property of an image, None when
  it has none (an error counts as unknown).
"""

import dataclasses

from nova_gpu.core import drivers as drivers_mod
from nova_gpu.core import exceptions
from nova_gpu.core import host as host_mod
from nova_gpu.core import moves
from nova_gpu.core import report as report_mod

# Provider kinds whose devices Nova can live-migrate (mdevs).
MIGRATABLE_KINDS = (report_mod.PF_MDEV, report_mod.VF_MDEV)


def hosts_from_api(details, catalog):
    """Core ``Host`` objects from nova-gpu-exporter's ``/v1/hosts/<h>``.

    Each detail is validated by the report parser (``core.report.parse``),
    so a malformed answer is refused with the host and field named.
    Returns (hosts by name, drivers by name).
    """
    hosts, infos = {}, {}
    for d in details:
        data = {
            'version': report_mod.VERSION, 'host': d.get('host'),
            'nodename': d.get('nodename'),
            'generation': d.get('generation', 0),
            'cpu_milli': d.get('cpu_milli', 0),
            'memory_mib': d.get('memory_mib', 0),
            'numa_cells': d.get('numa_cells'),
            'nvidia': d.get('nvidia'),
            'gpus': [{
                'index': g.get('index'), 'address': g.get('address'),
                'model': g.get('model'), 'numa_node': g.get('numa_node'),
                'pcie_switch': g.get('pcie_switch'),
                'nvlink_peers': g.get('nvlink_peers'),
                'mig_enabled': g.get('mig_enabled', False),
                'vgpu_types': g.get('vgpu_types') or None,
                'providers': [], 'devices': g.get('devices')}
                for g in d.get('gpus') or ()]}
        parsed = report_mod.parse(data, catalog)
        hosts[parsed.host.name] = parsed.host
        if parsed.drivers is not None:
            infos[parsed.host.name] = parsed.drivers
    return hosts, infos


@dataclasses.dataclass(frozen=True)
class ServerRecord:
    """A server as Nova and Placement show it (the adapters fill it in).

    ``allocations``: provider name -> {resource class: amount}.
    """

    id: str
    host: str
    status: str
    allocations: dict
    driver_branch: str = None


def servers_from_records(records, providers, hosts):
    """``moves.Server`` objects of the GPU servers among ``records``.

    ``providers``: nova-gpu-exporter's ``/v1/providers`` entries (which
    GPU and device each provider stands for). Movable: ACTIVE servers
    whose every GPU device is an mdev (a VGPU allocation on a
    ``pf_mdev`` or ``vf_mdev`` provider). Returns (servers, problems):
    a server whose devices the host's report does not hold (a stale
    report) is left out, with a line saying so.
    """
    by_name = {p['name']: p for p in providers}
    hosts = _by_name(hosts)
    servers, problems = [], []
    try:
        for rec in records:
            slots, migratable, untyped = [], True, None
            for name, resources in sorted((rec.allocations or {}).items()):
                p = by_name.get(name)
                if p is None:
                    continue  # not a GPU provider (the compute node, ...)
                slot = slot_of(p['kind'], p['gpu'], p.get('vgpu_type'),
                               p.get('mig'))
                untyped = untyped or (name if slot is None else None)
                slots.extend([slot] * sum(resources.values()))
                migratable &= p['kind'] in MIGRATABLE_KINDS
            if not slots:
                continue
            if untyped:
                problems.append('server %s: provider %s has no vGPU type'
                                % (rec.id, untyped))
                continue
            host = hosts.get(rec.host)
            if host is None:
                problems.append('server %s: host %s has no GPU report'
                                % (rec.id, rec.host))
                continue
            placement = host_mod.Assignment(rec.host, tuple(slots))
            # Freed until every server is checked: two servers claiming
            # one device cannot both pass.
            try:
                host.free(placement)
            except exceptions.GpuError as e:
                problems.append('server %s: its GPU devices are not in the '
                                'report of %s (%s)' % (rec.id, rec.host, e))
                continue
            servers.append(moves.Server(
                rec.id, placement,
                movable=migratable and rec.status == 'ACTIVE',
                driver_branch=rec.driver_branch))
    finally:
        for server in reversed(servers):
            hosts[server.host].allocate(server.placement)
    return servers, problems


def slot_of(kind, gpu, vgpu_type=None, mig=None):
    """The core ``Slot`` one unit of a GPU provider stands for (its
    ``kind``, GPU index, vGPU type and MIG ``[profile, start]``), or None
    for a provider with no vGPU type, which no server holds a unit of.
    Shared by the planners that read providers (``openstack gpu defrag``
    from the exporter's ``/v1/providers``, the reclaimer from reports).
    """
    if kind == report_mod.PCI_DEVICE:
        return host_mod.Slot(gpu, host_mod.WHOLE)
    if mig:
        return host_mod.Slot(gpu, host_mod.MIG, (mig[0], mig[1], vgpu_type))
    if vgpu_type:
        return host_mod.Slot(gpu, host_mod.VGPU, vgpu_type)
    return None


def read_servers(cloud, hosts, providers, image_property=None):
    """``ServerRecord`` of every server on ``hosts`` (all projects).

    ``cloud``: the port of the module docstring. The guest's driver
    branch comes from the image property ``drivers.IMAGE_PROPERTY`` (read
    once per image). Returns (records, problems); a server whose image
    names a bad branch is kept but not movable, with a line saying why.
    """
    key = image_property or drivers_mod.IMAGE_PROPERTY
    gpu_providers = {p['name'] for p in providers}
    images, records, problems = {}, [], []
    for server in cloud.servers():
        host = server.host
        if host not in hosts:
            continue
        by_name = cloud.allocations(server.id)
        if not gpu_providers & set(by_name):
            continue
        status = server.status
        try:
            branch = _image_branch(cloud, server.image_id, key, images)
        except exceptions.InvalidRequest as e:
            problems.append('server %s: image property %s: %s (not moved)'
                            % (server.id, key, e))
            branch, status = None, 'UNMOVABLE'
        records.append(ServerRecord(server.id, host, status, by_name,
                                    branch))
    return records, problems


def _image_branch(cloud, image_id, key, cache):
    if not image_id:
        return None  # boot from volume: the volume's image is not read
    if image_id not in cache:
        try:
            value = cloud.image_property(image_id, key)
        except Exception:  # image gone or Glance unreachable: unknown
            value = None
        cache[image_id] = value
    value = cache[image_id]
    return None if value in (None, '') else drivers_mod.parse_branch(value)


def read_cloud(exporter, cloud, catalog):
    """Hosts, servers, driver infos and problems of the whole cloud.

    ``exporter``: anything with nova-gpu-exporter's reads (``hosts()``,
    ``host(name)``, ``providers()``), e.g.
    ``nova_gpu.exporter_client.ExporterClient``; ``cloud``: the port of
    the module docstring. Stale hosts (the exporter's ``stale``) are left
    out: their report may not show what runs there now.
    """
    problems = []
    names = []
    for summary in exporter.hosts():
        if summary.get('stale'):
            problems.append('host %s: report is stale, left out'
                            % summary['host'])
        else:
            names.append(summary['host'])
    hosts, infos = hosts_from_api([exporter.host(n) for n in names],
                                  catalog)
    providers = [p for p in exporter.providers() if p['host'] in hosts]
    records, found = read_servers(cloud, hosts, providers)
    problems += found
    servers, found = servers_from_records(records, providers, hosts)
    return hosts, servers, infos, problems + found


def _by_name(hosts):
    return hosts if isinstance(hosts, dict) else {h.name: h for h in hosts}
