"""What the scheduler plugin costs nova-scheduler per request, per host.

Runs our filter and weighers through Nova's own ``HostFilterHandler`` and
``HostWeightHandler`` on real ``HostState`` objects at 1,000 and 10,000
hosts of 8 GPUs (two NUMA cells of 4), for a 4-GPU request with dedicated
CPUs on one NUMA node, side by side with Nova's in-tree way of serving the
same request with PCI passthrough: ``PciPassthroughFilter`` +
``NUMATopologyFilter`` + ``PCIWeigher`` on hosts with the same 8 GPUs in
``pci_stats``. Also reports the memory of the GPU view at 10,000 hosts.

"cold" is the first request after every host changed (the view scores each
host); "warm" is a request whose hosts are unchanged since the last one
(memoised). As in nova-scheduler, every host gets, before every request,
a new ``NUMATopology`` object, deserialised from the compute node's JSON
(``NUMATopology.obj_from_db_obj``) with the compute node's last update
time (``HostState.updated``), and every request gets fresh
allocation candidates, parsed from Placement's JSON (no object survives
from one request to the next). Hosts already use 0 to 4 GPUs, in varied
places, so that their states differ (rankings are shared by hosts in the
same state). Each host carries up to 8 Placement allocation candidates
for our side (4 of its free GPU providers each, plus the compute node's
CPUs, memory and disk) and one (the compute node) for the in-tree side,
whose PCI devices are not in Placement. The floor is Nova's handlers
with its cheapest filter and weigher, for scale: each configuration's
warm passes alternate with passes of the floor on the same hosts, after
each cold pass, and the figures above the floor subtract that
configuration's own floor (the floor row of the table is the one
measured with the first).

Run: ``python -m nova_gpu.bench.scheduler_cost [--cpu] [--no-in-tree]
[hosts ...]``.
"""

import argparse
import datetime
import gc
import itertools
import json
import sys
import time
import tracemalloc
import weakref

from oslo_config import cfg

from nova_gpu import tables

CONF = cfg.CONF
GPUS = 8
CPUS_PER_CELL = 32
MEM_PER_CELL = 262144
MODEL = 'H100-80GB'
VENDOR, PRODUCT = '10de', '2330'
CANDIDATES_PER_HOST = 8
# Cold passes per configuration and size, each on hosts and a view built
# afresh; the cheapest counts, as for the warm passes (the machine's noise
# is not the plugin's cost).
COLD_ROUNDS = 3
# Warm passes per cold pass (the cheapest of all counts), each followed
# by a pass of Nova's floor on the same hosts.
WARM_PASSES = 3
# The hosts whose candidates Nova reads per request: the one it claims on
# and its alternates (``[scheduler] max_attempts`` = 3).
SELECTED = 3
# The configurations measured side by side: the default weighers
# (nova-scheduler.conf) and GpuWeigher alone, the large clouds' one
# (nova-scheduler-large-cloud.conf).
CONFIGS = (('two weighers', ('GpuFragmentationWeigher',
                             'GpuTopologyWeigher')),
           ('one weigher', ('GpuWeigher',)))
# What the 8-vCPU dedicated-CPU flavor takes on the root provider.
ROOT_RESOURCES = {'PCPU': 8, 'MEMORY_MB': 16384, 'DISK_GB': 1}
# The compute nodes' NUMA topology as the database holds it (JSON), per
# HostState, and their last update (a minute before the requests).
NUMA_JSON = weakref.WeakKeyDictionary()
UPDATED_AT = (datetime.datetime.now(datetime.timezone.utc)
              - datetime.timedelta(minutes=1))
# Wall time, as nova-scheduler's users wait it; ``--cpu`` measures this
# process's CPU time instead (steadier on a loaded machine).
CLOCK = time.perf_counter


def _numa_topology(objects):
    cells = []
    for cid in range(2):
        cpus = set(range(cid * CPUS_PER_CELL, (cid + 1) * CPUS_PER_CELL))
        cells.append(objects.NUMACell(
            id=cid, socket=cid, cpuset=set(), pcpuset=cpus,
            memory=MEM_PER_CELL,
            cpu_usage=0, memory_usage=0, pinned_cpus=set(),
            siblings=[{c} for c in sorted(cpus)],
            mempages=[objects.NUMAPagesTopology(
                size_kb=4, total=MEM_PER_CELL * 256, used=0)],
            network_metadata=objects.NetworkMetadata(physnets=set(),
                                                     tunneled=False)))
    return objects.NUMATopology(cells=cells)


def _host_state(host_manager, objects, name, topology):
    state = host_manager.HostState(name, name, 'cell1')
    state.uuid = name + '-root'
    # Its own object, as HostState.update_from_compute_node makes it from
    # the compute node's JSON, and the compute node's last update.
    NUMA_JSON[state] = topology._to_json()
    state.numa_topology = objects.NUMATopology.obj_from_db_obj(
        NUMA_JSON[state])
    state.updated = UPDATED_AT
    state.free_ram_mb = MEM_PER_CELL * 2
    state.total_usable_ram_mb = MEM_PER_CELL * 2
    state.limits = {}
    state.aggregates = []
    state.cpu_allocation_ratio = 1.0
    state.ram_allocation_ratio = 1.0
    return state


def _used(i):
    """GPUs already taken on host ``i``: 0 to 4, in varied places."""
    return sorted({(i // 5 + k * 3) % GPUS for k in range(i % 5)})


def _gpu_report(report_mod, name, used=()):
    return {
        'version': report_mod.VERSION, 'host': name, 'nodename': name,
        'generation': 1, 'cpu_milli': 2 * CPUS_PER_CELL * 1000,
        'memory_mib': 2 * MEM_PER_CELL,
        'numa_cells': [{'id': c, 'cpu_milli': CPUS_PER_CELL * 1000,
                        'memory_mib': MEM_PER_CELL} for c in range(2)],
        'gpus': [{'index': i, 'address': '0000:%02x:00.0' % (0x18 + i),
                  'model': MODEL, 'numa_node': i // 4,
                  'pcie_switch': 'sw%d' % (i // 2),
                  'nvlink_peers': [p for p in range(GPUS) if p != i],
                  'mig_enabled': False, 'vgpu_types': None,
                  'provider': report_mod.mdev_provider_name(
                      name, '0000:%02x:00.0' % (0x18 + i)),
                  'devices': [{'kind': 'whole'}] if i in used else []}
                 for i in range(GPUS)]}


def _ours(n, objects, host_manager, view_mod, report_mod):
    view = view_mod.GpuView()
    tracemalloc.start()
    base = tracemalloc.take_snapshot()
    for i in range(n):
        name = 'gpu%05d' % i
        view.ingest(_gpu_report(report_mod, name, _used(i)))
        view.set_provider_uuids(name, {
            report_mod.mdev_provider_name(
                name, '0000:%02x:00.0' % (0x18 + g)): '%s-rp%d' % (name, g)
            for g in range(GPUS)})
    used = sum(s.size_diff for s in
               tracemalloc.take_snapshot().compare_to(base, 'filename'))
    tracemalloc.stop()
    from nova_gpu.scheduler import gpu_spec as flavor_mod
    # The Placement side of the flavor as an operator writes it today
    # (a whole GPU is a PCI in Placement device: pci_passthrough:alias).
    gpu_specs = {'gpu:kind': 'whole', 'gpu:count': '4'}
    parsed = flavor_mod.parse(gpu_specs, vcpus=8, memory_mb=16384)
    rc = parsed.resource_class
    topology = _numa_topology(objects)
    states = []
    for i in range(n):
        name = 'gpu%05d' % i
        free = [g for g in range(GPUS) if g not in _used(i)]
        combos = list(itertools.combinations(free, 4))
        # Placement offers free GPUs only, in no GPU-aware order.
        picks = list(dict.fromkeys(
            combos[(k * 17) % len(combos)]
            for k in range(CANDIDATES_PER_HOST)))
        state = _host_state(host_manager, objects, name, topology)
        # As Placement answers: the compute node (root provider) carries
        # the flavor's CPUs, memory and disk in every candidate, next to
        # the GPU providers.
        state.allocation_candidates = [
            {'allocations': dict(
                {state.uuid: {'resources': dict(ROOT_RESOURCES)}},
                **{'%s-rp%d' % (name, g): {'resources': {rc: 1}}
                   for g in pick}),
             'mappings': {'': [state.uuid],
                          '_GPU': ['%s-rp%d' % (name, g) for g in pick]}}
            for pick in picks]
        states.append(state)
    flavor = objects.Flavor(
        name='gpu4', vcpus=8, memory_mb=16384, root_gb=1, ephemeral_gb=0,
        swap=0, extra_specs=dict(
            gpu_specs, **flavor_mod.placement_extra_specs(parsed),
            **{'hw:cpu_policy': 'dedicated', 'hw:numa_nodes': '1'}))
    return view, states, flavor, used


def _in_tree(n, objects, host_manager, stats, whitelist):
    spec = {'vendor_id': VENDOR, 'product_id': PRODUCT}
    CONF.set_override('device_spec', [json.dumps(spec)], 'pci')
    CONF.set_override('alias', [json.dumps(dict(spec, name='gpu'))], 'pci')
    dev_filter = whitelist.Whitelist([json.dumps(spec)])
    states = []
    for i in range(n):
        name = 'pci%05d' % i
        topology = _numa_topology(objects)
        state = _host_state(host_manager, objects, name, topology)
        pci = stats.PciDeviceStats(topology, dev_filter=dev_filter)
        # The same GPUs as our side's host i are taken: pools hold the rest.
        for g in (g for g in range(GPUS) if g not in _used(i)):
            pci.add_device(objects.PciDevice.create(None, {
                'compute_node_id': i, 'address': '0000:%02x:00.0' % (0x18 + g),
                'vendor_id': VENDOR, 'product_id': PRODUCT,
                'status': 'available', 'request_id': None,
                'numa_node': g // 4, 'dev_type': 'type-PCI',
                'parent_addr': None}))
        state.pci_stats = pci
        state.allocation_candidates = [{
            'allocations': {state.uuid: {'resources': {'VCPU': 8}}},
            'mappings': {'': [state.uuid]}}]
        states.append(state)
    flavor = objects.Flavor(
        name='pci4', vcpus=8, memory_mb=16384, root_gb=1, ephemeral_gb=0,
        swap=0, extra_specs={'pci_passthrough:alias': 'gpu:4',
                             'hw:cpu_policy': 'dedicated',
                             'hw:numa_nodes': '1'})
    return states, flavor


def _request(objects, flavor, pci=False):
    numa = objects.InstanceNUMATopology(cells=[objects.InstanceNUMACell(
        id=0, cpuset=set(), pcpuset=set(range(8)), memory=16384,
        cpu_policy='dedicated')])
    spec = objects.RequestSpec(
        flavor=flavor, num_instances=1,
        instance_uuid='0b7f3c1e-8d2a-4c55-9f1e-5a6b7c8d9e0f',
        numa_topology=numa, scheduler_hints={}, ignore_hosts=None,
        force_hosts=None, force_nodes=None, image=objects.ImageMeta(
            properties=objects.ImageMetaProps()),
        pci_requests=objects.InstancePCIRequests(requests=[
            objects.InstancePCIRequest(
                count=4, alias_name='gpu',
                request_id='6d1e5b4e-0c1f-4f0e-9a51-3c6f5d2b8a11',
                spec=[{'vendor_id': VENDOR, 'product_id': PRODUCT}])]
            if pci else []))
    return spec


def _placement_json(states):
    """Placement's answer for ``states``, as JSON (``_time``)."""
    return json.dumps([s.allocation_candidates for s in states])


def _time(filters, weighers, states, spec, rounds, original=None):
    from nova.scheduler import filters as nova_filters
    from nova.scheduler import weights as nova_weights
    fh = nova_filters.HostFilterHandler()
    wh = nova_weights.HostWeightHandler()
    # Nova gives every request a fresh copy of Placement's candidates, in
    # Placement's order, from the JSON of Placement's answer to that
    # request (``SchedulerManager._schedule``: the response parsed, then
    # one deep copy per host); restore that (untimed) before each round.
    if original is None:
        original = _placement_json(states)
    from nova import objects
    times = []
    passed = 0
    for _ in range(rounds):
        for state, candidates in zip(states, json.loads(original)):
            state.allocation_candidates = candidates
            # Nova refreshes every HostState from its compute node before
            # every request (``HostManager._get_host_states``), and
            # ``HostState._update_from_compute_node`` deserialises the NUMA
            # topology again unless the HostState is newer than the
            # compute node: every request sees new NUMATopology objects,
            # with the compute node's ``updated_at``.
            state.numa_topology = objects.NUMATopology.obj_from_db_obj(
                NUMA_JSON[state])
        # What setting the hosts up allocated is not this request's
        # garbage: collect it before, untimed.
        gc.collect()
        start = CLOCK()
        kept = fh.get_filtered_objects(filters, states, spec)
        weighed = wh.get_weighed_objects(weighers, kept, spec)
        # What Nova reads of the candidates next: candidate 0 of the host
        # it claims on and of its alternates ([scheduler] max_attempts).
        for host in weighed[:SELECTED]:
            if host.obj.allocation_candidates:
                host.obj.allocation_candidates[0]
        times.append(CLOCK() - start)
        passed = len(kept)
    return times, passed


def run(sizes=(1000, 10000), out=sys.stdout, in_tree=True):
    """Measure and print the table; returns its rows (``in_tree`` False
    leaves out the in-tree PCI passthrough rows, the slow part).
    """
    from nova import objects
    from nova.pci import stats
    from nova.pci import whitelist
    from nova.scheduler.filters import all_hosts_filter
    from nova.scheduler.filters import numa_topology_filter
    from nova.scheduler.filters import pci_passthrough_filter
    from nova.scheduler import host_manager
    from nova.scheduler.weights import pci as pci_weigher
    from nova.scheduler.weights import ram

    from nova_gpu import conf  # noqa: F401
    from nova_gpu.core import report as report_mod
    from nova_gpu.scheduler import filters as gpu_filters
    from nova_gpu.scheduler import view as view_mod
    from nova_gpu.scheduler import weighers as gpu_weighers

    objects.register_all()
    CONF([], project='nova')
    # The demand publication (gpu.demand.updated) goes out at most once per
    # [gpu_scheduler] demand_publish_interval (300 s), whatever the number
    # of hosts: not a per-host cost. Each size builds a new view, whose
    # first request would publish (and the process's first would build
    # the notification transport) inside the timed pass.
    CONF.set_override('demand_publish_interval', 0, 'gpu_scheduler')
    ours_w = [gpu_weighers.GpuFragmentationWeigher(),
              gpu_weighers.GpuTopologyWeigher()]
    # Untimed: a pass on a few hosts, so that what a scheduler process does
    # once (lazy imports, first use of Nova's handlers) is not charged to
    # the first size's cold pass.
    view, states, flavor, _bytes = _ours(3, objects, host_manager, view_mod,
                                         report_mod)
    _time([gpu_filters.GpuFilter(view)], ours_w, states,
          _request(objects, flavor), 1)
    _time([gpu_filters.GpuFilter(view)], [gpu_weighers.GpuWeigher()],
          states, _request(objects, flavor), 1)
    rows = []
    # Per size, each configuration's floor (us per host), measured on its
    # own hosts.
    floors_us = []
    for n in sizes:
        floor = None
        floor_of = {}
        floors_us.append(floor_of)
        for order, weigher_names in CONFIGS:
            colds, warms, floors = [], [], []
            for _round in range(COLD_ROUNDS):
                # Every cold pass on hosts and a view of their own, built
                # afresh (the last ones freed first): it finds every host
                # changed (each HostState a new NUMATopology, as Nova
                # gives it), and no configuration runs on memory laid out
                # by another.
                gc.collect()
                view, states, flavor, view_bytes = _ours(
                    n + 1, objects, host_manager, view_mod, report_mod)
                spec = _request(objects, flavor)
                ours_f = [gpu_filters.GpuFilter(view)]
                ours_w = [getattr(gpu_weighers, name)()
                          for name in weigher_names]
                # A running scheduler's view has served requests before:
                # what a new view does on its first request (the demand
                # window's first rebuild, about 1 ms) is not a per-host
                # cost. One untimed request on one more host, not measured.
                _time(ours_f, ours_w, states[:1], _request(objects, flavor),
                      1)
                states = states[1:]
                original = _placement_json(states)
                cold, passed = _time(ours_f, ours_w, states, spec, 1,
                                     original)
                colds.append(cold[0])
                # Warm passes and the floor's alternate on the same hosts,
                # in every round, so that ours and the floor meet the same
                # memory and the same moments of the machine.
                for _pass in range(WARM_PASSES):
                    warms += _time(ours_f, ours_w, states, spec, 1,
                                   original)[0]
                    floors += _time([all_hosts_filter.AllHostsFilter()],
                                    [ram.RAMWeigher()], states, spec, 1,
                                    original)[0]
                if _round == 0:
                    # Measured as the first view ingests its reports; later
                    # ones find the values hosts share already made.
                    memory = view_bytes
                del view, states
            floor_of[order] = min(floors) / n * 1e6
            if floor is None:
                floor = floors
            rows.append(('GpuFilter + %s' % ' + '.join(weigher_names),
                         n, passed, min(colds) / n * 1e6,
                         min(warms) / n * 1e6,
                         memory if order == CONFIGS[0][0] else None))
        rows.append(('(Nova floor: AllHostsFilter + RAMWeigher)', n, n,
                     floor[0] / n * 1e6, min(floor) / n * 1e6, None))
        if not in_tree:
            rows.append(('(in-tree PCI passthrough: not measured)', n, 0,
                         0.0, 0.0, None))
            continue
        pstates, pflavor = _in_tree(n, objects, host_manager, stats,
                                    whitelist)
        pspec = _request(objects, pflavor, pci=True)
        tree_f = [pci_passthrough_filter.PciPassthroughFilter(),
                  numa_topology_filter.NUMATopologyFilter()]
        tree_w = [pci_weigher.PCIWeigher()]
        times, passed = _time(tree_f, tree_w, pstates, pspec, 3)
        rows.append(('Nova PciPassthrough + NUMATopology + PCIWeigher', n,
                     passed, times[0] / n * 1e6, min(times) / n * 1e6,
                     None))
        del pstates
    out.write(tables.text(
        ('filters + weighers', 'hosts', 'passed', 'cold us/h', 'warm us/h',
         'view MiB'),
        [(name, n, passed, cold_us, warm_us,
          None if mem is None else mem / 2 ** 20)
         for name, n, passed, cold_us, warm_us, mem in rows],
        float_format='%.1f') + '\n')
    out.write('\nnova-gpu above Nova\'s floor, per host (target: <= 3 us '
              'warm, <= 8 us cold; view <= 40 MiB at 10,000 hosts):\n')
    per_size = len(CONFIGS) + 2
    for first, floor_of in zip(range(0, len(rows), per_size), floors_us):
        for (order, _w), ours in zip(CONFIGS,
                                     rows[first:first + len(CONFIGS)]):
            floor_us = floor_of[order]
            out.write('  %6d hosts, %-13s: warm %+.1f us (%+.2f x floor), '
                      'cold %+.1f us (%+.2f x floor), floor %.1f us\n' % (
                          ours[1], order, ours[4] - floor_us,
                          (ours[4] - floor_us) / floor_us,
                          ours[3] - floor_us,
                          (ours[3] - floor_us) / floor_us, floor_us))
    return rows


def main(argv=None):
    global CLOCK
    parser = argparse.ArgumentParser(
        prog='python -m nova_gpu.bench.scheduler_cost',
        description=__doc__.splitlines()[0])
    parser.add_argument('hosts', nargs='*', type=_hosts,
                        default=[1000, 10000],
                        help='cloud sizes, in hosts (default: 1000 10000)')
    parser.add_argument('--cpu', action='store_true',
                        help='measure CPU time, not wall time (steadier '
                        'on a loaded machine)')
    parser.add_argument('--no-in-tree', action='store_true',
                        help='leave out Nova\'s in-tree PCI passthrough '
                        'rows (the slow part)')
    args = parser.parse_args(argv)
    if args.cpu:
        CLOCK = time.process_time
    run(tuple(args.hosts), in_tree=not args.no_in_tree)
    return 0


def _hosts(text):
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(
            'a number of hosts is a positive integer, not %r' % text)
    return value


if __name__ == '__main__':
    sys.exit(main())
