"""nova-gpu-sim: replay a node list and a task list with several policies.

Examples::

    nova-gpu-sim --trace-dir ../shared/traces/alibaba-gpu-v2023 \\
        --workload default --policies random,bestfit,fgd,nova,ours \\
        --seeds 42-51 --out-dir doc/source/results
    nova-gpu-sim --nodes nodes.csv --tasks tasks.csv --policies ours \\
        --seeds 42 --placements-out placements.csv
"""

import argparse
import multiprocessing
import os
import sys

from nova_gpu.core import exceptions
from nova_gpu import daemon
from nova_gpu.sim import policies as policies_mod
from nova_gpu.sim import replay as replay_mod
from nova_gpu.sim import report
from nova_gpu.sim import trace as trace_mod
from nova_gpu import tables

DEFAULT_TRACE_DIR = os.path.join('..', 'shared', 'traces',
                                 'alibaba-gpu-v2023')
# The Alibaba trace's lists are under 1 MiB each; a trace a hundred times
# larger still replays.
MAX_INPUT_BYTES = 256 * 2 ** 20


def parse_seeds(text):
    seeds = []
    for part in text.split(','):
        part = part.strip()
        if '-' in part:
            lo, hi = part.split('-', 1)
            seeds.extend(range(int(lo), int(hi) + 1))
        elif part:
            seeds.append(int(part))
    if not seeds:
        raise argparse.ArgumentTypeError('no seed in %r' % text)
    return seeds


def build_parser():
    p = argparse.ArgumentParser(
        prog='nova-gpu-sim',
        description='Replay a GPU task trace on a modelled cluster and '
        'report the GPU allocation ratio against arrived GPU request, '
        'following the FGD paper\'s protocol (tasks drawn with replacement '
        'up to --tune x capacity, shuffled by the seed, nothing leaves).')
    p.add_argument('--trace-dir', default=DEFAULT_TRACE_DIR,
                   help='directory of the Alibaba trace (openb_*.csv); '
                   'default %(default)s')
    p.add_argument('--workload', default='default',
                   help='task list in --trace-dir: openb_pod_list_<NAME>'
                   '.csv (default %(default)s)')
    p.add_argument('--nodes', help='node list CSV (default: '
                   'openb_node_list_gpu_node.csv in --trace-dir)')
    p.add_argument('--tasks', help='task list CSV (overrides --workload)')
    p.add_argument('--policies', default='random,bestfit,fgd,nova,ours',
                   help='comma-separated, of: %s (default %%(default)s)'
                   % ', '.join(policies_mod.POLICIES))
    p.add_argument('--seeds', type=parse_seeds, default=[42],
                   help='seeds, e.g. 42-51 or 42,43 (default 42)')
    p.add_argument('--tune', type=float, default=1.3,
                   help='GPU request drawn, as a multiple of the cluster '
                   'GPU capacity (default %(default)s)')
    p.add_argument('--expected', help='published results CSV to compare '
                   'with (default: fgd_expected_alloc.csv in --trace-dir '
                   'when present)')
    p.add_argument('--placements-out', metavar='FILE',
                   help='write every decision as CSV; with several runs, '
                   '-<policy>-<seed> is added before the extension')
    p.add_argument('--out-dir', help='write a markdown table and a PNG '
                   'plot of the mean curves here')
    p.add_argument('--audit', metavar='FILE',
                   help='check a placements CSV written by --placements-out '
                   'against --nodes/--tasks (or --workload): no GPU, CPU '
                   'or memory over-committed, gpu_spec kept, no needless '
                   'failure; prints the problems and exits 1 if any')
    p.add_argument('--jobs', type=int, default=min(2, os.cpu_count() or 1),
                   help='parallel runs (default %(default)s)')
    return p


def _run(args):
    nodes_path, tasks_path, policy, seed, tune = args
    nodes = trace_mod.load_nodes(nodes_path)
    tasks = trace_mod.load_tasks(tasks_path)
    work = trace_mod.workload(tasks, nodes.total_gpu_milli, tune, seed)
    result = replay_mod.replay(nodes, work, policy, seed,
                               typical_source=tasks)
    return result


def placements_path(base, policy, seed, single):
    if single:
        return base
    stem, ext = os.path.splitext(base)
    return '%s-%s-%d%s' % (stem, policy, seed, ext or '.csv')


def run_all(nodes_path, tasks_path, policies, seeds, tune, jobs=1,
            placements_out=None):
    """Replay every (policy, seed); returns {policy: [Result]}."""
    jobs_list = [(nodes_path, tasks_path, p, s, tune)
                 for p in policies for s in seeds]
    if jobs > 1 and len(jobs_list) > 1:
        with multiprocessing.get_context('fork').Pool(jobs) as pool:
            results = pool.map(_run, jobs_list, chunksize=1)
    else:
        results = [_run(j) for j in jobs_list]
    out = {p: [] for p in policies}
    for job, result in zip(jobs_list, results):
        out[job[2]].append(result)
        if placements_out:
            result.write_placements(placements_path(
                placements_out, job[2], job[3], len(jobs_list) == 1))
    return out


def summarise(by_policy, workload, expected, seeds, out=None):
    """Print means at 100% and 130% arrived beside published ones."""
    out = out or sys.stdout
    header = ['policy', 'runs', 'sim@100', 'published@100', 'sim@130',
              'published@130', 'failed', 'CPU s/run']
    rows = []
    for name, results in by_policy.items():
        curve = report.mean_curve([r.curve() for r in results])
        pub = report.published(expected, workload, name, seeds=seeds) or {}
        rows.append([name, len(results), curve.get(100, '-'),
                     pub.get(100, '-'), curve.get(130, '-'),
                     pub.get(130, '-'),
                     round(sum(r.failed for r in results) / len(results)),
                     '%.1f' % (sum(r.cpu_seconds for r in results)
                               / len(results))])
    print(tables.text(header, rows), file=out)
    return header, rows


def audit(nodes_path, tasks_path, placements):
    try:
        nodes = trace_mod.load_nodes(nodes_path)
        tasks = trace_mod.load_tasks(tasks_path)
        problems = replay_mod.audit(nodes, replay_mod.task_index(tasks),
                                    placements)
    except (exceptions.GpuError, OSError, KeyError) as e:
        print('nova-gpu-sim: error: %s' % e, file=sys.stderr)
        return 2
    for problem in problems:
        print(problem)
    print('%s: %s' % (placements, 'valid packing' if not problems
                      else '%d problem(s)' % len(problems)))
    return 1 if problems else 0


def check_inputs(files):
    """The one-line error for the first of ``files`` (``{what: path}``,
    None where not read) that ``daemon.check_file`` refuses, or None.
    """
    for what, path in files.items():
        if path is None:
            continue
        try:
            daemon.check_file(path, what, MAX_INPUT_BYTES)
        except daemon.ConfigError as e:
            return daemon.error_line('nova-gpu-sim', e)
    return None


def main(argv=None):
    args = build_parser().parse_args(argv)
    nodes_path = args.nodes or os.path.join(args.trace_dir,
                                            'openb_node_list_gpu_node.csv')
    tasks_path = args.tasks or os.path.join(
        args.trace_dir, 'openb_pod_list_%s.csv' % args.workload)
    expected = args.expected or os.path.join(args.trace_dir,
                                             'fgd_expected_alloc.csv')
    # Every file read is checked first: a FIFO would hang the replay,
    # /dev/zero fill the memory. The default published results are
    # optional (read only where present).
    problem = check_inputs({'node list': nodes_path,
                            'task list': tasks_path,
                            'placements file': args.audit,
                            'published results file': args.expected})
    if problem:
        print(problem, file=sys.stderr)
        return 2
    if args.audit:
        return audit(nodes_path, tasks_path, args.audit)
    policies = [p.strip() for p in args.policies.split(',') if p.strip()]
    try:
        for p in policies:
            policies_mod.make(p)
        by_policy = run_all(nodes_path, tasks_path, policies, args.seeds,
                            args.tune, args.jobs, args.placements_out)
    except (exceptions.GpuError, ValueError) as e:
        print('nova-gpu-sim: error: %s' % e, file=sys.stderr)
        return 2
    workload = args.workload if not args.tasks else os.path.splitext(
        os.path.basename(args.tasks))[0]
    print('workload %s, tune %s, seeds %s' % (workload, args.tune,
                                              ','.join(map(str, args.seeds))))
    header, rows = summarise(by_policy, workload, expected, args.seeds)
    if args.out_dir:
        os.makedirs(args.out_dir, exist_ok=True)
        curves = {p: report.mean_curve([r.curve() for r in rs])
                  for p, rs in by_policy.items()}
        md = os.path.join(args.out_dir, 'alloc_%s.md' % workload)
        with open(md, 'w') as f:
            f.write(tables.markdown(header, rows) + '\n')
        png = os.path.join(args.out_dir, 'alloc_%s.png' % workload)
        report.plot(curves, png, 'GPU allocation, %s trace, tune %s, '
                    '%d seed(s)' % (workload, args.tune, len(args.seeds)))
        print('wrote %s and %s' % (md, png))
    return 0


if __name__ == '__main__':
    sys.exit(main())
