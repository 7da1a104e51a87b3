"""``nova-gpu-restore``: restore once (``nova_gpu.agent.restore``), then
reconcile.

Run by ``nova-gpu-restore.service`` (a oneshot ordered before
nova-compute) so that nova-compute, which takes the host's PCI devices
when it starts, finds the VFs. Exits 1 when something could not be made.
"""

# First: native threading, no eventlet (see nova_gpu.cmd).
from nova_gpu.cmd import native_threading  # noqa: F401,H306
import sys

from oslo_log import log as logging

from nova_gpu.agent import agent as agent_mod
from nova_gpu.agent import errors
from nova_gpu.agent import restore
from nova_gpu.agent import service

LOG = logging.getLogger('nova_gpu.agent.restore')


def main(argv=None):
    conf = service.prepare(sys.argv[1:] if argv is None else argv,
                           'nova-gpu-restore')
    agent = agent_mod.Agent(conf)
    try:
        result = restore.boot_restore(agent)
        try:
            agent.reconcile()  # restarts persistent mdevs, rolls back
        except errors.AgentError as e:
            LOG.warning('reconcile after restore failed: %s', e)
    finally:
        agent.close()
    LOG.info('restored %d MIG mode(s), VFs of %d PF(s), %d GPU layout(s) '
             '(dropped %d), %d VF vGPU type(s) (dropped %d); %d failed',
             len(result.mig_modes), len(result.vfs_enabled),
             len(result.restored), len(result.dropped),
             len(result.vf_types), len(result.vf_types_dropped),
             len(result.failed))
    return 1 if result.failed else 0


if __name__ == '__main__':
    sys.exit(main())
