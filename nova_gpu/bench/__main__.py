"""Print every benchmark table: the simulator's, then the others'.

Each module is imported only when its turn comes, so a missing or broken
one is reported on its own line and the others still run.
"""

import argparse
import importlib
import sys
import traceback

MODULES = ('sim_bench', 'scheduler_cost', 'agent_bench', 'core_bench',
           'reliability', 'carving_bench', 'economics', 'select_destinations')


def main(argv=None):
    parser = argparse.ArgumentParser(prog='python -m nova_gpu.bench')
    parser.add_argument('--only', help='comma-separated subset of: %s'
                        % ', '.join(MODULES))
    parser.add_argument('--results-dir', help='where the simulator writes '
                        'its markdown tables and PNG plot')
    parser.add_argument('--quick', action='store_true',
                        help='fewer seeds (simulator), for a smoke run')
    args = parser.parse_args(argv)
    wanted = args.only.split(',') if args.only else MODULES
    unknown = [name for name in wanted if name not in MODULES]
    if unknown:
        parser.error('no such benchmark: %s (choose from %s)' % (
            ', '.join(unknown), ', '.join(MODULES)))
    status = 0
    for name in wanted:
        print('=' * 72)
        print('nova_gpu.bench.%s' % name)
        print('=' * 72, flush=True)
        full = 'nova_gpu.bench.' + name
        try:
            module = importlib.import_module(full)
        except ImportError as e:
            if e.name == full:
                print('SKIPPED: %s does not exist (yet)' % full)
                continue
            traceback.print_exc()
            print('FAILED: %s cannot be imported: %s' % (full, e))
            status = 1
            continue
        try:
            if name == 'sim_bench':
                ok = module.run(results_dir=args.results_dir,
                                quick=args.quick)
            elif name == 'carving_bench':
                ok = module.run(results_dir=args.results_dir,
                                hosts=(7,) if args.quick else module.HOSTS)
            elif name in ('reliability', 'economics'):
                ok = module.run(quick=args.quick)
            else:
                ok = module.run()
            if ok is False:
                status = 1
        except Exception:
            traceback.print_exc()
            print('FAILED: nova_gpu.bench.%s raised' % name)
            status = 1
        sys.stdout.flush()
    return status


if __name__ == '__main__':
    sys.exit(main())
