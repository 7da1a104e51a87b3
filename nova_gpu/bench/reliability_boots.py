"""Concurrent boots to exhaustion, two nova-scheduler services racing.

A small in-process cloud (``nova_gpu.tests.harness.cloud``: real Nova API,
conductor, two nova-scheduler services each with its own GPU view,
Placement and nova-compute with the libvirt driver on fake GPU hosts) is
filled in waves. Each wave fires rounds of concurrent requests, parallel
single POSTs from threads and multi-create requests (``min_count`` =
``max_count``), with GPU flavors of several kinds (vGPU profiles of
different sizes, by-need memory, a model, two GPUs, stock
``resources:VGPU=1``), every kind in every round, until a whole round
fails and one boot of each kind, one at a time, fails too: the cloud is
exhausted. Then the wave is audited from Placement and from the fake
hosts' domain XML, and its servers are deleted.

The audit counts:

* Placement over-commits: usage above (total - reserved) x ratio on any
  provider and resource class.
* ACTIVE servers without their GPU allocation in Placement, or whose
  domain does not hold one mdev per allocated vGPU on the GPUs allocated.
* Double allocations by the scheduler: one GPU unit given to two servers
  (a GPU provider whose consumers hold more VGPU than it has, or an mdev
  in the domains of two servers of which one holds no VGPU on its GPU).
* Nova libvirt driver mdev reuse, shown apart: one mdev in two domains
  whose servers both hold their VGPU on its GPU in Placement. Nova's
  ``_allocate_mdevs`` takes any created mdev no domain holds yet; an mdev
  created for a boot whose domain is not defined yet looks free to a
  concurrent boot on the same GPU. The same workload with Nova's stock
  filters and flavors (no plugin) measures it there too.
* Every server in ERROR must carry a NoValidHost fault; anything else (a
  compute failure, an API error, a server stuck in BUILD) is a failure.
* vGPUs left free in Placement (on hosts with CPU, memory and disk for
  one more server) when the wave was declared exhausted: a NoValidHost
  without racing while capacity was free would show here.

What the harness adds, because it runs everything in one process on
eventlet: scheduling requests go to the two schedulers in turn (as
RabbitMQ does; Nova's fake transport gives all to the first), a boot
waits ``DEFINE_LATENCY`` between its mdevs and its domain (as a real host
does; see ``slow_guest_definition``), entering a cell is retried when
Nova's test fixture gives up under load, and a DELETE that fails in the
harness (the compute service runs in the API's thread) is counted and
tried once more.
"""

import collections
import dataclasses
import random
import re
import threading
import time
from xml.etree import ElementTree

FULL_ATTEMPTS = 1000
QUICK_ATTEMPTS = 80
STOCK_ATTEMPTS = {False: 60, True: 40}
# One round: every flavor kind once, plus this many random extra requests.
EXTRA_PER_ROUND = 4
MULTI_CREATE_SHARE = 0.5
MAX_MULTI = 8
ROUND_TIMEOUT = 120.0
POLL = 0.25
# Seconds from a boot's mdevs to its domain (see slow_guest_definition).
DEFINE_LATENCY = 0.05
# Seconds between GPU reports while servers build.
REPORT_INTERVAL = 1.0
NO_VALID_HOST = 'No valid host was found'
SEED = 20261201
# Every flavor of the run: 1 VCPU, 512 MiB of RAM, 1 GB of disk (and its
# vGPUs), so that only GPUs run out.
SMALLEST = {'VCPU': 1, 'MEMORY_MB': 512, 'DISK_GB': 1}


def hosts(small=False):
    """The cloud: 24 vGPUs of four vGPU types on four hosts (16 if
    ``small``: one GPU on each host but h100, which keeps its NVLink pair).
    """
    from nova_gpu.tests.harness import cloud
    one = 1 if small else 2
    return (
        cloud.GpuHost('a100a', 'A100-40GB', 'A100-10C', gpus=one,
                      numa=(0, 1)[:one]),                  # 4 per GPU
        cloud.GpuHost('a100b', 'A100-40GB', 'A100-20C', gpus=one,
                      numa=(0, 1)[:one]),                  # 2 per GPU
        cloud.GpuHost('h100', 'H100-80GB', 'H100-20C', gpus=2,
                      numa=(0, 1), nvlink=((0, 1),)),      # 4 per GPU
        cloud.GpuHost('l4', 'L4', 'L4-12C', gpus=one,
                      numa=(0, 1)[:one]),                  # 2 per GPU
    )


# name -> extra specs; the plugin's cloud.
PLUGIN_FLAVORS = (
    ('stock-vgpu', {'resources:VGPU': '1'}),
    ('a100-10c', {'gpu:profile': 'A100-10C'}),
    ('a100-20c', {'gpu:profile': 'A100-20C'}),
    ('mem-12gb', {'gpu:memory': '12GB'}),
    ('l4', {'gpu:model': 'L4'}),
    ('h100-x2', {'gpu:model': 'H100-80GB', 'gpu:count': '2'}),
)
# Nova without the plugin: what an operator writes by hand.
STOCK_FLAVORS = (
    ('stock-vgpu', {'resources:VGPU': '1'}),
    ('stock-vgpu-x2', {'resources1:VGPU': '1', 'resources2:VGPU': '1',
                       'group_policy': 'isolate'}),
)


@dataclasses.dataclass
class Audit:
    overcommits: list = dataclasses.field(default_factory=list)
    without_allocation: list = dataclasses.field(default_factory=list)
    device_mismatch: list = dataclasses.field(default_factory=list)
    double: list = dataclasses.field(default_factory=list)
    driver_reuse: list = dataclasses.field(default_factory=list)
    failed_holding: list = dataclasses.field(default_factory=list)
    free_at_exhaustion: int = 0
    free_detail: list = dataclasses.field(default_factory=list)

    def add(self, other):
        for field in dataclasses.fields(self):
            setattr(self, field.name, getattr(self, field.name)
                    + getattr(other, field.name))


@dataclasses.dataclass
class Tally:
    """Outcome of a run of waves."""

    attempts: int = 0
    active: int = 0
    no_valid_host: int = 0
    other: list = dataclasses.field(default_factory=list)
    multi_creates: int = 0
    single_posts: int = 0
    waves: int = 0
    audit: Audit = dataclasses.field(default_factory=Audit)
    elapsed: float = 0.0
    leaked: list = dataclasses.field(default_factory=list)
    per_scheduler: list = dataclasses.field(default_factory=list)
    delete_errors: list = dataclasses.field(default_factory=list)
    delete_retries: int = 0
    # Boots that failed in a racing round but were served one at a time.
    calm_served: int = 0


def vgpus_of(extra_specs):
    """VGPUs a flavor asks Placement for (all request groups)."""
    return sum(int(v) for k, v in extra_specs.items()
               if re.match(r'^resources[^:]*:VGPU$', k))


class Booter:
    """Fires rounds of concurrent boots on a running GpuCloudTestCase."""

    def __init__(self, cloud, flavors, rng):
        self.cloud = cloud
        self.rng = rng
        self.flavors = []  # (name, flavor id, VGPUs)
        for name, specs in flavors:
            fid = cloud.create_gpu_flavor(
                specs, memory_mb=SMALLEST['MEMORY_MB'],
                vcpu=SMALLEST['VCPU'], disk=SMALLEST['DISK_GB'],
                ephemeral=0, name=name)
            extra = cloud.admin_api.api_get(
                '/flavors/%s/os-extra_specs' % fid).body['extra_specs']
            self.flavors.append((name, fid, vgpus_of(extra)))
        self.vgpus = {fid: n for _name, fid, n in self.flavors}
        self.flavor_of = {}  # server UUID -> flavor id

    # -- one round ----------------------------------------------------------

    def round_requests(self):
        """(flavor id, count, multi-create?) for one round."""
        picks = [f for f in self.flavors]
        picks += [self.rng.choice(self.flavors)
                  for _ in range(EXTRA_PER_ROUND)]
        self.rng.shuffle(picks)
        result = []
        for _name, fid, _n in picks:
            if self.rng.random() < MULTI_CREATE_SHARE:
                result.append((fid, self.rng.randint(2, MAX_MULTI), True))
            else:
                result.append((fid, 1, False))
        return result

    def _post(self, fid, count, multi, out, tally):
        from nova.tests.functional.api import client
        from nova_gpu.tests.harness import cloud as cloud_mod
        body = self.cloud._build_server(image_uuid=cloud_mod.IMAGE,
                                        flavor_id=fid, networks='none')
        try:
            if not multi:
                out.append((fid, [self.cloud.api.post_server(
                    {'server': body})['id']]))
                return
            body['min_count'] = body['max_count'] = count
            body['return_reservation_id'] = True
            rid = self.cloud.api.post_server(
                {'server': body})['reservation_id']
            servers = self.cloud.api.get_servers(
                detail=False, search_opts={'reservation_id': rid})
            out.append((fid, [s['id'] for s in servers]))
            if len(servers) != count:
                tally.other.append(('multi-create %s' % rid, 'made %d of %d '
                                    'servers' % (len(servers), count)))
        except client.OpenStackApiException as e:
            tally.other.append(('POST %s x%d' % (fid, count), 'API %s: %s'
                                % (e.response.status_code,
                                   e.response.text[:300])))

    def fire(self, requests, tally):
        """POST ``requests`` at once; return [(flavor id, [UUID, ...])]."""
        out = []
        threads = [threading.Thread(target=self._post,
                                    args=(fid, count, multi, out, tally))
                   for fid, count, multi in requests]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for fid, count, multi in requests:
            tally.attempts += count
            if multi:
                tally.multi_creates += 1
            else:
                tally.single_posts += 1
        for fid, uuids in out:
            for uuid in uuids:
                self.flavor_of[uuid] = fid
        return [u for _fid, uuids in out for u in uuids]

    def settle(self, uuids, tally):
        """Wait until none of ``uuids`` builds; count the outcomes.

        Publishes the hosts' GPU reports every ``REPORT_INTERVAL``, as
        agents do after device changes, a little late.
        """
        wanted = set(uuids)
        deadline = time.monotonic() + ROUND_TIMEOUT
        reported = time.monotonic()
        while time.monotonic() < deadline:
            building = {s['id'] for s in self.cloud.admin_api.get_servers(
                detail=False, search_opts={'status': 'BUILD'})}
            if not building & wanted:
                break
            if time.monotonic() - reported >= REPORT_INTERVAL:
                self.cloud.sync_gpu_reports()
                reported = time.monotonic()
            time.sleep(POLL)
        self.cloud.sync_gpu_reports()
        found = {s['id']: s for s in self.cloud.admin_api.get_servers(
            detail=True, search_opts={'limit': 1000})}
        active = 0
        for uuid in sorted(wanted):
            server = found.get(uuid)
            status = server['status'] if server else 'missing'
            if status == 'ACTIVE':
                active += 1
            elif status == 'ERROR':
                message = (server.get('fault') or {}).get('message', '')
                if message.startswith(NO_VALID_HOST):
                    tally.no_valid_host += 1
                else:
                    tally.other.append((uuid, 'ERROR: %s' % message[:200]))
            else:
                tally.other.append((uuid, '%s after %ds'
                                    % (status, ROUND_TIMEOUT)))
        tally.active += active
        return active

    # -- a wave -------------------------------------------------------------

    def wave(self, tally):
        """Boot until a whole round fails; audit; delete every server."""
        uuids = []
        while True:
            fresh = self.fire(self.round_requests(), tally)
            uuids.extend(fresh)
            if self.settle(fresh, tally):
                continue
            # A whole round failed. Concurrent claims can refuse a request
            # for a moment (a multi-create holds its claims in Placement
            # until it fails): exhausted only if one request of each kind,
            # one at a time, fails too.
            served = 0
            for _name, fid, _n in self.flavors:
                fresh = self.fire([(fid, 1, False)], tally)
                uuids.extend(fresh)
                served += self.settle(fresh, tally)
            if not served:
                break
            tally.calm_served += served
        tally.waves += 1
        tally.audit.add(audit(self.cloud, self.flavor_of, self.vgpus))
        self.delete(uuids, tally)

    def delete(self, uuids, tally):
        """Delete ``uuids`` at once; retry once what is left after that.

        A failed DELETE is counted (it must not happen: one did, with
        oslo.db's "Can't upgrade a READER transaction to a WRITER", while
        the harness let green threads share transactions; see
        ``nova_gpu.tests.harness.green``) and retried, as an operator would;
        what is still left after the retry is counted too.
        """
        left = self._delete_all(uuids, tally)
        if left:
            tally.delete_retries += len(left)
            left = self._delete_all(sorted(left), tally)
        self.cloud.sync_gpu_reports()
        tally.leaked.extend('server %s not deleted' % u for u in sorted(left))
        for name, used in sorted(_gpu_usage(self.cloud).items()):
            if used:
                tally.leaked.append('%s: %d VGPU still allocated'
                                    % (name, used))

    def _delete_all(self, uuids, tally):
        """DELETE ``uuids`` at once; return those still there after."""
        failed = set()
        threads = [threading.Thread(target=self._delete,
                                    args=(u, tally, failed))
                   for u in uuids]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        deadline = time.monotonic() + ROUND_TIMEOUT
        left = set(uuids) - failed
        while left and time.monotonic() < deadline:
            left &= {s['id'] for s in self.cloud.admin_api.get_servers(
                detail=False, search_opts={'limit': 1000})}
            if left:
                time.sleep(POLL)
        return left | failed

    def _delete(self, uuid, tally, failed):
        from nova.tests.functional.api import client
        try:
            self.cloud.api.delete_server(uuid)
        except client.OpenStackApiException as e:
            if e.response.status_code != 404:
                failed.add(uuid)
                tally.delete_errors.append('DELETE %s: %s' % (
                    uuid, e.response.status_code))


# -- the audit ---------------------------------------------------------------

def _providers(cloud):
    return cloud.placement.get('/resource_providers').body[
        'resource_providers']


def _gpu_usage(cloud):
    result = {}
    for rp in _providers(cloud):
        if '_pci_' in rp['name']:
            result[rp['name']] = cloud._get_provider_usages(
                rp['uuid']).get('VGPU', 0)
    return result


def audit(cloud, flavor_of, vgpus):
    """Audit the cloud from Placement and the hosts' domain XML."""
    found = Audit()
    names = {}
    capacity = {}  # GPU provider name -> VGPU capacity
    free = {}  # GPU provider name -> free VGPU
    room = {}  # provider name -> has room for the smallest flavor's rest
    allocated = collections.defaultdict(dict)  # server -> {provider: n}
    for rp in _providers(cloud):
        names[rp['uuid']] = rp['name']
        inventories = cloud.placement.get(
            '/resource_providers/%s/inventories' % rp['uuid']).body[
            'inventories']
        usages = cloud._get_provider_usages(rp['uuid'])
        for rc, used in sorted(usages.items()):
            inv = inventories.get(rc)
            cap = ((inv['total'] - inv['reserved']) * inv['allocation_ratio']
                   if inv else 0)
            if used > cap:
                found.overcommits.append('%s %s: %s used of %s'
                                         % (rp['name'], rc, used, cap))
        room[rp['name']] = all(
            _free(inventories.get(rc), usages.get(rc, 0)) >= need
            for rc, need in SMALLEST.items() if rc in inventories)
        if 'VGPU' in inventories:
            inv = inventories['VGPU']
            capacity[rp['name']] = inv['total'] - inv['reserved']
            free[rp['name']] = _free(inv, usages.get('VGPU', 0))
            allocations = cloud.placement.get(
                '/resource_providers/%s/allocations' % rp['uuid']).body[
                'allocations']
            for consumer, alloc in allocations.items():
                n = alloc['resources'].get('VGPU', 0)
                if n:
                    allocated[consumer][rp['name']] = n
    # Free vGPUs a server of the smallest flavor could still have used:
    # its host has the CPU and memory for it too.
    left = {name: n for name, n in sorted(free.items())
            if n and room.get(name.split('_pci_')[0], True)}
    found.free_at_exhaustion = int(sum(left.values()))
    found.free_detail = ['%s: %d VGPU free' % kv for kv in left.items()]
    # One GPU unit to two servers: more VGPU held than the GPU has.
    held = collections.Counter()
    for per_provider in allocated.values():
        held.update(per_provider)
    for name, n in sorted(held.items()):
        if n > capacity.get(name, 0):
            found.double.append('%s: %d VGPU held, capacity %d'
                                % (name, n, capacity.get(name, 0)))

    servers = {s['id']: s for s in cloud.admin_api.get_servers(
        detail=True, search_opts={'limit': 1000})}
    domains = _domains(cloud)  # server -> [(mdev UUID, provider name)]
    for uuid, server in sorted(servers.items()):
        if server['status'] != 'ACTIVE':
            if allocated.get(uuid):
                found.failed_holding.append(
                    '%s is %s but holds VGPU %s' % (uuid, server['status'],
                                                    allocated[uuid]))
            continue
        want = vgpus.get(flavor_of.get(uuid), 0)
        have = allocated.get(uuid, {})
        if sum(have.values()) != want:
            found.without_allocation.append(
                '%s ACTIVE with VGPU %s in Placement, flavor asks %d'
                % (uuid, have, want))
        devices = collections.Counter(
            provider for _mdev, provider in domains.get(uuid, ()))
        if devices != collections.Counter(have):
            found.device_mismatch.append(
                '%s: mdevs on %s, Placement allocations %s'
                % (uuid, dict(devices), have))
    by_mdev = collections.defaultdict(list)
    for uuid, mdevs in domains.items():
        for mdev, provider in mdevs:
            by_mdev[mdev, provider].append(uuid)
    for (mdev, provider), holders in sorted(by_mdev.items()):
        if len(holders) < 2:
            continue
        line = 'mdev %s on %s in the domains of %s' % (
            mdev, provider, ', '.join(sorted(holders)))
        if all(allocated.get(u, {}).get(provider) for u in holders):
            found.driver_reuse.append(line)
        else:
            found.double.append(line)
    return found


def _free(inventory, used):
    if not inventory:
        return 0
    return ((inventory['total'] - inventory['reserved'])
            * inventory['allocation_ratio'] - used)


def _domains(cloud):
    """Server UUID -> [(mdev UUID, GPU provider name), ...] of its domain."""
    result = {}
    for hostname, compute in cloud.computes.items():
        conn = compute.driver._host.get_connection()
        parents = {}
        for name, dev in conn.mdev_info.devices.items():
            parent = re.search(r'<parent>([^<]+)</parent>', dev.XMLDesc(0))
            parents[name[len('mdev_'):].replace('_', '-')] = (
                parent.group(1) if parent else None)
        from nova.tests.fixtures import libvirt as fakelibvirt
        for dom in conn.listAllDomains(
                fakelibvirt.VIR_CONNECT_LIST_DOMAINS_ACTIVE
                | fakelibvirt.VIR_CONNECT_LIST_DOMAINS_INACTIVE):
            xml = ElementTree.fromstring(dom.XMLDesc(0))
            mdevs = []
            for hostdev in xml.iter('hostdev'):
                if hostdev.get('type') != 'mdev':
                    continue
                mdev = hostdev.find('./source/address').get('uuid')
                parent = parents.get(mdev)
                mdevs.append((mdev, '%s_%s' % (hostname, parent)
                              if parent else 'unknown parent'))
            result.setdefault(dom.UUIDString(), []).extend(mdevs)
    return result


# -- running it --------------------------------------------------------------

def nova_conf(stock=False):
    """nova.conf of the run's cloud (no quota: the cloud must run out)."""
    import copy
    from nova_gpu.tests.harness import cloud as cloud_mod
    conf = copy.deepcopy(cloud_mod.STOCK_CONF if stock
                         else cloud_mod.HARNESS_CONF)
    conf['quota'] = {'instances': -1, 'cores': -1, 'ram': -1}
    return conf


def slow_guest_definition(case, seconds=DEFINE_LATENCY):
    """Let a boot take ``seconds`` between its mdevs and its domain.

    On a real host, plugging the VIFs and defining the domain after
    ``_allocate_mdevs`` takes tens of milliseconds, during which other
    boots run; the fake libvirt does it at once, without yielding, so that
    Nova's mdev race (see the module doc) could never show here.
    """
    import fixtures
    from nova.virt.libvirt import driver
    real = driver.LibvirtDriver._create_guest_with_network

    def create(*args, **kwargs):
        time.sleep(seconds)
        return real(*args, **kwargs)
    case.useFixture(fixtures.MonkeyPatch(
        'nova.virt.libvirt.driver.LibvirtDriver._create_guest_with_network',
        create))


def start(stock=False, schedulers=2):
    """A running cloud of ``hosts()`` with ``schedulers`` schedulers."""
    import fixtures
    from nova_gpu.tests.harness import cloud as cloud_mod
    attrs = {'HOSTS': hosts(), 'NOVA_CONF': nova_conf(stock),
             'SCHEDULER_FILES': () if stock else cloud_mod.service_conf.
             SERVICE_FILES['scheduler'],
             'SCHEDULERS': schedulers, 'runTest': lambda self: None}
    case = type('BootsCloud', (cloud_mod.GpuCloudTestCase,), attrs)()
    case.useFixture(fixtures.EnvironmentVariable('OS_TEST_TIMEOUT', '0'))
    try:
        case.setUp()
    except BaseException:
        case.doCleanups()  # Nova's fixtures patch the process
        raise
    slow_guest_definition(case)
    return case


def count_requests(cloud, tally):
    """Count the scheduling requests each nova-scheduler service serves."""
    tally.per_scheduler = [0] * len(cloud.schedulers)
    for i, service in enumerate(cloud.schedulers):
        manager = service.manager
        real = manager.select_destinations

        def counted(*args, _real=real, _i=i, **kwargs):
            tally.per_scheduler[_i] += 1
            return _real(*args, **kwargs)
        # The RPC dispatcher looks the method up on the manager object.
        manager.select_destinations = counted


def boot_until(cloud, attempts, stock=False, seed=SEED, progress=None):
    """Waves on ``cloud`` until ``attempts`` boots were tried.

    ``progress``: called with a line after each wave.
    """
    start_time = time.monotonic()
    booter = Booter(cloud, STOCK_FLAVORS if stock else PLUGIN_FLAVORS,
                    random.Random(seed))
    tally = Tally()
    count_requests(cloud, tally)
    while tally.attempts < attempts:
        booter.wave(tally)
        if progress:
            progress('%s wave %d: %d boots, %d ACTIVE, %d NoValidHost, '
                     '%d other, %.0f s' % (
                         'stock Nova' if stock else 'nova-gpu', tally.waves,
                         tally.attempts, tally.active, tally.no_valid_host,
                         len(tally.other), time.monotonic() - start_time))
    tally.elapsed = time.monotonic() - start_time
    return tally


def _run_cloud(attempts, stock):
    import logging
    # Nova's test logging formats every DEBUG record: a third of the time.
    logging.disable(logging.DEBUG)
    try:
        cloud = start(stock=stock)
        try:
            return boot_until(cloud, attempts, stock=stock,
                              progress=_progress)
        finally:
            logging.disable(logging.INFO)
            cloud.doCleanups()
    finally:
        logging.disable(logging.NOTSET)


def _progress(line):
    print(line, flush=True)


def _show(title, items, limit=5):
    if items:
        print('%s (%d):' % (title, len(items)))
        for item in items[:limit]:
            print('   %s' % (item,))


def run(quick=False):
    from nova_gpu.bench.reliability import Figure
    ours = _run_cloud(QUICK_ATTEMPTS if quick else FULL_ATTEMPTS, False)
    stock = _run_cloud(STOCK_ATTEMPTS[quick], True)
    for label, tally in (('nova-gpu', ours), ('stock Nova', stock)):
        _show('%s: other failures' % label, tally.other)
        _show('%s: over-commits' % label, tally.audit.overcommits)
        _show('%s: double allocations' % label, tally.audit.double)
        _show('%s: ACTIVE without GPU allocation' % label,
              tally.audit.without_allocation)
        _show('%s: devices not matching allocations' % label,
              tally.audit.device_mismatch)
        _show('%s: Nova libvirt driver mdev reuse' % label,
              tally.audit.driver_reuse)
        _show('%s: vGPUs free at exhaustion' % label,
              tally.audit.free_detail)
        _show('%s: failed DELETEs' % label, tally.delete_errors)
        _show('%s: left after deletion' % label, tally.leaked)
    a = ours.audit
    part = 'boots'

    def fig(name, value, target='-', ok=True):
        return Figure(part, name, value, target, ok)

    def zero(name, value):
        return fig(name, value, '0', value == 0)
    return [
        fig('boots attempted (two schedulers, %d waves)' % ours.waves,
            ours.attempts, '>= %d' % (QUICK_ATTEMPTS if quick
                                      else FULL_ATTEMPTS),
            ours.attempts >= (QUICK_ATTEMPTS if quick else FULL_ATTEMPTS)),
        fig('  of them multi-create requests / single POSTs',
            '%d / %d' % (ours.multi_creates, ours.single_posts)),
        fig('ACTIVE', ours.active),
        fig('NoValidHost', ours.no_valid_host),
        zero('other failures', len(ours.other)),
        zero('double allocations by the scheduler', len(a.double)),
        zero('Placement over-commits', len(a.overcommits)),
        zero('ACTIVE without its GPU allocation',
             len(a.without_allocation)),
        zero('ACTIVE whose mdevs differ from its allocation',
             len(a.device_mismatch)),
        fig('Nova libvirt driver mdev reuse (one mdev, two domains)',
            len(a.driver_reuse)),
        fig('boots served one at a time after a whole racing round failed',
            ours.calm_served),
        zero('vGPUs free in Placement when one boot of each kind, one '
             'at a time, failed', a.free_at_exhaustion),
        zero('failed DELETEs (retried once)', len(ours.delete_errors)),
        zero('servers or allocations left after deletion (and retry)',
             len(ours.leaked)),
        fig('requests served per scheduler', ' / '.join(
            str(n) for n in ours.per_scheduler),
            'each > 0', all(ours.per_scheduler)),
        fig('elapsed, nova-gpu run (s)', round(ours.elapsed, 1)),
        fig('stock Nova config: boots / ACTIVE / NoValidHost / other',
            '%d / %d / %d / %d' % (stock.attempts, stock.active,
                                   stock.no_valid_host, len(stock.other))),
        fig('stock Nova config: over-commits / double allocations',
            '%d / %d' % (len(stock.audit.overcommits),
                         len(stock.audit.double))),
        fig('stock Nova config: Nova libvirt driver mdev reuse',
            len(stock.audit.driver_reuse)),
        fig('stock Nova config: vGPUs free at exhaustion',
            stock.audit.free_at_exhaustion),
    ]


if __name__ == '__main__':
    import sys

    from nova_gpu.bench import reliability
    sys.exit(reliability.part_main('boots', run))
