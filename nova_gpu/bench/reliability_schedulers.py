"""Several nova-scheduler services racing: claim conflicts, early refusals.

The cloud, flavors and waves of ``reliability_boots`` (four GPU hosts on
SR-IOV + mdev, 24 vGPUs, one VGPU provider per VF; concurrent single
POSTs and multi-create requests of every flavor kind until the cloud is
exhausted, then an audit and every server deleted), with 1, 2, 3 and 5
nova-scheduler services, each with its own GPU view; nova-gpu against
stock Nova in the same setup (Nova's filters, stock vGPU flavors), each
with two seeds of the workload. Per run:

* claims tried and claims failed: every ``nova.scheduler.utils.
  claim_resources`` Nova's ``_schedule`` makes, and those Placement
  refused (another scheduler took the device since Placement offered it;
  Nova then tries candidate 0 of its next host). The plugin's retries
  (``manager.GpuSchedulerManager``) are counted apart.
* early NoValidHost: a request answered NoValidHost while the cloud could
  still serve it. Right after the scheduler answers, the harness asks
  Placement for the request's allocation candidates again (the same
  query), keeps those the scheduler's own rules accept (the plugin's
  view for a GPU flavor, as the filter decides; Placement's word for
  stock Nova, whose filters pass every host here) and counts how many of
  the request's instances they can hold, provider capacities and usages
  as Placement reported them. Enough for all: early. Other requests run
  meanwhile, so the figure is what the cloud held a few milliseconds
  after the refusal.
* double allocations, over-commits, ACTIVE servers whose devices are not
  on the GPUs allocated to them (``reliability_boots.audit``) and wrong
  devices: a server whose vGPUs are not what its flavor asks (the
  profile, the model, at least the memory asked, as many GPUs as devices:
  two vGPUs of one server on one GPU is wrong).

Run with ``python -m nova_gpu.bench.reliability schedulers`` (``--quick``:
1 and 3 schedulers, one seed); ``OS_NOVA_DISABLE_EVENTLET_PATCHING=true``
runs Nova in its default native threading, as the suite does.
"""

import collections
import dataclasses
import random
import threading
import time

from nova_gpu.bench import claims as claims_mod
from nova_gpu.bench import reliability_boots as boots

SCHEDULER_COUNTS = (1, 2, 3, 5)
QUICK_COUNTS = (1, 3)
SEEDS = (boots.SEED, boots.SEED + 1)
QUICK_SEEDS = (boots.SEED,)
# Waves per run: each fills the cloud to exhaustion and empties it.
WAVES = 1
# No new wave starts this many seconds into a run.
RUN_DEADLINE = 600.0
# The vGPU each plugin flavor asks (reliability_boots.PLUGIN_FLAVORS):
# (vGPU types allowed or None, GPU model or None, least memory in MiB).
ASKS = {
    'stock-vgpu': (None, None, 0),
    'stock-vgpu-x2': (None, None, 0),
    'a100-10c': (('A100-10C',), None, 0),
    'a100-20c': (('A100-20C',), None, 0),
    'mem-12gb': (None, None, 12 * 1024),
    'l4': (None, 'L4', 0),
    'h100-x2': (None, 'H100-80GB', 0),
}


_LOCK = threading.Lock()


@dataclasses.dataclass
class Run:
    """What one cloud run measured."""

    schedulers: int
    stock: bool
    seed: int
    tally: boots.Tally = None
    claims: int = 0
    claims_failed: int = 0
    retried: int = 0
    gave_up: int = 0
    refusals: int = 0  # NoValidHost answers (requests)
    early: list = dataclasses.field(default_factory=list)
    oracle_errors: list = dataclasses.field(default_factory=list)
    wrong: list = dataclasses.field(default_factory=list)
    elapsed: float = 0.0


def _watch_refusals(cloud, run, stock):
    """Check every NoValidHost a scheduler answers against what the cloud
    still holds (``early``); after ``reliability_boots.count_requests``.
    """
    from nova import exception
    from oslo_messaging.rpc import dispatcher
    for service in cloud.schedulers:
        manager = service.manager
        real = manager.select_destinations

        def watched(context, *args, _real=real, _manager=manager,
                    **kwargs):
            try:
                return _real(context, *args, **kwargs)
            except Exception as e:
                error = (e.exc_info[1]
                         if isinstance(e, dispatcher.ExpectedException)
                         else e)
                if isinstance(error, exception.NoValidHost):
                    _refused(cloud, _manager, run, stock, context, kwargs)
                raise
        manager.select_destinations = watched


def _refused(cloud, manager, run, stock, context, kwargs):
    spec_obj = kwargs.get('spec_obj')
    count = len(kwargs.get('instance_uuids') or ()) or 1
    with _LOCK:
        run.refusals += 1
    try:
        could = could_serve(cloud, manager, context, spec_obj, count, stock)
    except Exception as e:  # the harness's own check: counted, shown
        run.oracle_errors.append('%s: %s' % (type(e).__name__, e))
        return
    if could:
        run.early.append('%s x%d (flavor %s)' % (
            getattr(spec_obj, 'instance_uuid', None), count,
            spec_obj.flavor.name))


def could_serve(cloud, manager, context, spec_obj, count, stock):
    """Whether the cloud holds ``count`` instances of ``spec_obj`` now, by
    Placement's candidates and the scheduler's own rules (see the module
    doc).
    """
    from nova.scheduler import utils
    resources = utils.resources_from_request_spec(
        context, spec_obj, manager.host_manager,
        enable_pinning_translate=True)
    res = manager.placement_client.get_allocation_candidates(context,
                                                             resources)
    if not res or not res[0]:
        return False
    alloc_reqs, summaries, _version = res
    left = {(rp, rc): r['capacity'] - r['used']
            for rp, summary in summaries.items()
            for rc, r in summary['resources'].items()}
    names = {rp['uuid']: rp['name'] for rp in cloud.placement.get(
        '/resource_providers').body['resource_providers']}
    by_host = collections.defaultdict(list)
    for candidate in alloc_reqs:
        root = next((rp for rp, a in candidate['allocations'].items()
                     if 'VCPU' in a['resources']), None)
        by_host[names.get(root)].append(candidate)
    servable = []
    for nodename, candidates in sorted(by_host.items(), key=str):
        servable.extend(candidates if stock else _kept(
            manager, spec_obj, nodename, candidates))
    placed = 0
    for candidate in servable:
        while placed < count and _fits(candidate, left):
            for rp, a in candidate['allocations'].items():
                for rc, n in a['resources'].items():
                    left[rp, rc] -= n
            placed += 1
    return placed >= count


def _kept(manager, spec_obj, nodename, candidates):
    """The candidates GpuFilter would keep on ``nodename`` (no claim
    counted, nothing left on Nova's HostState).
    """
    from nova_gpu.scheduler import gpu_spec as flavor
    from nova_gpu.scheduler import view as view_mod
    spec = flavor.from_request_spec(spec_obj)
    if spec is None:
        return candidates
    view = view_mod.of_service(manager)
    decision = view.decide(view.request(spec_obj, spec), nodename, 0,
                           candidates=candidates)
    if decision.why is not None:
        return []
    if decision.order is None:
        return candidates
    return [candidates[i] for i in decision.order]


def _fits(candidate, left):
    return all(left.get((rp, rc), 0) >= n
               for rp, a in candidate['allocations'].items()
               for rc, n in a['resources'].items())


def wrong_devices(cloud, flavor_of, flavor_names):
    """ACTIVE servers whose vGPUs are not what their flavor asks."""
    where = cloud._provider_gpus()  # provider name -> (host, GPU index)
    names = {}
    found = []
    for server in cloud.admin_api.get_servers(
            detail=True, search_opts={'limit': 1000}):
        if server['status'] != 'ACTIVE':
            continue
        flavor = flavor_names.get(flavor_of.get(server['id']))
        devices = []
        for rp, alloc in cloud._get_allocations_by_server_uuid(
                server['id']).items():
            if not alloc['resources'].get('VGPU'):
                continue
            if rp not in names:
                names[rp] = cloud.placement.get(
                    '/resource_providers/%s' % rp).body['name']
            host, gpu = where[names[rp]]
            devices.extend([(host, gpu)] * alloc['resources']['VGPU'])
        why = _wrong(cloud, flavor, devices)
        if why:
            found.append('%s (flavor %s): %s' % (server['id'], flavor, why))
    return found


def _wrong(cloud, flavor, devices):
    if len(set(devices)) < len(devices):
        return 'two vGPUs on one GPU: %s' % (devices,)
    types, model, memory = ASKS.get(flavor, (None, None, 0))
    for host, _gpu in devices:
        spec = cloud._host_specs[host]
        profile = spec.profile()
        if types and profile.name not in types:
            return '%s on %s, asked %s' % (profile.name, host, types)
        if model and spec.model != model:
            return '%s on %s, asked %s' % (spec.model, host, model)
        if profile.framebuffer_mib < memory:
            return '%s (%d MiB) on %s, asked %d MiB' % (
                profile.name, profile.framebuffer_mib, host, memory)
    return None


class _Booter(boots.Booter):
    """Waves that also audit the devices against the flavors."""

    def __init__(self, cloud, flavors, rng, run):
        super().__init__(cloud, flavors, rng)
        self.run = run
        self.flavor_names = {fid: name for name, fid, _n in self.flavors}

    def delete(self, uuids, tally):
        self.run.wrong.extend(wrong_devices(self.cloud, self.flavor_of,
                                            self.flavor_names))
        super().delete(uuids, tally)


def run_cloud(schedulers, stock, seed, waves=WAVES, progress=None):
    """One run: a cloud of ``schedulers`` schedulers, ``waves`` waves."""
    import logging
    result = Run(schedulers, stock, seed)
    logging.disable(logging.DEBUG)
    try:
        # First: it puts the process in Nova's threading mode before any
        # module that imports oslo.messaging.
        cloud = boots.start(stock=stock, schedulers=schedulers)
        try:
            start = time.monotonic()
            tally = result.tally = boots.Tally()
            booter = _Booter(cloud, boots.STOCK_FLAVORS if stock
                             else boots.PLUGIN_FLAVORS, random.Random(seed),
                             result)
            boots.count_requests(cloud, tally)
            _watch_refusals(cloud, result, stock)
            with claims_mod.counted(claims_mod.Claims()) as claimed:
                while (tally.waves < waves
                       and time.monotonic() - start < RUN_DEADLINE):
                    booter.wave(tally)
            result.claims = claimed.tried
            result.claims_failed = claimed.refused
            result.elapsed = time.monotonic() - start
            for service in cloud.schedulers:
                counts = getattr(service.manager, 'claim_retries',
                                 {'retried': 0, 'gave_up': 0})
                result.retried += counts['retried']
                result.gave_up += counts['gave_up']
        finally:
            logging.disable(logging.INFO)
            cloud.doCleanups()
    finally:
        logging.disable(logging.NOTSET)
    if progress:
        progress(describe(result))
    return result


def describe(r):
    t = r.tally
    return ('%s, %d scheduler(s), seed %d: %d boots, %d ACTIVE, %d '
            'NoValidHost (%d early), claims %d failed of %d, %d retried, '
            '%.0f s' % ('stock Nova' if r.stock else 'nova-gpu', r.schedulers,
                        r.seed, t.attempts, t.active, t.no_valid_host,
                        len(r.early), r.claims_failed, r.claims, r.retried,
                        r.elapsed))


def _progress(line):
    print(line, flush=True)


def _show(title, items, limit=5):
    if items:
        print('%s (%d):' % (title, len(items)))
        for item in items[:limit]:
            print('   %s' % (item,))


def run(quick=False):
    from nova_gpu.bench.reliability import Figure
    counts = QUICK_COUNTS if quick else SCHEDULER_COUNTS
    seeds = QUICK_SEEDS if quick else SEEDS
    runs = []
    for n in counts:
        for seed in seeds:
            for stock in (False, True):
                runs.append(run_cloud(n, stock, seed, progress=_progress))
    part = 'schedulers'
    rows = []
    for r in runs:
        t, a = r.tally, r.tally.audit
        label = '%s, %d sched., seed %d' % (
            'stock' if r.stock else 'nova-gpu', r.schedulers, r.seed)
        _show(label + ': early NoValidHost', r.early)
        _show(label + ': wrong devices', r.wrong)
        _show(label + ': double allocations', a.double)
        _show(label + ': devices off the allocated GPU', a.device_mismatch)
        _show(label + ': other failures', t.other)
        _show(label + ': harness check errors', r.oracle_errors)
        clean = not (a.double or a.overcommits or a.device_mismatch
                     or r.wrong or t.other or r.oracle_errors)

        def fig(name, value, target='-', ok=True, _label=label):
            rows.append(Figure(part, '%s: %s' % (_label, name), value,
                               target, ok))
        fig('boots / ACTIVE / NoValidHost', '%d / %d / %d' % (
            t.attempts, t.active, t.no_valid_host))
        fig('claims failed of tried (%)', '%d of %d (%d %%)' % (
            r.claims_failed, r.claims,
            round(100.0 * r.claims_failed / r.claims) if r.claims else 0))
        fig('requests scheduled again / given up', '%d / %d' % (
            r.retried, r.gave_up))
        fig('early NoValidHost (requests)', len(r.early),
            '0' if not r.stock else '-',
            r.stock or not r.early)
        fig('double alloc. / off the allocated GPU / wrong devices / '
            'other failures', '%d / %d / %d / %d' % (
                len(a.double) + len(a.overcommits), len(a.device_mismatch),
                len(r.wrong), len(t.other) + len(r.oracle_errors)),
            '0 / 0 / 0 / 0' if not r.stock else '-', r.stock or clean)
    # Conflicts against stock's, per number of schedulers.
    for n in counts:
        ours = [r for r in runs if r.schedulers == n and not r.stock]
        stock = [r for r in runs if r.schedulers == n and r.stock]
        rate = _rate(ours)
        stock_rate = _rate(stock)
        # One scheduler races only its own concurrent requests.
        rows.append(Figure(
            part, '%d sched.: claims failed, nova-gpu vs stock (%%)' % n,
            '%.0f vs %.0f' % (100 * rate, 100 * stock_rate),
            '-' if n == 1 else '<= half of stock\'s',
            n == 1 or rate <= stock_rate / 2))
    return rows


def _rate(runs):
    tried = sum(r.claims for r in runs)
    return sum(r.claims_failed for r in runs) / tried if tried else 0.0


if __name__ == '__main__':
    import sys

    from nova_gpu.bench import reliability
    sys.exit(reliability.part_main('schedulers', run))
