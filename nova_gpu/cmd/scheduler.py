"""``nova-gpu-scheduler``: Nova's nova-scheduler with nova-gpu's manager.

Runs Nova's own ``nova.cmd.scheduler.main`` (its concurrency mode, its
arguments and configuration files, its workers) with
``nova_gpu.scheduler.manager.GpuSchedulerManager`` as the scheduler
service's manager. Use it in place of ``nova-scheduler``.
"""

# First, as Nova's nova/cmd/scheduler.py does: Nova chooses the mode.
from nova.cmd import scheduler as nova_scheduler  # noqa: H306
import sys

from nova_gpu.scheduler import manager


def main():
    manager.use_in_nova_scheduler()
    return nova_scheduler.main()


if __name__ == '__main__':
    sys.exit(main())
