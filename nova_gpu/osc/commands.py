"""``openstack gpu host list|show``, ``gpu capacity``, ``gpu server show``.

Each is an osc-lib command (cliff ``Lister`` / ``ShowOne``), so ``-f
json|yaml|csv|value|table`` and ``-c COLUMN`` work as for every
OpenStackClient command; structured fields come out as JSON/YAML lists
and objects, not strings.
"""

import logging

from osc_lib.cli import format_columns
from osc_lib.command import command
from osc_lib import exceptions

from nova_gpu import cloud_api

LOG = logging.getLogger(__name__)

HOST_COLUMNS = (
    ('Host', 'host'), ('GPUs', 'gpus'), ('Models', 'models'),
    ('Free GPUs', 'free_gpus'), ('Fragmentation', 'fragmentation_ratio'),
    ('Stranded GPUs', 'stranded_gpus'),
    ('Report Age (s)', 'report_age_seconds'), ('Stale', 'stale'))

# Flavor extra specs that name a device directly (nova_gpu.scheduler.gpu_spec
# documents them all; gpu:memory-style flavors are resolved by the
# scheduler, which the CLI does not run).
PROFILE_KEY, MIG_KEY, KIND_KEY = 'gpu:profile', 'gpu:mig', 'gpu:kind'
MODEL_KEY, COUNT_KEY = 'gpu:model', 'gpu:count'


def _host_row(host):
    values = dict(host, models=format_columns.DictColumn(host['models']))
    return tuple(values[key] for _title, key in HOST_COLUMNS)


class ListHosts(command.Lister):
    """List the GPU hosts the agents report, with free capacity and
    fragmentation.
    """

    auth_required = False  # the exporter's API only

    def take_action(self, parsed_args):
        hosts = self.app.client_manager.gpu.hosts()
        return ([t for t, _k in HOST_COLUMNS],
                [_host_row(h) for h in hosts])


class ShowHost(command.ShowOne):
    """Show one GPU host: its GPUs, their devices and what still fits."""

    auth_required = False  # the exporter's API only

    def get_parser(self, prog_name):
        parser = super().get_parser(prog_name)
        parser.add_argument('host', metavar='<host>',
                            help='Compute host name, as nova-compute '
                                 'reports it')
        return parser

    def take_action(self, parsed_args):
        host = self.app.client_manager.gpu.host(parsed_args.host)
        titles = [t for t, _k in HOST_COLUMNS]
        values = list(_host_row(host))
        titles += ['Node', 'Generation', 'GPU Devices', 'Free Devices',
                   'Unreadable GPUs', 'Quarantined GPUs']
        values += [host['nodename'], host['generation'],
                   format_columns.ListDictColumn(host['gpus']),
                   format_columns.ListDictColumn(
                       [d for d in host['free_devices'] if d['free']]),
                   # Left out of the report: NVML cannot read them (an
                   # exporter of an earlier release does not say).
                   format_columns.ListDictColumn(
                       host.get('unreadable_gpus') or []),
                   # Quarantined for a fault (core.health): why, since when.
                   format_columns.ListDictColumn(
                       host.get('quarantined_gpus') or [])]
        return titles, values


def servers_of(row, count):
    """Servers asking ``count`` devices of a capacity row that fit now."""
    servers = row.get('servers')
    if not servers:
        # An exporter of an earlier release: an upper bound.
        return row['free'] // count
    return servers[count - 1] if 0 < count <= len(servers) else 0


def flavor_device(extra_specs):
    """(kind, profile, models, count) a flavor's ``gpu:`` specs name."""
    specs = extra_specs or {}
    count = specs.get(COUNT_KEY, '1')
    try:
        count = int(count)
    except ValueError:
        raise exceptions.CommandError('%s=%r is not a number'
                                      % (COUNT_KEY, count))
    models = {m.strip() for m in specs.get(MODEL_KEY, '').split(',')
              if m.strip()} or None
    if PROFILE_KEY in specs:
        return 'vgpu', specs[PROFILE_KEY], models, count
    if MIG_KEY in specs:
        return 'mig', specs[MIG_KEY], models, count
    if specs.get(KIND_KEY) == 'whole':
        return 'whole', 'whole', models, count
    raise exceptions.CommandError(
        'the flavor names no GPU device with %s, %s or %s=whole (a '
        'gpu:memory flavor is resolved by the scheduler): use --profile'
        % (PROFILE_KEY, MIG_KEY, KIND_KEY))


class Capacity(command.Lister):
    """How many more devices of each profile fit in the cloud now."""

    # Only --flavor asks Nova: authentication is set up then (_extra_specs)
    auth_required = False

    def get_parser(self, prog_name):
        parser = super().get_parser(prog_name)
        parser.add_argument('--model', metavar='<model>', action='append',
                            help='Only this GPU model (repeatable)')
        parser.add_argument('--profile', metavar='<profile>',
                            help='Only this vGPU type, MIG profile or '
                                 '"whole"')
        parser.add_argument('--flavor', metavar='<flavor>',
                            help='Only the device this flavor asks for '
                                 '(its gpu:profile, gpu:mig or '
                                 'gpu:kind=whole, gpu:model and gpu:count)')
        parser.add_argument('--all', action='store_true',
                            help='Also list profiles with nothing free')
        return parser

    def take_action(self, parsed_args):
        rows = self.app.client_manager.gpu.capacity()
        models = set(parsed_args.model or ()) or None
        profile, kind, count = parsed_args.profile, None, 1
        if parsed_args.flavor:
            kind, profile, flavor_models, count = flavor_device(
                self._extra_specs(parsed_args.flavor))
            if flavor_models:
                models = (models or flavor_models) & flavor_models
        selected = [r for r in rows
                    if (models is None or r['model'] in models)
                    and (profile is None or r['profile'] == profile)
                    and (kind is None or r['kind'] == kind)
                    and (parsed_args.all or parsed_args.flavor
                         or parsed_args.profile or r['free'])]
        if (parsed_args.flavor or parsed_args.profile) and not selected:
            raise exceptions.CommandError(
                'no GPU in the cloud offers %s%s' % (profile, (
                    ' on %s' % ', '.join(sorted(models)) if models else '')))
        columns = ['Model', 'Kind', 'Profile', 'Free', 'Hosts']
        values = [[r['model'], r['kind'], r['profile'], r['free'],
                   r['hosts']] for r in selected]
        if parsed_args.flavor:
            # Servers of the flavor that fit now: its devices each on its
            # own GPU, host by host (the exporter counts them).
            columns.append('Servers')
            for v, r in zip(values, selected):
                v.append(servers_of(r, count))
        return columns, [tuple(v) for v in values]

    def _extra_specs(self, name):
        manager = self.app.client_manager
        if not getattr(manager, '_auth_required', True):
            # OpenStackClient skipped authentication for this command;
            # Nova needs it
            manager._auth_required = True
            manager.setup_auth()
        specs, _vcpus, _ram = cloud_api.Nova(
            manager.sdk_connection.compute).flavor(name)
        return specs


class ShowServer(command.ShowOne):
    """Show which physical GPU, VF and slice a server's devices are on.

    Reads the server's host from Nova, its GPU allocations from Placement
    and what each allocated provider stands for from nova-gpu-exporter.
    """

    GPU_CLASSES = ('VGPU', 'PGPU')
    POOL = 'pci_pool'

    def get_parser(self, prog_name):
        parser = super().get_parser(prog_name)
        parser.add_argument('server', metavar='<server>',
                            help='Server (name or ID)')
        return parser

    def take_action(self, parsed_args):
        conn = self.app.client_manager.sdk_connection
        self._hosts = {}  # host name -> the exporter's host detail
        server = cloud_api.Nova(conn.compute).find(parsed_args.server)
        placement = cloud_api.Placement.of(conn)
        try:
            allocations = placement.allocations(server.id)
            providers = {p['name']: p for p in
                         self.app.client_manager.gpu.providers()}
            devices = self._devices(server.id, placement, allocations,
                                    providers)
        except cloud_api.ApiError as e:
            raise exceptions.CommandError(str(e)) from e
        flavor = server.flavor or {}
        return (['ID', 'Name', 'Host', 'Flavor', 'GPU Devices', 'Idle'],
                [server.id, server.name, server.host,
                 flavor.get('original_name') or flavor.get('name') or
                 flavor.get('id'),
                 format_columns.ListDictColumn(devices),
                 format_columns.ListDictColumn(self._idle(server.id))])

    def _devices(self, server_id, placement, allocations, providers):
        """One entry per GPU resource class of each allocated provider."""
        devices = []
        for rp_uuid, alloc in sorted(allocations.items()):
            resources = alloc.get('resources', {})
            if not any(rc in self.GPU_CLASSES or rc.startswith('CUSTOM_')
                       for rc in resources):
                continue
            name = placement.name_of(rp_uuid)
            known = providers.get(name)
            for rc, amount in sorted(resources.items()):
                if known is None and not rc.startswith(self.GPU_CLASSES):
                    continue  # a CUSTOM_ class of something else
                entry = {'provider': name, 'resource_class': rc,
                         'amount': amount}
                if known:
                    entry.update(self._device(known, server_id))
                devices.append(entry)
        return devices

    def _idle(self, server_id):
        """The server's idle devices (``core.idle``: since when, peak,
        the right-sizing suggestion), as ``openstack gpu idle`` lists them.
        """
        try:
            rows = self.app.client_manager.gpu.idle()
        except Exception as e:  # the devices still show without it
            LOG.warning('cannot read idle devices from nova-gpu-exporter: '
                        '%s', e)
            return []
        keep = ('device', 'seconds', 'since', 'peak_compute',
                'peak_memory_mib', 'suggestion')
        return [{k: row.get(k) for k in keep} for row in rows
                if row.get('server_id') == server_id]

    def _device(self, provider, server_id):
        """What the guest has of ``provider``: plain values, no lists.

        A vendor-VFIO pool stands for several VFs: the guest's own is the
        one its host's agent saw its domain hold (``instance`` in the
        report's devices); None while the agent has not reported it.
        """
        device = {k: provider[k] for k in (
            'host', 'gpu', 'gpu_address', 'model', 'kind', 'address',
            'vgpu_type')}
        if provider.get('mig'):
            profile, start = provider['mig'][:2]
            device['mig'] = '%s@%s' % (profile, start)
        if provider['kind'] == self.POOL:
            device['vf'] = self._held_vf(provider, server_id)
        return device

    def _held_vf(self, provider, server_id):
        host = provider['host']
        if host not in self._hosts:
            try:
                self._hosts[host] = self.app.client_manager.gpu.host(host)
            except Exception as e:  # the devices still show without it
                LOG.warning('cannot read host %s from nova-gpu-exporter: '
                            '%s', host, e)
                self._hosts[host] = {}
        vfs = set(provider.get('vfs') or ())
        for gpu in self._hosts[host].get('gpus', ()):
            for dev in gpu.get('devices', ()):
                if dev.get('instance') == server_id and dev.get('vf') in vfs:
                    return dev['vf']
        return None
