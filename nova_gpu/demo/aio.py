"""nova-gpu-demo: an all-in-one GPU cloud, servers booted, placements shown.

Starts real Nova (API, conductor, scheduler, nova-compute with the libvirt
driver) and real Placement in this process, on simulated GPU hypervisors
(``nova_gpu.tests.harness.cloud``: only libvirt is fake), creates GPU flavors
and
boots the scenario's servers through the Nova API with openstacksdk, one at
a time. It then prints where each server landed (the GPU path, GPU, VF and
MIG slice, read from the domain XML Nova wrote and the host's devices),
the libvirt hostdev XML Nova's driver wrote for one server of each path,
and the cloud's GPU allocation and expected fragmentation. The same
sequence is run again on a second cloud with the other policy (stock
Nova's filters and weighers, or nova-gpu's) and both outcomes are
compared.

Run it with ``tools/run-demo.sh`` (which runs ``tox -e demo``).
"""

import argparse
import copy
import dataclasses
import logging
import os
import sys
import time
import traceback
import warnings

from nova_gpu.demo import plot
from nova_gpu.demo import render


class _Scenario:
    """nova_gpu.demo.scenario, imported on first use: it builds on Nova's
    test harness (nova.tests, the ``demo`` extra), which a plain install
    of nova-gpu neither needs nor imports.
    """

    def __getattr__(self, name):
        from nova_gpu.demo import scenario as module
        return getattr(module, name)


scenario = _Scenario()

# Nova's own filter that honours aggregate_instance_extra_specs: the stock
# way to keep a flavor on hosts with its GPU model, used by both clouds.
AGGREGATE_FILTER = 'AggregateInstanceExtraSpecsFilter'
BOOT_TIMEOUT = 60.0
POLL = 0.1
MAX_CANDIDATES = 200


@dataclasses.dataclass
class ServerResult:
    name: str
    flavor: str
    asks: str
    result: str
    host: str = None
    gpus: tuple = ()  # PCI addresses of the GPUs (PFs)
    devices: tuple = ()  # vGPU type per device (and its MIG slice)
    path: str = None  # how the devices reach the guest
    functions: tuple = ()  # VF (or mdev parent, or PF) per device
    numa: tuple = ()  # NUMA node(s) of the GPUs
    nvlinked: bool = None
    topology: str = 'any'  # what the flavor asked
    uuid: str = None
    # Not ACTIVE: (host, nova-gpu's reason) for each host its GpuFilter
    # refused it on, else ((None, Nova's fault message),)
    why: tuple = ()

    @property
    def topology_kept(self):
        """Did the GPUs get the connection the flavor asked for?"""
        if self.topology == 'numa':
            return len(self.numa) == 1
        if self.topology == 'nvlink':
            return bool(self.nvlinked)
        return True


@dataclasses.dataclass
class HostUse:
    name: str
    model: str
    gpus: int
    used_gpus: float  # in GPUs (vGPU capacity used / per-GPU capacity)
    free_gpus: float
    idle_gpus: int
    fragmentation: float  # expected fragmentation, in GPUs
    layout: str


@dataclasses.dataclass
class DemoRun:
    policy: str
    servers: list
    hosts: list
    # (server, path, domain XML, lines saying where each device lives),
    # one server of each path
    hostdevs: tuple = ()
    seconds: float = 0.0
    # {GPU quota class: usage} of the demo project in Placement: what
    # Nova's unified limits would count (doc/source/quotas.rst)
    quota_usage: dict = dataclasses.field(default_factory=dict)

    @property
    def booted(self):
        return [s for s in self.servers if s.result == 'ACTIVE']

    def metrics(self):
        multi = [s for s in self.booted if len(s.gpus) > 1]
        return [
            ('servers requested', len(self.servers)),
            ('servers ACTIVE', len(self.booted)),
            ('refused (NoValidHost)',
             sum(1 for s in self.servers if s.result != 'ACTIVE')),
            ('multi-GPU servers ACTIVE', len(multi)),
            ('  of them with the topology asked',
             sum(1 for s in multi if s.topology_kept)),
            ('GPUs left idle', sum(h.idle_gpus for h in self.hosts)),
            ('expected fragmentation (GPUs)',
             round(sum(h.fragmentation for h in self.hosts), 2)),
        ]


def nova_conf(stock):
    """nova.conf of either cloud: the harness's, plus the aggregate filter."""
    from nova_gpu.tests.harness import cloud as cloud_mod
    conf = copy.deepcopy(cloud_mod.STOCK_CONF if stock
                         else cloud_mod.HARNESS_CONF)
    enabled = conf.setdefault('filter_scheduler', {}).setdefault(
        'enabled_filters', list(cloud_mod.scheduler_value(
            'filter_scheduler', 'enabled_filters')))
    # Before GpuFilter, which must see the candidates last.
    at = enabled.index('GpuFilter') if 'GpuFilter' in enabled else len(
        enabled)
    enabled.insert(at, AGGREGATE_FILTER)
    conf['quota'] = {'instances': -1, 'cores': -1, 'ram': -1}
    if not stock:
        # The flavors on offer are the typical requests: fragmentation is
        # measured against them from the first boot on, not only once each
        # has been seen.
        conf.setdefault('gpu_scheduler', {})['typical_requests'] = [
            ';'.join('%s=%s' % kv for kv in sorted(f.extra_specs.items()))
            for f in scenario.FLAVORS]
    return conf


def limit_candidates(cloud):
    """Placement settings an operator sets for multi-GPU flavors.

    Eight isolated request groups on an 8-GPU host have 8! = 40320
    allocation candidates; Placement would enumerate them all for every
    host. Any of them names the same GPUs, so a few hundred are plenty.
    """
    cloud.placement_fixture.conf_fixture.config(
        group='placement', max_allocation_candidates=MAX_CANDIDATES,
        allocation_candidates_generation_strategy='breadth-first')


def connect(cloud):
    """openstacksdk on the in-process Nova API, as an admin.

    The harness's API runs with Nova's test auth stub (no Keystone): the
    user, project and roles travel as request headers.
    """
    from keystoneauth1 import noauth
    from keystoneauth1 import session
    import openstack
    sess = session.Session(auth=noauth.NoAuth(), additional_headers={
        'X-Auth-User': 'admin', 'X-User-Id': 'admin',
        'X-Auth-Project-Id': cloud.api.project_id,
        'X-Roles': 'admin,member,reader'})
    return openstack.connection.Connection(
        session=sess, compute_endpoint_override=cloud.api.base_url,
        compute_api_version='2.95')


def run(stock=False, progress=None, agents=False):
    """Boot the scenario on a fresh cloud; return its DemoRun.

    ``agents``: GPU reports come from a real nova-gpu-agent process per
    host over RabbitMQ (the scheduler's report listener on), not from the
    harness, and the real nova-gpu-qemu-hook types the VFs of the
    mixed-size host on the agents' fake sysfs trees; stock Nova reads no
    reports either way. Without agents ``vf_typing.OnDemandVfTypes``
    plays the hook.
    """
    from nova_gpu.tests.harness import cloud as cloud_mod
    start = time.monotonic()
    cloud = cloud_mod.start_cloud(
        scenario.HOSTS, nova_conf=nova_conf(stock),
        mixins=cloud_mixins(agents and not stock),
        scheduler_files=() if stock else None, gpu_quota=not stock)
    try:
        limit_candidates(cloud)
        conn = connect(cloud)
        _create_aggregates(conn)
        flavor_ids = _create_flavors(conn, sets=not stock, quota=not stock)
        servers = []
        for name, flavor_name in scenario.requests():
            result = _boot(cloud, conn, name, flavor_name,
                           flavor_ids[flavor_name])
            servers.append(result)
            if progress:
                progress(result)
        hostdevs = _hostdevs(cloud, servers)
        hosts = _host_use(cloud)
        quota_usage = _quota_usage(cloud)
    finally:
        # Nova logs every thread pool it stops at INFO; not worth showing.
        logging.disable(logging.INFO)
        try:
            cloud.doCleanups()
        finally:
            logging.disable(logging.NOTSET)
    return DemoRun('stock Nova' if stock else 'nova-gpu', servers, hosts,
                   hostdevs, time.monotonic() - start, quota_usage)


def cloud_mixins(agents=False):
    """``start_cloud``'s mixins: real agents and the real qemu hook, or
    the demo's stand-in for the hook (``vf_typing``).
    """
    if agents:
        from nova_gpu.tests.harness import agent_process
        from nova_gpu.tests.harness import qemu_hook
        return (qemu_hook.QemuHookMixin, agent_process.AgentReportsMixin)
    from nova_gpu.demo import vf_typing
    return (vf_typing.OnDemandVfTypes,)


def _vf_type(cloud, hostname, vf):
    """The vGPU type VF ``vf`` of a mixed-size host was given at start:
    the real hook's, in the agent's sysfs tree, or the stand-in's.
    """
    if hasattr(cloud, 'vf_types_of'):
        for types in cloud.vf_types_of(hostname).values():
            if vf in types:
                return types[vf]
        return None
    return cloud.vf_type(hostname, vf)


def guest_devices(cloud, server_id):
    """``cloud.guest_devices``, with the type each VF of a mixed-size
    host holds (the harness names the host's type).
    """
    specs = {h.name: h for h in scenario.HOSTS}
    devices = []
    for dev in cloud.guest_devices({'id': server_id}):
        if specs[dev.host].mixed_size and dev.function != dev.gpu_address:
            dev = dataclasses.replace(dev, vgpu_type=_vf_type(
                cloud, dev.host, dev.function))
        devices.append(dev)
    return devices


def _why_refused(cloud, server_id):
    """(host, reason) for each host nova-gpu's GpuFilter refused the
    server on (its last scheduling pass; the harness records them).
    """
    decisions = getattr(cloud, '_decisions', {}).get(server_id, {})
    return tuple((host, d.why) for host, d in sorted(decisions.items())
                 if d.why)


def _create_aggregates(conn):
    for model in sorted({h.model for h in scenario.HOSTS}):
        agg = conn.compute.create_aggregate(name='gpu-%s' % model.lower())
        # AggregateInstanceExtraSpecsFilter also matches unscoped extra
        # specs against the metadata, and multi-GPU flavors carry
        # group_policy=isolate: the aggregate must list it too.
        conn.compute.set_aggregate_metadata(agg, {
            scenario.AGGREGATE_KEY: model, 'group_policy': 'isolate'})
        for host in scenario.HOSTS:
            if host.model == model:
                conn.compute.add_host_to_aggregate(agg, host.name)


def _create_flavors(conn, sets=True, quota=False):
    from nova_gpu.core import quota as quota_mod
    from nova_gpu.scheduler import gpu_spec as flavor_mod
    ids = {}
    for f in scenario.FLAVORS:
        specs = dict(f.extra_specs)
        parsed = flavor_mod.parse(specs, vcpus=f.vcpus, memory_mb=f.ram_mb)
        # Stock Nova has no agent keeping the set traits: plain groups.
        specs.update(flavor_mod.placement_extra_specs(parsed, sets=sets))
        if quota:
            # What ``openstack gpu flavor keys --quota`` adds: the classes
            # Nova's unified limits count per model and GPU memory.
            specs.update(quota_mod.extra_specs(
                parsed, flavor_mod.default_catalog()))
        specs['aggregate_instance_extra_specs:%s'
              % scenario.AGGREGATE_KEY] = scenario.model_of(f)
        created = conn.compute.create_flavor(name=f.name, ram=f.ram_mb,
                                             vcpus=f.vcpus, disk=1)
        conn.compute.create_flavor_extra_specs(created, specs)
        ids[f.name] = created.id
    return ids


def _boot(cloud, conn, name, flavor_name, flavor_id):
    from nova_gpu.tests.harness import cloud as cloud_mod
    flavor = scenario.flavors_by_name()[flavor_name]
    server = conn.compute.create_server(
        name=name, flavor_id=flavor_id, image_id=cloud_mod.IMAGE,
        networks='none')
    deadline = time.monotonic() + BOOT_TIMEOUT
    while True:
        server = conn.compute.get_server(server.id)
        if server.status in ('ACTIVE', 'ERROR'):
            break
        if time.monotonic() > deadline:
            raise RuntimeError('server %s still %s after %.0f s'
                               % (name, server.status, BOOT_TIMEOUT))
        time.sleep(POLL)
    # nova-gpu-agent reports after every device change.
    cloud.sync_gpu_reports()
    result = ServerResult(name, flavor_name, flavor.asks, server.status,
                          topology=flavor.extra_specs.get('gpu:topology',
                                                          'any'),
                          uuid=server.id)
    if server.status != 'ACTIVE':
        message = (server.fault or {}).get('message', '')
        # The reasons go to a table of their own: the placements table
        # keeps its columns narrow.
        result.result = ('NoValidHost' if 'No valid host' in message
                         else 'ERROR')
        result.why = _why_refused(cloud, server.id) or (
            (None, message[:200]),)
        return result
    specs = {h.name: h for h in scenario.HOSTS}
    result.host = server.compute_host
    spec = specs[result.host]
    # What the guest got: the domain XML Nova wrote, and the host's
    # devices behind it.
    devices = guest_devices(cloud, server.id)
    indices = [d.gpu for d in devices]
    result.gpus = tuple(d.gpu_address for d in devices)
    result.devices = tuple(_device(d) for d in devices)
    result.functions = tuple(d.function for d in devices)
    result.path = ', '.join(sorted({d.path for d in devices}))
    result.numa = tuple(sorted({spec.numa_of(i) for i in indices}))
    links = {frozenset(p) for p in spec.nvlink}
    result.nvlinked = all(frozenset((a, b)) in links
                          for a in indices for b in indices if a < b)
    return result


def _quota_usage(cloud):
    """{GPU quota class: usage} of the demo project in Placement."""
    from nova_gpu.core import quota as quota_mod
    usages = cloud.placement.get(
        '/usages?project_id=%s' % cloud.api.project_id,
        version='1.9').body['usages']
    return {rc: n for rc, n in sorted(usages.items())
            if rc.startswith(quota_mod.PREFIX) and n}


def _device(dev):
    """A device in words; a MIG-backed vGPU with the GPU instance it sits
    on and that instance's start slice (``A100-2-10C 2g.10gb@4``).
    """
    if dev.vgpu_type is None:
        return 'whole GPU'
    if dev.mig is None:
        return dev.vgpu_type
    return '%s %s@%d' % (dev.vgpu_type, dev.mig[0], dev.mig[1])


def _hostdevs(cloud, servers):
    """Domain XML and devices of the first server of each path."""
    shown, seen = [], set()
    for server in servers:
        if server.result != 'ACTIVE' or server.path in seen:
            continue
        seen.add(server.path)
        xml = cloud.domain_xml({'id': server.uuid})
        lines = []
        for dev in guest_devices(cloud, server.uuid):
            what = ('mdev %s on %s %s' % (dev.mdev, 'VF' if dev.function
                                          != dev.gpu_address else 'PF',
                                          dev.function)
                    if dev.mdev else 'PCI function %s' % dev.function)
            # The path is in the heading above these lines.
            lines.append('  %s of GPU %d (%s), %s' % (
                what, dev.gpu, dev.gpu_address, _device(dev)))
        shown.append((server.name, server.path, xml, tuple(lines)))
    return tuple(shown)


def _demand():
    """The scenario's requests as the fragmentation measure's demand."""
    from nova_gpu.core import fragmentation
    from nova_gpu.scheduler import gpu_spec as flavor_mod
    flavors = scenario.flavors_by_name()
    reqs = []
    for _name, flavor_name in scenario.requests():
        f = flavors[flavor_name]
        reqs.append(flavor_mod.parse(f.extra_specs).alternatives[0])
    return fragmentation.Demand.from_requests(reqs)


def _host_use(cloud):
    from nova_gpu.core import fragmentation
    from nova_gpu.core import host as host_mod
    from nova_gpu.core import mixed_size
    from nova_gpu.scheduler import gpu_spec as flavor_mod
    catalog = flavor_mod.default_catalog()
    demand = _demand()
    result = []
    for spec in scenario.HOSTS:
        host = _reported_host(cloud, spec.name, catalog)
        used = sum(g.used_milli for g in host.gpus) / host_mod.MILLI
        per_gpu = ' '.join(str(sum(g.vgpus.values()) + len(g.mig_instances)
                               + (0 if g.is_free or spec.vgpu_type else 1))
                           for g in host.gpus)
        slices = ''
        if spec.mig:
            # Which start slices each GPU's MIG instances took.
            slices = '; MIG slices %s' % ' | '.join(
                ','.join(str(s) for s in sorted(g.mig_instances)) or '-'
                for g in host.gpus)
        if spec.mixed_size:
            # vGPUs of several sizes: what each GPU holds, in slots.
            of = ' | '.join(
                '%s: %d of %d slots' % (
                    ', '.join('%d %s' % (n, t) for t, n in
                              g.vgpu_counts()) or 'none',
                    mixed_size.used_slots(g.model, g.vgpu_counts()),
                    mixed_size.grid(g.model))
                for g in host.gpus)
        else:
            of = 'of %d each%s' % (
                host.gpus[0].model.vgpu_profile(
                    spec.vgpu_type).max_instances if spec.vgpu_type else 1,
                slices)
        result.append(HostUse(
            spec.name, '%s %s' % (spec.model, 'mixed-size' if
                                  spec.mixed_size else
                                  spec.vgpu_type or 'whole'),
            len(host.gpus), round(used, 2), round(len(host.gpus) - used, 2),
            sum(1 for g in host.gpus if g.is_free),
            round(fragmentation.host_fragmentation(host, demand)
                  / host_mod.MILLI, 2),
            '%s (%s)' % (per_gpu, of)))
    return result


def _reported_host(cloud, hostname, catalog):
    """The host as its last GPU report shows it: the agent's, as the
    scheduler holds it, where a real agent reports the host, else the
    harness's.
    """
    from nova_gpu.core import report as report_mod
    views = (cloud.report_views() if hasattr(cloud, 'report_views')
             and cloud.agent_runs_on(cloud._host_specs[hostname]) else ())
    for view in views:
        entry = view.get(hostname)
        if entry is not None:
            return entry.host
    return report_mod.host_from_dict(cloud.gpu_report(hostname), catalog)


# -- printing ---------------------------------------------------------------

def _vgpu_type(spec, catalog):
    if spec.mixed_size:
        return 'mixed sizes, typed at start'
    if not spec.mig:
        return spec.vgpu_type or 'whole GPUs'
    return '%s on MIG %s' % (spec.vgpu_type, catalog.model(
        spec.model).vgpu_profile(spec.vgpu_type).mig_profile)


def _nvlink_words(spec):
    if spec.gpus > 1 and len(spec.nvlink) == spec.gpus * (spec.gpus - 1) // 2:
        return 'all-to-all'
    return ' '.join('%d-%d' % p for p in spec.nvlink) or None


def describe_cloud():
    from nova_gpu.core import catalog as catalog_mod
    catalog = catalog_mod.load_catalog()
    rows = [(h.name, h.model, h.gpus, _PATH_WORDS[h.path],
             _vgpu_type(h, catalog), _nvlink_words(h))
            for h in scenario.HOSTS]
    return render.table(('host', 'GPU model', 'GPUs', 'how Nova sees it',
                         'vGPU type', 'NVLink'), rows,
                        'Simulated GPU hypervisors')


# How each host path shows in Nova 34 (doc/source/generations.rst).
_PATH_WORDS = {
    'pf_mdev': 'mdev on the PF',
    'vf_mdev': 'SR-IOV, mdev on VFs',
    'vfio': 'vendor-VFIO VFs, PCI pool',
    'passthrough': 'whole GPUs, PCI',
}


def print_outcome(outcome, out):
    out(render.flavors(outcome.servers, 'Flavors'))
    out('')
    out(render.placements(outcome.servers, 'Placements with %s (%.0f s)'
                          % (outcome.policy, outcome.seconds)))
    out('')
    for name, path, xml, lines in outcome.hostdevs:
        out('libvirt <hostdev> Nova wrote for %s (%s)' % (name, path))
        out(render.hostdevs(xml))
        for line in lines:
            out(line)
        out('')
    refused = [s for s in outcome.servers if s.why]
    if refused:
        out(render.refusals(refused, 'Servers not ACTIVE with %s, and why:'
                            % outcome.policy))
        out('')
    out(render.allocation(outcome.hosts, 'GPU allocation with %s'
                          % outcome.policy))
    out('')
    if outcome.quota_usage:
        out(render.table(
            ('resource class', 'demo project uses'),
            sorted(outcome.quota_usage.items()),
            'GPU quota classes in Placement (what Nova\'s unified limits '
            'cap per project; limits: openstack gpu quota limits)'))
        out('')


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog='nova-gpu-demo', description=__doc__.split('\n\n')[0])
    parser.add_argument('--stock', action='store_true',
                        help='show stock Nova (its default filters and '
                             'weighers, no nova-gpu) in detail; nova-gpu is '
                             'then the comparison')
    parser.add_argument('--no-compare', action='store_true',
                        help='run one policy only')
    parser.add_argument('--agents', action='store_true',
                        help='run a real nova-gpu-agent per GPU host (on a '
                             'fake sysfs tree of its devices) reporting to '
                             'the scheduler over RabbitMQ (127.0.0.1:5672, '
                             'else a private broker); MIG hosts are still '
                             'reported by the harness')
    parser.add_argument('--plot', metavar='DIR', nargs='?', const='.',
                        help='also draw each cloud\'s GPUs (who uses which '
                             'VF, vGPU or MIG slice) in DIR (default: the '
                             'current directory) as '
                             'nova-gpu-demo-<policy>.png; needs matplotlib')
    args = parser.parse_args(argv)
    # Eventlet and Nova announce their deprecations on import; they are
    # not the demo's business.
    warnings.simplefilter('ignore', DeprecationWarning)
    rc = 1
    try:
        rc = _main(args)
    except Exception:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        # Nova's services leave non-daemon threads behind; do not wait for
        # them once the clouds are cleaned up.
        os._exit(rc)


def _main(args):
    def out(text=''):
        # The real stdout: Nova's test fixtures capture sys.stdout while a
        # cloud runs when OS_STDOUT_CAPTURE is set (tox sets it).
        print(text, file=sys.__stdout__, flush=True)

    def progress(result):
        out('  booted %-18s %-12s %s' % (result.name, result.result,
                                         result.host or ''))

    out(describe_cloud())
    out('')
    order = [args.stock] + ([] if args.no_compare else [not args.stock])
    outcomes = {}
    for stock in order:
        out('Booting %d servers with %s ...'
            % (len(scenario.requests()), 'stock Nova' if stock
               else 'nova-gpu'))
        outcomes[stock] = run(stock, progress, agents=args.agents)
        if stock == order[0]:
            out('')
            print_outcome(outcomes[stock], out)
        if args.plot is not None:
            out(plot.report(outcomes[stock], args.plot, scenario.HOSTS))
            out('')
    if len(outcomes) == 2:
        ours, stock = outcomes[False], outcomes[True]
        out(render.comparison(ours.metrics(), stock.metrics(),
                              'Same requests, nova-gpu against stock Nova'))
    return 0
