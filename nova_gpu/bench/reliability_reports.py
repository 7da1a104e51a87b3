"""Reliability: fuzzed GPU reports into the scheduler's view.

Mutations of valid version 1 and version 2 reports (wrong types, missing
fields, huge, negative and non-finite numbers, bad GPU indices, unicode,
nested junk, future generations, whole-report junk, reports larger than
any real host, PCI addresses listed twice) go through the real
``listener.ReportEndpoint.info`` into a ``GpuView``, interleaved with valid
reports of other hosts that a clean view receives too. Measured:

* escapes: exceptions out of the endpoint (target 0);
* rankings that raised: every host of the fuzzed view ranked for several
  requests after each accepted fuzzed report and after the fuzz; what the
  filter must contain (target 0);
* corrupted hosts: after the fuzz, each fuzzed host gets one valid report
  (once ``[gpu_scheduler] generation_reset_after`` has passed, so that a
  fuzzed future generation cannot keep it out); its ranking must equal
  the clean view's (target 0); frozen hosts (the valid report not taken)
  are counted apart;
* other hosts changed: hosts that only ever got valid reports must be
  exactly as in the clean view (target 0);
* the slowest fuzzed report through the endpoint (target under 1 s: the
  size bounds refuse what cannot be real before reading it; the largest
  report the per-field bounds allowed took about 30 s).

Everything runs in process on a fake clock; no network.
"""

import copy
import logging
import random
import time

from oslo_config import cfg

from nova_gpu.bench import reliability
from nova_gpu.core import catalog as catalog_mod
from nova_gpu.core import fixtures
from nova_gpu.core import report as report_mod
from nova_gpu.scheduler import gpu_spec
from nova_gpu.scheduler import hosts as hosts_mod
from nova_gpu.scheduler import listener
from nova_gpu.scheduler import view as view_mod

CONF = cfg.CONF
PART = 'reports'
FULL = 10000
QUICK = 1000
VICTIMS = 24
OTHERS = 12

_JUNK = [
    None, {}, [], [0], [[[]]], {'a': [1, {'b': None}]}, '', ' ', 'x' * 1000,
    -1, 0, 1, 7, 2 ** 31, 2 ** 64, -2 ** 63, 1.5, float('inf'),
    float('-inf'), float('nan'), True, False, '١٦', '1_0', '0x10',
    '0000:zz:00.0', '0000:18:00.0\n', 'A100-10C', '3g.20gb', 'vgpu', 'mig',
    'whole', 'pf_mdev', 'pci_pool', '\u202e\u0000\udcff'.encode(
        'utf-8', 'surrogatepass').decode('utf-8', 'replace'),
    'ÄÖÜ✓' * 40, ['3g.20gb', 0, None], ['3g.20gb', 4], {'kind': 'whole'},
]
_YEAR_MS = 365 * 24 * 3600 * 1000


def _catalog():
    return catalog_mod.load_catalog()


def _specs(catalog):
    def spec(**specs):
        return gpu_spec.parse({k.replace('__', ':'): v
                               for k, v in specs.items()}, catalog,
                              vcpus=2, memory_mb=2048)
    return [
        spec(resources__VGPU='1'),
        spec(gpu__profile='A100-10C', resources__VGPU='1'),
        spec(gpu__mig='3g.20gb', gpu__model='A100-40GB',
             resources__VGPU='1'),
        spec(gpu__count='2', gpu__topology='numa', resources1__VGPU='1',
             resources2__VGPU='1', group_policy='isolate'),
        spec(gpu__kind='whole', pci_passthrough__alias='nvidia-gpu:1'),
        spec(gpu__kind='whole', gpu__rdma='true',
             pci_passthrough__alias='nvidia-gpu:1,rdma-vf:1'),
    ]


def _valid(catalog, name, i, generation):
    """A valid report of host ``name``: one of several shapes."""
    shape = i % 4
    if shape == 0:  # T4: PF mdev, version 1
        host = fixtures.pcie_host(name, catalog.model('T4'), gpus=2,
                                  vgpu_types=['T4-4C'])
        providers = {g.index: report_mod.mdev_provider_name(name, g.address)
                     for g in host.gpus}
        devices = {0: [{'kind': 'vgpu', 'detail': 'T4-4C'}] * (i % 3)}
        return report_mod.host_to_dict(host, name, generation, providers,
                                       devices, version=1)
    model = catalog.model('A100-40GB')
    host = fixtures.hgx_host(name, model, gpus=4,
                             vgpu_types=['A100-10C'] if shape == 1 else None,
                             mig=shape == 2)
    providers, devices = {}, {}
    for g in host.gpus:
        pf = g.address
        vf = pf[:-1] + '4'
        if shape == 1:  # SR-IOV + mdev on VFs
            providers[g.index] = [report_mod.provider_dict(
                report_mod.mdev_provider_name(name, vf), report_mod.VF_MDEV,
                vf, vgpu_type='A100-10C')]
        elif shape == 2:  # MIG-backed vGPU on a VF
            providers[g.index] = [report_mod.provider_dict(
                report_mod.mdev_provider_name(name, vf), report_mod.VF_MDEV,
                vf, vgpu_type='A100-3-20C', mig=('3g.20gb', 4))]
        else:  # vendor VFIO pool, or whole GPU in PCI in Placement
            rc = report_mod.pci_default_resource_class('10de', '20f1')
            kind = report_mod.PCI_POOL if g.index % 2 else (
                report_mod.PCI_DEVICE)
            providers[g.index] = [report_mod.provider_dict(
                report_mod.pci_provider_name(name, pf), kind, pf, rc,
                vgpu_type='A100-10C' if kind == report_mod.PCI_POOL
                else None,
                vfs=[vf] if kind == report_mod.PCI_POOL else ())]
    if shape == 1:
        # GPU 1 in mixed-size vGPU mode (core.mixed_size): 8 slots, an
        # A100-10C takes 2, an A100-5C 1.
        devices = {1: [{'kind': 'vgpu', 'detail': 'A100-10C'}] * (i % 4)
                   + [{'kind': 'vgpu', 'detail': 'A100-5C'}]}
    elif shape == 2:
        devices = {0: [{'kind': 'mig', 'detail': ['3g.20gb', 4,
                                                  'A100-3-20C']}]}
    else:
        devices = {2: [{'kind': 'whole'}]}
    data = report_mod.host_to_dict(host, name, generation, providers,
                                   devices, boot_id='boot-%s' % name)
    if shape == 1:
        data['gpus'][1]['mixed_size'] = True
        data['gpus'][1]['vgpu_types'] = None
    if shape == 3:
        # Whole GPUs on an HGX board in Shared NVSwitch mode: its
        # partitions, the one of the guest's GPU 2 active.
        data['partitions'] = _partitions()
        # GPUDirect RDMA: two PCIe switches, each with two GPUs and a
        # ConnectX-7 NIC (core.rdma).
        data['pcie'] = _pcie(name, len(data['gpus']))
    return data


def _pcie(name, gpus):
    switches = ['0000:%02x:00.0' % (0x11 + 0x10 * s) for s in range(2)]
    return {
        'gpus': [{'index': i, 'switch': switches[i * 2 // max(gpus, 1)],
                  'root': 'pci0000:10'} for i in range(gpus)],
        'switches': [{'id': sw, 'root': 'pci0000:10', 'acs_redirect': False,
                      'device': '1000:c030'} for sw in switches],
        'nics': [{'address': '0000:%02x:00.0' % (0x15 + 0x10 * s),
                  'switch': switches[s], 'root': 'pci0000:10', 'vfs': 8,
                  'vfs_used': s, 'device': '15b3:1021',
                  'provider': report_mod.pci_provider_name(
                      name, '0000:%02x:00.0' % (0x15 + 0x10 * s))}
                 for s in range(2)]}


def _bad_pcie(rng, data):
    """A ``pcie`` tree no real host has: each a fault the parser must
    name (``pcie...``).
    """
    tree = data['pcie']
    nics = tree.get('nics') or [{'address': '0000:15:00.0'}]
    nic = rng.choice(nics) if isinstance(nics, list) else nics
    if not isinstance(nic, dict):
        nic = {'address': '0000:15:00.0'}
        tree['nics'] = [nic]
    case = rng.randrange(8)
    if case == 0:    # more VFs held than the NIC has
        nic.update(vfs=2, vfs_used=3)
    elif case == 1:  # a switch the tree does not list
        nic['switch'] = '0000:ee:00.0'
    elif case == 2:  # a NIC twice
        tree['nics'] = [dict(nic), dict(nic)]
    elif case == 3:  # a GPU the report does not have, or twice
        tree['gpus'] = [{'index': rng.choice([0, 63])}] * 2
    elif case == 4:  # out of range, or not a count
        nic[rng.choice(['vfs', 'vfs_used'])] = rng.choice(
            [-1, 257, 2 ** 40, '8', 1.5, None, True])
    elif case == 5:  # more NICs than any host
        tree['nics'] = [dict(nic, address='0000:%02x:00.1' % i)
                        for i in range(65)]
    elif case == 6:  # not an address, an ID, a provider name
        key = rng.choice(['address', 'device', 'provider'])
        nic[key] = rng.choice(['', 'h' * 256, 7] + (
            [] if key == 'provider' else ['nic0', '15B3:1021']))
    else:
        data['pcie'] = rng.choice(['tree', 7, [], {'nics': []}])


def _partitions():
    return [{'id': 0, 'gpus': [0, 1, 2, 3], 'supported': True,
             'active': False},
            {'id': 1, 'gpus': [0, 1], 'supported': True, 'active': False},
            {'id': 2, 'gpus': [2, 3], 'supported': False, 'active': False}
            ] + [{'id': 3 + i, 'gpus': [i], 'supported': True,
                  'active': i == 2} for i in range(4)]


def _bad_partitions(rng, data):
    """A ``partitions`` list a real Fabric Manager never gives: each a
    fault the parser must name (``partitions...``).
    """
    parts = data['partitions']
    entry = rng.choice(parts) if parts else {'id': 9, 'gpus': [0]}
    if not isinstance(entry, dict):
        entry = {'id': 9, 'gpus': [0]}
    case = rng.randrange(9)
    if case == 0:    # two active partitions sharing a GPU
        parts += [{'id': 20, 'gpus': [0, 1], 'active': True},
                  {'id': 21, 'gpus': [1], 'active': True}]
    elif case == 1:  # a GPU the report does not have
        entry['gpus'] = [0, len(data.get('gpus') or ()) + 3]
    elif case == 2:  # an ID listed twice
        parts.append(dict(entry))
    elif case == 3:  # no GPUs
        entry['gpus'] = []
    elif case == 4:  # an ID out of Fabric Manager's range
        entry['id'] = rng.choice([-1, 64, 2 ** 40, '3', 1.0, None])
    elif case == 5:  # more partitions than Fabric Manager has
        data['partitions'] = [{'id': i % 64, 'gpus': [0]}
                              for i in range(65)]
    elif case == 6:  # a GPU twice in one partition
        entry['gpus'] = [0, 0]
    elif case == 7:
        entry[rng.choice(['supported', 'active'])] = rng.choice(
            ['yes', 1, None, []])
    else:
        data['partitions'] = rng.choice(['all', 7, {'id': 0}, [None]])


def _bad_mixed_size(rng, data):
    """A ``mixed_size`` no real agent reports: each a fault the parser
    must name (``gpus[i]...``): the mode on a model without it (T4) or
    with MIG on, not a boolean, or more vGPUs than its slots hold.
    """
    gpu = rng.choice([g for g in data['gpus'] if isinstance(g, dict)
                      and g.get('mixed_size') is True])
    case = rng.randrange(4)
    if case == 0:
        gpu['model'] = 'T4'
    elif case == 1:
        gpu['mig_enabled'] = True
    elif case == 2:
        gpu['mixed_size'] = rng.choice(['yes', 1, [], {}])
        return
    else:
        gpu['devices'] = [{'kind': 'vgpu', 'detail': 'A100-20C'}] * 3
        gpu['vgpu_types'] = None
    gpu['mixed_size'] = True


def _paths(node, prefix=()):
    """Every (container, key) in a JSON-like tree."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield node, key
            yield from _paths(value, prefix + (key,))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield node, index
            yield from _paths(value, prefix + (index,))


def _mutate(rng, data, unreal=None):
    """A mutated copy of ``data`` (1 to 3 mutations); ``unreal`` (a list)
    gets True appended when one made it what no real host reports.
    """
    data = copy.deepcopy(data)
    for _ in range(rng.randint(1, 3)):
        roll = rng.random()
        if roll < 0.05:
            return rng.choice([None, [], 'report', 42, float('nan'),
                               [data], {'version': 2}])
        if roll < 0.15 and isinstance(data, dict):
            gen = data.get('generation')
            gen = gen if isinstance(gen, int) else 1000
            data['generation'] = rng.choice([
                gen + _YEAR_MS, float('inf'), float('nan'), 2 ** 53,
                2 ** 53 - 1, -gen, str(gen), gen * 1.0, gen + 1])
            continue
        if not isinstance(data, dict):
            break
        if roll < 0.2:
            data['version'] = rng.choice([0, 1, 2, 3, '2', 2.0, True, None])
            continue
        if roll < 0.25 and isinstance(data.get('partitions'), list):
            _bad_partitions(rng, data)
            continue
        if roll < 0.27 and isinstance(data.get('pcie'), dict):
            _bad_pcie(rng, data)
            continue
        if roll < 0.29 and isinstance(data.get('gpus'), list) and any(
                isinstance(g, dict) and g.get('mixed_size') is True
                for g in data['gpus']):
            _bad_mixed_size(rng, data)
            continue
        if roll < 0.3 and isinstance(data.get('gpus'), list) and all(
                isinstance(g, dict) for g in data['gpus']) and data['gpus']:
            gpus = data['gpus']
            op = rng.randrange(6)
            if op >= 4 and _unreal(rng, data, op == 4):
                # The last mutation: another could undo it (or walk every
                # shared entry of a large one).
                if unreal is not None:
                    unreal.append(True)
                return data
            if op >= 4:
                continue
            if op == 0:
                gpus.append(copy.deepcopy(rng.choice(gpus)))
            elif op == 1:
                del gpus[rng.randrange(len(gpus))]
            elif op == 2:
                rng.choice(gpus)['index'] = rng.choice(
                    [-1, len(gpus), 99, '0', None, 1.0])
            else:
                rng.shuffle(gpus)
            continue
        paths = list(_paths(data))
        if not paths:
            break
        container, key = rng.choice(paths)
        op = rng.random()
        if op < 0.15 and isinstance(container, dict):
            del container[key]
        elif op < 0.25 and isinstance(container, dict):
            container[rng.choice(['junk', 'ÄÖ', '', key + '_'])] = (
                rng.choice(_JUNK))
        elif op < 0.55:
            # Plausible values: of the right type, possibly out of range.
            value = container[key]
            if isinstance(value, bool):
                container[key] = not value
            elif isinstance(value, int):
                container[key] = rng.choice([0, 1, 2, 3, 4, -1, 2 ** 40])
            elif isinstance(value, str):
                container[key] = rng.choice([
                    'sw0', '0000:18:00.0', 'A100-10C', 'A100-3-20C',
                    'A100-40GB', 'T4', 'h' * 255, value.upper()])
            elif isinstance(value, list) and value:
                rng.shuffle(value)
                value.append(copy.deepcopy(value[0]))
        elif op < 0.65:
            value = container[key]
            container[key] = (str(value) if not isinstance(value, str)
                              else [value])
        else:
            container[key] = copy.deepcopy(rng.choice(_JUNK))
    return data


def _unreal(rng, data, larger):
    """Make ``data`` what no real host reports: larger than any (every
    per-field bound met, the total not), or a PCI address listed twice.
    False when this report has no address to list twice.
    """
    gpus = data['gpus']
    if larger:
        # References, not copies: the report must be cheap to refuse,
        # and to build.
        gpu = rng.choice(gpus)
        listed = gpu.get('providers')
        listed = (listed if isinstance(listed, list) and listed
                  else [{'name': 'x'}])
        data['gpus'] = [dict(gpu, index=i, providers=listed * (
            report_mod.MAX_PROVIDERS // len(listed)))
            for i in range(report_mod.MAX_GPUS)]
        return True
    pools = [p for g in gpus if isinstance(g.get('providers'), list)
             for p in g['providers']
             if isinstance(p, dict) and isinstance(p.get('vfs'), list)
             and p['vfs']]
    if pools and rng.random() < 0.5:
        pool = rng.choice(pools)
        pool['vfs'] = pool['vfs'] + [rng.choice(pool['vfs'])]
        return True
    named = [g for g in gpus if g.get('address')]
    if len(gpus) < 2 or not named:
        return False
    first = rng.choice(named)
    second = rng.choice([g for g in gpus if g is not first])
    second['address'] = first['address']
    return True


def _outcome(view, entry, spec):
    """What ranking ``entry`` for ``spec`` gives: comparable across views."""
    ranking = view.ranking(entry, spec)
    return (tuple((r.gpus, r.key) for r in ranking.items), ranking.why)


def _state(entry):
    return (entry.generation, entry.host.snapshot(), entry.topology_key,
            sorted(entry.providers.items()))


class _Counter(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.count = 0

    def emit(self, record):
        self.count += 1


def run(quick=False, reports=None, seed=20261201):
    """Run the fuzz; return Figure rows."""
    n = reports or (QUICK if quick else FULL)
    rng = random.Random(seed)
    catalog = _catalog()
    specs = _specs(catalog)
    now = [1000.0]
    fuzzed = view_mod.GpuView(catalog, clock=lambda: now[0])
    clean = view_mod.GpuView(catalog, clock=lambda: now[0])
    endpoint = listener.ReportEndpoint(fuzzed)
    clean_endpoint = listener.ReportEndpoint(clean)
    victims = ['fuzz-%02d' % i for i in range(VICTIMS)]
    others = ['ok-%02d' % i for i in range(OTHERS)]
    generation = {name: 1000 + i for i, name in enumerate(victims + others)}

    def valid(name):
        generation[name] += 1
        i = (victims + others).index(name)
        return _valid(catalog, name, i, generation[name])

    for name in victims + others:
        report = valid(name)
        endpoint.info({}, 'nova-gpu-agent.' + name, report_mod.EVENT_TYPE,
                      report, {})
        clean_endpoint.info({}, 'nova-gpu-agent.' + name,
                            report_mod.EVENT_TYPE, report, {})
    bases = {name: valid(name) for name in victims}

    escapes = raised = accepted = unreal = unreal_accepted = 0
    examples = []
    counter = _Counter()
    log = logging.getLogger(listener.__name__)
    # The view's WARNINGs (generations reset, in its hosts) are expected
    # here: muted.
    quiet = [logging.getLogger(m.__name__) for m in (view_mod, hosts_mod)]
    saved = [(x, x.propagate, x.level) for x in [log] + quiet]
    log.addHandler(counter)
    log.setLevel(logging.WARNING)
    for x in quiet:
        x.setLevel(logging.ERROR)
    for x in [log] + quiet:
        x.propagate = False
    slowest = 0.0
    try:
        for k in range(n):
            victim = victims[k % VICTIMS]
            marks = []
            payload = _mutate(rng, bases[victim], marks)
            unreal += bool(marks)
            before = fuzzed.get(victim)
            start = time.perf_counter()
            try:
                endpoint.info({}, 'nova-gpu-agent.' + victim,
                              report_mod.EVENT_TYPE, payload, {})
            except Exception as e:
                escapes += 1
                examples.append('escape: %s: %s' % (type(e).__name__, e))
            slowest = max(slowest, time.perf_counter() - start)
            after = fuzzed.get(victim)
            if after is not before:
                accepted += 1
                unreal_accepted += bool(marks)
                if marks:
                    examples.append('unreal accepted: %s' % victim)
                raised += _rank_all(fuzzed, after, specs, examples)
            if k % 5 == 0:
                name = others[(k // 5) % OTHERS]
                report = valid(name)
                for ep in (endpoint, clean_endpoint):
                    ep.info({}, 'nova-gpu-agent.' + name,
                            report_mod.EVENT_TYPE, report, {})
            now[0] += 0.01
        # The filter-containment check: every host, every request.
        for name in victims + others:
            raised += _rank_all(fuzzed, fuzzed.get(name), specs, examples)
        changed = sum(1 for name in others
                      if _state(fuzzed.get(name)) != _state(clean.get(name))
                      or _outcomes(fuzzed, name, specs)
                      != _outcomes(clean, name, specs))
        # Recovery: one valid report per fuzzed host, after the bound.
        now[0] += CONF.gpu_scheduler.generation_reset_after + 1
        frozen = corrupted = 0
        for name in victims:
            # The agent's next cycle but one: a fuzzed report may have
            # taken the next generation (``gen + 1``) with other content,
            # and an agent never sends two reports of one generation (the
            # rule takes the second for the outbox's resend: ignored).
            generation[name] += 1
            report = valid(name)
            for ep in (endpoint, clean_endpoint):
                ep.info({}, 'nova-gpu-agent.' + name, report_mod.EVENT_TYPE,
                        report, {})
            if fuzzed.get(name).generation != generation[name]:
                frozen += 1
                examples.append('frozen: %s' % name)
            try:
                if (_state(fuzzed.get(name)) != _state(clean.get(name))
                        or _outcomes(fuzzed, name, specs)
                        != _outcomes(clean, name, specs)):
                    corrupted += 1
                    examples.append('corrupted: %s' % name)
            except Exception as e:
                corrupted += 1
                examples.append('corrupted: %s: %s' % (name, e))
    finally:
        log.removeHandler(counter)
        for x, propagate, level in saved:
            x.propagate = propagate
            x.setLevel(level)
    for line in examples[:10]:
        print('  ' + line)
    fig = reliability.Figure
    return [
        fig(PART, 'fuzzed reports (v1 and v2 mutations)', n, '-', True),
        fig(PART, 'accepted as valid after mutation', accepted, '-', True),
        fig(PART, 'dropped with a WARNING', counter.count, '-', True),
        fig(PART, 'older than the view by their header (ignored)',
            n - accepted - counter.count, '>= 0',
            n - accepted - counter.count >= 0),
        fig(PART, 'escapes from ReportEndpoint.info', escapes, '0',
            escapes == 0),
        fig(PART, 'rankings that raised (filter containment)', raised, '0',
            raised == 0),
        fig(PART, 'corrupted hosts', corrupted, '0', corrupted == 0),
        fig(PART, 'frozen hosts after a valid report', frozen, '0',
            frozen == 0),
        fig(PART, 'other hosts changed', changed, '0', changed == 0),
        fig(PART, 'larger than any real host or an address twice', unreal,
            '-', True),
        fig(PART, 'of them accepted', unreal_accepted, '0',
            unreal_accepted == 0),
        fig(PART, 'slowest fuzzed report (ms)', round(slowest * 1000, 1),
            '< 1000', slowest < 1.0),
    ]


def _outcomes(view, name, specs):
    entry = view.get(name)
    return [_outcome(view, entry, spec) for spec in specs]


def _rank_all(view, entry, specs, examples):
    """Rank ``entry`` for every spec; return how many raised."""
    raised = 0
    for spec in specs:
        try:
            ranking = view.ranking(entry, spec)
            for gpus in ((0,), (0, 1), (len(entry.host.gpus) - 1,)):
                if all(0 <= g < len(entry.host.gpus) for g in gpus):
                    view.evaluate(entry, spec, ranking, gpus)
        except Exception as e:
            raised += 1
            examples.append('raised: %s on %s: %s: %s' % (
                entry.nodename, spec.key if hasattr(spec, 'key') else spec,
                type(e).__name__, e))
    return raised


if __name__ == '__main__':
    import sys
    sys.exit(reliability.part_main(PART, run))
