"""Make the carved layouts again after a reboot.

A reboot loses every GPU instance (and VF type) the agent made. At start,
before nova-compute (``etc/systemd/nova-gpu-agent.service`` is ordered
``Before=nova-compute.service``), the agent re-applies each GPU's layout
from ``layouts.json`` (``nova_gpu.agent.carver.LayoutStore``). A GPU that
is gone or whose model changed is dropped from the store with a warning;
one that fails stays in the store and is retried at the next start. The
reconciler restarts persistent mdevs as before.
"""

import dataclasses
import sys

from oslo_log import log as logging

from nova_gpu.agent import errors
from nova_gpu.core import exceptions

LOG = logging.getLogger(__name__)


@dataclasses.dataclass
class Result:
    restored: list = dataclasses.field(default_factory=list)
    dropped: list = dataclasses.field(default_factory=list)
    failed: list = dataclasses.field(default_factory=list)


def restore(carver, catalog):
    """Re-apply every stored layout; a ``Result`` naming each GPU."""
    result = Result()
    nvml = carver.manager.nvml
    if nvml is None or not nvml.available:
        LOG.warning('no NVML: GPU layouts not restored')
        return result
    stored = carver.store.load()
    for address, layout in sorted(stored.items()):
        index = nvml.index_of(address)
        if index is None:
            LOG.warning('GPU %s is gone: its layout %s is dropped',
                        address, layout.describe())
            carver.store.set(address, None)
            result.dropped.append(address)
            continue
        try:
            model = _model(nvml, index, catalog)
            carver.apply(index, model, layout)
        except exceptions.InvalidRequest as e:
            LOG.warning('GPU %s: layout %s no longer fits (%s): dropped',
                        address, layout.describe(), e)
            carver.store.set(address, None)
            result.dropped.append(address)
        except (errors.AgentError, exceptions.GpuError) as e:
            LOG.error('GPU %s: layout %s not restored: %s', address,
                      layout.describe(), e)
            result.failed.append('%s: %s' % (address, e))
        else:
            result.restored.append(address)
    return result


def _model(nvml, index, catalog):
    for gpu in nvml.gpus():
        if gpu.index == index:
            model = catalog.model_for_nvml_name(gpu.name)
            if model is None:
                raise exceptions.InvalidRequest(
                    'GPU %d (%s) is not in the catalog' % (index, gpu.name))
            return model
    raise exceptions.InvalidRequest('NVML lists no GPU %d' % index)


def main(argv=None):
    """``nova-gpu-restore``: restore the layouts once, then reconcile.

    Run by ``nova-gpu-restore.service`` (a oneshot ordered before
    nova-compute) so that nova-compute's first update sees the devices.
    Exits 1 when a layout could not be made.
    """
    from nova_gpu.agent import agent as agent_mod
    from nova_gpu.agent import service

    conf = service.prepare(sys.argv[1:] if argv is None else argv,
                           'nova-gpu-restore')
    agent = agent_mod.Agent(conf)
    try:
        result = restore(agent.carver, agent.catalog)
        try:
            agent.reconcile()  # restarts persistent mdevs, rolls back
        except errors.AgentError as e:
            LOG.warning('reconcile after restore failed: %s', e)
    finally:
        agent.close()
    LOG.info('restored %d GPU layout(s), dropped %d, failed %d',
             len(result.restored), len(result.dropped), len(result.failed))
    return 1 if result.failed else 0


if __name__ == '__main__':
    sys.exit(main())
