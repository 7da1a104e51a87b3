"""Reliability suite: faults, races and hostile input, as figures.

Each part lives in its own module, ``nova_gpu.bench.reliability_<part>``,
with a ``run(quick=False)`` that returns a list of ``Figure`` rows. This
module runs the parts that exist (or those named), prints one table,
keeps each part's latest rows in ``doc/source/results/reliability.json``
and writes the table of every part to
``doc/source/results/reliability.md``, with the time each part ran.
Every part is bounded in time and sends traffic only to 127.0.0.1.

Run with ``tox -e bench -- --only reliability``.
"""

import argparse
import dataclasses
import importlib
import json
import os
import sys
import time
import traceback

from nova_gpu import tables


PARTS = (
    ('specs', 'fuzzed flavor extra specs through the real API'),
    ('reports', 'fuzzed GPU reports into the scheduler view'),
    ('boots', 'concurrent boots to exhaustion, two schedulers racing'),
    ('schedulers', 'claim conflicts and early NoValidHost with 1, 2, 3 '
                   'and 5 schedulers, against stock Nova'),
    ('agent', 'agent SIGKILLs, RabbitMQ and libvirtd restarts'),
    ('nvml', 'NVML faults during discovery: GPUs lost or unreadable'),
    ('broker', 'scheduling and reporting with the broker up, stopped, '
               'hung'),
    ('flood', 'agent cycles and metrics under a connection flood'),
    ('multigpu', '1, 2, 4 and 8 devices per server on 8-GPU hosts, '
                 'every path'),
    ('health', 'GPU faults, resets, reboots and agent restarts: '
               'quarantines'),
    ('usage', 'usage for billing through report outages, exporter '
              'restarts and migrations'),
    ('idle', 'owners told of idle GPUs through exporter restarts, Nova '
             'outages, migrations and deletions'),
)
RESULTS = os.path.join(os.path.dirname(__file__), '..', '..', 'doc',
                       'source', 'results', 'reliability.md')
DATA_SUFFIX = '.json'


@dataclasses.dataclass
class Figure:
    """One measured figure and the bound it must meet."""

    part: str
    name: str
    value: object
    target: str
    ok: bool


def _run_part(part, quick):
    name = 'nova_gpu.bench.reliability_' + part
    try:
        module = importlib.import_module(name)
    except ImportError as e:
        if e.name == name:
            return [Figure(part, 'suite', 'missing', 'present', False)]
        raise
    start = time.perf_counter()
    try:
        rows = list(module.run(quick=quick))
    except Exception:
        traceback.print_exc()
        return [Figure(part, 'suite', 'raised', 'completes', False)]
    rows.append(Figure(part, 'wall time (s)',
                       round(time.perf_counter() - start, 1), '-', True))
    return rows


HEADER = ('part', 'figure', 'value', 'target', 'ok')


def _cells(rows):
    return [(r.part, r.name, r.value, r.target, 'yes' if r.ok else 'NO')
            for r in rows]


def table(rows):
    return tables.text(HEADER, _cells(rows))


def run(quick=False, parts=None, results=RESULTS):
    rows = []
    for part, what in PARTS:
        if parts and part not in parts:
            continue
        print('-- %s: %s' % (part, what), flush=True)
        found = _run_part(part, quick)
        print(table(found), flush=True)
        rows.extend(found)
    print(table(rows))
    if results:
        save(rows, results)
    return all(r.ok for r in rows)


def save(rows, results):
    """Merge ``rows`` into the kept results; rewrite the markdown table."""
    data_file = os.path.splitext(results)[0] + DATA_SUFFIX
    try:
        with open(data_file) as f:
            kept = json.load(f)
    except (OSError, ValueError):
        kept = {}
    when = time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())
    for part in dict.fromkeys(r.part for r in rows):
        kept[part] = {'measured': when,
                      'rows': [dataclasses.asdict(r) for r in rows
                               if r.part == part]}
    with open(data_file, 'w') as f:
        json.dump(kept, f, indent=1, sort_keys=True)
    with open(results, 'w') as f:
        f.write('# Reliability suite\n\n'
                'Printed by `tox -e bench -- --only reliability` '
                '(`python -m nova_gpu.bench.reliability [PART ...]`), '
                'on a 2-core machine; each part as last measured:\n\n')
        for part, _what in PARTS:
            if part in kept:
                f.write('- %s: %s\n' % (part, kept[part]['measured']))
        f.write('\n')
        every = [Figure(**r) for part, _what in PARTS if part in kept
                 for r in kept[part]['rows']]
        f.write(_markdown(every))


def _markdown(rows):
    return tables.markdown(HEADER, _cells(rows)) + '\n'


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog='python -m nova_gpu.bench.reliability',
        description='The reliability suite: %s.' % '; '.join(
            '%s, %s' % part for part in PARTS))
    # Not ``choices``: Python 3.11's argparse refuses an empty list then.
    parser.add_argument('parts', nargs='*', metavar='PART',
                        help='parts to run (default: all): %s'
                        % ', '.join(part for part, _what in PARTS))
    parser.add_argument('--quick', action='store_true',
                        help='fewer trials, for a smoke run')
    args = parser.parse_args(argv)
    unknown = [p for p in args.parts if p not in dict(PARTS)]
    if unknown:
        parser.error('no such part: %s (choose from %s)' % (
            ', '.join(unknown), ', '.join(dict(PARTS))))
    return 0 if run(quick=args.quick, parts=args.parts) else 1


def part_main(part, run_part, argv=None):
    """``python -m nova_gpu.bench.reliability_<part> [--quick]``: one
    part alone, its table printed, not saved; exit status 1 if a figure
    misses its bound.
    """
    parser = argparse.ArgumentParser(
        prog='python -m nova_gpu.bench.reliability_' + part,
        description=dict(PARTS)[part])
    parser.add_argument('--quick', action='store_true',
                        help='fewer trials, for a smoke run')
    rows = list(run_part(quick=parser.parse_args(argv).quick))
    print(table(rows))
    return 0 if all(r.ok for r in rows) else 1


if __name__ == '__main__':
    sys.exit(main())
