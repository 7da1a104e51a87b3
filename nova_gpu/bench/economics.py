"""Power benchmark: idle hosts per policy, and what consolidation saves.

Replays the Alibaba default task list with departures
(``nova_gpu.sim.power``: each task's own lifetime, arrivals at an offered
load of half the GPU capacity, the list three times in a row) with each
simulator policy, without and with consolidation by the move planner,
and prints one table; then, at an offered load of 90%, the large (4- and
8-GPU) tasks refused without and with defragmentation by the planner;
then, at an offered load of 120% with 30% of the GPU tasks spot (the
list ten times in a row, so that the cluster fills), the on-demand tasks
refused and the spot tasks evicted for them, with the planner's
evictions and without (the baseline).
Needs the trace (``../shared/traces/alibaba-gpu-v2023`` or
``$NOVA_GPU_TRACE_DIR``); without it, says so.

    python -m nova_gpu.bench.economics [--quick] [--only spot]
"""

import argparse
import multiprocessing
import os
import sys

from nova_gpu.sim import power
from nova_gpu.sim import trace as trace_mod
from nova_gpu import tables

REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
TRACE_DIR = os.environ.get('NOVA_GPU_TRACE_DIR') or os.path.join(
    os.path.dirname(REPO), 'shared', 'traces', 'alibaba-gpu-v2023')
POLICIES = ('random', 'bestfit', 'fgd', 'nova', 'ours')
LOAD = 0.5
DEFRAG_LOAD = 0.9  # near full: where large requests are refused
SPOT_LOAD = 1.2  # over full: spot capacity is taken back
SPOT_REPEAT = 10  # the cluster fills only after a few passes
SPOT_SHARE = 0.3
SPOT_POLICIES = ('ours',)
TABLES = ('power', 'defrag', 'spot')
REPEAT = 3
ROUNDS = 50  # consolidation rounds over the replay


def _workload(repeat, load=None):
    nodes = trace_mod.load_nodes(os.path.join(
        TRACE_DIR, 'openb_node_list_gpu_node.csv'))
    path = os.path.join(TRACE_DIR, 'openb_pod_list_default.csv')
    tasks = trace_mod.load_tasks(path)
    created, deleted = power.load_lifetimes(path, tasks)
    tasks, arrive, leave = power.at_load(
        tasks, created, deleted, nodes.total_gpu_milli, load or LOAD,
        repeat=repeat, seed=42)
    return nodes, tasks, arrive, leave


def _one(args):
    policy, consolidate, repeat = args
    nodes, tasks, arrive, leave = _workload(repeat)
    return power.replay_power(nodes, tasks, arrive, leave, policy,
                              consolidate=consolidate,
                              period_s=float(arrive.max()) / ROUNDS)


def _defrag(args):
    policy, defrag = args
    nodes, tasks, arrive, leave = _workload(1, DEFRAG_LOAD)
    return power.replay_power(nodes, tasks, arrive, leave, policy,
                              defrag=defrag, samples=0)


def _spot(args):
    policy, evict, repeat = args
    nodes, tasks, arrive, leave = _workload(repeat, SPOT_LOAD)
    return power.replay_power(nodes, tasks, arrive, leave, policy,
                              spot=SPOT_SHARE, evict=evict, samples=0)


def spot_table(pool, policies, repeat):
    """On-demand refusals and spot evictions, with and without eviction."""
    results = pool.map(_spot, [(p, e, repeat) for p in policies
                               for e in (False, True)])
    table = tables.text(
        ('policy', 'evict spot', 'on-demand refused',
         'refused, room by eviction', 'spot evicted', 'served by eviction',
         'evictions per served', 'spot refused', 'on-demand GPU-h',
         'spot GPU-h', 'seconds'),
        [(r.policy, 'yes' if r.evict else 'no', r.od_refused,
          r.od_refused_spot_left, r.evictions, r.by_eviction,
          round(r.evictions_per_served, 2), r.spot_refused,
          round(r.od_gpu_hours), round(r.spot_gpu_hours),
          round(r.seconds, 1)) for r in results])
    print('Spot tasks: %.0f%% of the GPU tasks, offered load %.0f%%, '
          'default task list x%d; "refused, room by eviction": on-demand '
          'tasks refused although evicting the spot tasks of one host '
          'would have made room; GPU-hours up to the last arrival'
          % (SPOT_SHARE * 100, SPOT_LOAD * 100, repeat))
    print(table)


def defrag_table(pool, policies):
    """Large (4- and 8-GPU) tasks refused, without and with defrag."""
    results = pool.map(_defrag, [(p, d) for p in policies
                                 for d in (False, True)])
    table = tables.text(
        ('policy', 'defrag', 'placed', 'refused', 'large refused',
         'placed by moves', 'migrations', 'GiB moved', 'seconds'),
        [(r.policy, 'yes' if r.defrag else 'no', r.placed, r.refused,
          r.large_refused, r.defragmented, r.migrations,
          round(r.memory_moved_gib, 1), round(r.seconds, 1))
         for r in results])
    print('Large requests with defragmentation by live migration: offered '
          'load %.0f%%, default task list once' % (DEFRAG_LOAD * 100))
    print(table)


def run(quick=False, only=TABLES):
    if not os.path.isdir(TRACE_DIR):
        print('SKIPPED: no trace at %s' % TRACE_DIR)
        return None
    repeat = 1 if quick else REPEAT
    policies = ('bestfit', 'nova') if quick else POLICIES
    jobs = [(p, c, repeat) for p in policies for c in (False, True)]
    pool = multiprocessing.Pool(min(2, os.cpu_count() or 1))
    try:
        if 'power' in only:
            power_table(pool.map(_one, jobs), repeat)
        if 'defrag' in only:
            defrag_table(pool, policies)
        if 'spot' in only:
            spot_table(pool, ('bestfit',) if quick else SPOT_POLICIES,
                       1 if quick else SPOT_REPEAT)
    finally:
        pool.close()
        pool.join()
    return True


def power_table(results, repeat):
    """Idle hosts and GPU-hours, without and with consolidation."""
    rows = []
    plain = {}
    for r in results:
        if not r.consolidate:
            plain[r.policy] = r.idle_gpu_hours
        saved = r.idle_gpu_hours - plain.get(r.policy, r.idle_gpu_hours)
        rows.append((r.policy, 'yes' if r.consolidate else 'no',
                     r.placed, r.refused, round(r.idle_gpu_hours),
                     round(r.mean_idle_hosts, 1), r.drains, r.migrations,
                     round(r.memory_moved_gib, 1),
                     round(saved) if r.consolidate else '',
                     round(r.seconds, 1)))
    table = tables.text(
        ('policy', 'consolidate', 'placed', 'refused', 'idle GPU-h',
         'mean idle hosts', 'drains', 'migrations', 'GiB moved',
         'idle GPU-h saved', 'seconds'), rows)
    hours = results[0].samples[-1][0] if results[0].samples else 0
    print('Replay with departures: %d hosts, %d GPUs, offered load %.0f%%, '
          'default task list x%d, %.1f h of arrivals'
          % (results[0].hosts, results[0].gpus, LOAD * 100, repeat, hours))
    print(table)


def main(argv=None):
    parser = argparse.ArgumentParser(prog='python -m nova_gpu.bench.'
                                     'economics')
    parser.add_argument('--quick', action='store_true',
                        help='two policies, the task list once')
    parser.add_argument('--only', action='append', choices=TABLES,
                        help='print only this table (repeatable; '
                             'default: all)')
    args = parser.parse_args(argv)
    return 0 if run(quick=args.quick,
                    only=args.only or TABLES) is not False else 1


if __name__ == '__main__':
    sys.exit(main())
