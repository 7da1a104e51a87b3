"""Reliability: 1, 2, 4 and 8 devices per server on 8-GPU hosts, every path.

Part ``multigpu`` of ``nova_gpu.bench.reliability``. One cloud per path
(Nova + Placement in process, ``nova_gpu.tests.harness.cloud``), each with one
8-GPU host as Nova 34 shows it:

=============  ==============================================  ==========
path           host                                            providers
=============  ==============================================  ==========
PF mdev        8 x T4, T4-8C (2 per GPU)                       8
VF mdev        8 x H100-80GB, H100-20C (4 VFs per GPU)         32
MIG-backed     8 x A100-40GB in MIG mode, A100-2-10C (3 VFs)   24
vendor-VFIO    8 x H100-80GB, H100-20C VFs pooled per GPU      8
whole GPU      8 x H200-141GB passed through                   8
=============  ==============================================  ==========

For each path and each ``gpu:count`` of 1, 2, 4 and 8, a flavor with the
keys ``core.flavor.placement_extra_specs`` gives (set traits,
``core.gpu_sets``) boots one server through the API, which is then
deleted. Measured: the time of nova-scheduler's ``GET
/allocation_candidates`` (``SchedulerReportClient.
get_allocation_candidates``, timed inside the scheduler) and how many
candidates it returned, the boot's time to ACTIVE, and that its devices
are on distinct GPUs. Then 8-device servers are booted until one is
refused: every GPU's capacity must be used (the heads move to a free VF
after each boot, as the agent's cycle does), so the number of servers is
the vGPUs per GPU.

The same flavors without set traits (what stock Nova clouds and older
flavors ask) are timed for the counts that end in bounded time; the
others are shown as not run (doc/source/scheduler.rst, "Multi-GPU flavors
and Placement", has their measured minutes).

The table of every path and count is written to
``doc/source/results/multigpu.rst`` (included by doc/source/scheduler.rst).

Target: every set-trait query under ``QUERY_BOUND`` seconds, every boot
ACTIVE within ``BOOT_BOUND``, devices on distinct GPUs, the host filled.
"""

import collections
import os
import time

PART = 'multigpu'
COUNTS = (1, 2, 4, 8)
QUERY_BOUND = 2.0   # s per GET /allocation_candidates, one 8-GPU host
BOOT_BOUND = 30.0   # s from POST to ACTIVE
# Plain groups (no set traits) run only where they end in seconds: the
# products are providers**count (8**4 = 4096; 32**2 = 1024).
PLAIN_RUN = {'pf_mdev': (1, 2, 4), 'vf_mdev': (1, 2), 'mig': (1, 2),
             'vfio': (1, 2, 4), 'passthrough': (1, 2, 4)}


def hosts():
    """{path label: (GpuHost, flavor gpu: keys, vGPUs per GPU)}."""
    from nova_gpu.tests.harness import cloud
    return collections.OrderedDict([
        ('pf_mdev', (cloud.GpuHost('t4x8', 'T4', 'T4-8C', gpus=8),
                     {'gpu:profile': 'T4-8C'}, 2)),
        ('vf_mdev', (cloud.GpuHost('h100x8', 'H100-80GB', 'H100-20C',
                                   gpus=8),
                     {'gpu:profile': 'H100-20C'}, 4)),
        ('mig', (cloud.GpuHost('a100x8', 'A100-40GB', 'A100-2-10C', gpus=8,
                               mig=True),
                 {'gpu:profile': 'A100-2-10C'}, 3)),
        ('vfio', (cloud.GpuHost('h100vfio', 'H100-80GB', 'H100-20C',
                                gpus=8, path=cloud.VFIO),
                  {'gpu:profile': 'H100-20C', 'gpu:backend': 'vfio'}, 4)),
        ('passthrough', (cloud.GpuHost('h200x8', 'H200-141GB', gpus=8,
                                       path=cloud.PASSTHROUGH),
                         {'gpu:kind': 'whole'}, 1)),
    ])


class QueryTimer:
    """Times nova-scheduler's GET /allocation_candidates calls."""

    def __init__(self):
        self.calls = []  # (seconds, candidates)

    def install(self, case):
        import fixtures
        from nova.scheduler.client import report
        real = report.SchedulerReportClient.get_allocation_candidates
        timer = self

        def timed(self, *args, **kwargs):
            start = time.perf_counter()
            result = real(self, *args, **kwargs)
            alloc_reqs = result[0] if result and result[0] else []
            timer.calls.append((time.perf_counter() - start,
                                len(alloc_reqs)))
            return result
        case.useFixture(fixtures.MonkeyPatch(
            'nova.scheduler.client.report.SchedulerReportClient.'
            'get_allocation_candidates', timed))

    def last(self):
        return self.calls[-1] if self.calls else (None, None)


def start(spec):
    import fixtures
    from nova_gpu.tests.harness import cloud as cloud_mod
    attrs = {'HOSTS': (spec,), 'MAX_CONCURRENT_BUILDS': 1,
             'runTest': lambda self: None}
    case = type('MultiGpuCloud', (cloud_mod.GpuCloudTestCase,), attrs)()
    case.useFixture(fixtures.EnvironmentVariable('OS_TEST_TIMEOUT', '0'))
    try:
        case.setUp()
    except BaseException:
        case.doCleanups()
        raise
    return case


def _boot(case, timer, flavor_id, expect='ACTIVE'):
    """(server or None, query s, candidates, boot s)."""
    start = time.perf_counter()
    server = case.boot(flavor_id, expected_state=expect)
    elapsed = time.perf_counter() - start
    seconds, candidates = timer.last()
    case.sync_gpu_reports()
    return server, seconds, candidates, elapsed


def _settled(case, flavor_id, timeout=BOOT_BOUND * 2):
    """Boot; return the server once ACTIVE or ERROR."""
    from nova_gpu.tests.harness import cloud
    server = case.api.post_server({'server': {
        'name': 'fill', 'imageRef': cloud.IMAGE, 'flavorRef': flavor_id,
        'networks': 'none'}})
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        server = case.api.get_server(server['id'])
        if server['status'] in ('ACTIVE', 'ERROR'):
            return server
        time.sleep(0.1)
    raise RuntimeError('server %s still %s after %.0f s'
                       % (server['id'], server['status'], timeout))


def _distinct_gpus(case, server):
    gpus = [case.gpu_index(name) for name in case.gpu_providers_of(server)]
    return len(gpus) == len(set(gpus)), len(gpus)


def _flavor(case, keys, count, sets):
    from nova_gpu.scheduler import gpu_spec as flavor_mod
    specs = dict(keys, **{'gpu:count': str(count)})
    parsed = flavor_mod.parse(specs, vcpus=1, memory_mb=512)
    specs.update(flavor_mod.placement_extra_specs(parsed, sets=sets))
    return case._create_flavor(memory_mb=512, vcpu=1, extra_spec=specs)


def measure_path(label, spec, keys, per_gpu, progress=print):
    """The rows of one path's cloud."""
    import logging
    logging.disable(logging.DEBUG)
    case = start(spec)
    rows = []
    try:
        timer = QueryTimer()
        timer.install(case)
        for sets in (True, False):
            for count in COUNTS:
                if not sets and count not in PLAIN_RUN[label]:
                    rows.append((label, 'plain', count, None, None, None,
                                 None))
                    continue
                fid = _flavor(case, keys, count, sets)
                server, q, n, b = _boot(case, timer, fid)
                distinct, devices = _distinct_gpus(case, server)
                rows.append((label, 'sets' if sets else 'plain', count, q,
                             n, b, distinct and devices == count))
                progress('%s %s count=%d: query %.2f s, %d candidates, '
                         'ACTIVE in %.1f s' % (label, rows[-1][1], count,
                                               q, n, b))
                case._delete_server(server)
                case.sync_gpu_reports()
        # Fill the host with 8-device servers: one per vGPU of a GPU.
        fid = _flavor(case, keys, 8, True)
        fitted = 0
        while fitted <= per_gpu:
            server = _settled(case, fid)
            if server['status'] != 'ACTIVE':  # NoValidHost: the host is full
                break
            fitted += 1
            case.sync_gpu_reports()
        return rows, fitted
    finally:
        logging.disable(logging.INFO)
        case.doCleanups()
        logging.disable(logging.NOTSET)


RESULTS = os.path.join(os.path.dirname(__file__), '..', '..', 'doc',
                       'source', 'results', 'multigpu.rst')
LABELS = {'pf_mdev': 'PF mdev (8)', 'vf_mdev': 'VF mdev (32)',
          'mig': 'MIG-backed (24)', 'vfio': 'vendor-VFIO (8)',
          'passthrough': 'whole GPU (8)'}


def table_rst(rows, fitted):
    """The rst table doc/source/scheduler.rst includes."""
    cells = {(r[0], r[1], r[2]): r for r in rows}
    header = ['path (providers)'] + ['%d device%s' % (c, 's' * (c > 1))
                                     for c in COUNTS] + ['filled']
    lines = []
    for label in LABELS:
        if not any(key[0] == label for key in cells):
            continue
        for shape in ('sets', 'plain'):
            line = [LABELS[label] if shape == 'sets' else '', ]
            for count in COUNTS:
                r = cells.get((label, shape, count))
                line.append('%s: %.2f s / %d' % (shape, r[3], r[4])
                            if r and r[3] is not None else '%s: not run'
                            % shape)
            line.append('%d servers' % fitted[label] if shape == 'sets'
                        else '')
            lines.append(line)
    widths = [max(len(x) for x in col) for col in zip(header, *lines)]
    rule = '  '.join('=' * w for w in widths)

    def fmt(cols):
        return '  '.join(c.ljust(w) for c, w in zip(cols, widths)).rstrip()
    return '\n'.join([rule, fmt(header), rule] + [fmt(line)
                                                  for line in lines]
                     + [rule, ''])


def run(quick=False, progress=print):
    from nova_gpu.bench.reliability import Figure
    figures = []
    table = []
    filled = {}
    for label, (spec, keys, per_gpu) in hosts().items():
        rows, fitted = measure_path(label, spec, keys, per_gpu, progress)
        filled[label] = fitted
        table.extend(rows)
        for _l, shape, count, q, n, b, ok in rows:
            name = '%s, %d device(s), %s' % (label, count, shape)
            if q is None:
                figures.append(Figure(PART, name + ': query', 'not run',
                                      '-', True))
                continue
            bound = shape == 'sets'
            figures.append(Figure(
                PART, name + ': query s / candidates / boot s',
                '%.2f / %d / %.1f' % (q, n, b),
                '< %.0f s / - / < %.0f s' % (QUERY_BOUND, BOOT_BOUND)
                if bound else '-',
                (q < QUERY_BOUND and b < BOOT_BOUND) if bound else True))
            figures.append(Figure(PART, name + ': devices on distinct GPUs',
                                  'yes' if ok else 'NO', 'yes', bool(ok)))
        figures.append(Figure(
            PART, '%s: 8-device servers until full' % label, fitted,
            str(per_gpu), fitted == per_gpu))
    with open(RESULTS, 'w') as f:
        f.write(table_rst(table, filled))
    return figures


if __name__ == '__main__':
    import sys

    from nova_gpu.bench import reliability
    sys.exit(reliability.part_main(PART, run))
