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
from nova_gpu.agent import sriov as sriov_mod
from nova_gpu.agent import vf_types as vf_types_mod
from nova_gpu.core import exceptions

LOG = logging.getLogger(__name__)


@dataclasses.dataclass
class Result:
    # GPU layouts (by GPU address)
    restored: list = dataclasses.field(default_factory=list)
    dropped: list = dataclasses.field(default_factory=list)
    # every failure of any step, "<device>: <why>"
    failed: list = dataclasses.field(default_factory=list)
    mig_modes: list = dataclasses.field(default_factory=list)
    vfs_enabled: list = dataclasses.field(default_factory=list)
    vfs_dropped: list = dataclasses.field(default_factory=list)
    vf_types: list = dataclasses.field(default_factory=list)
    vf_types_dropped: list = dataclasses.field(default_factory=list)


def restore(carver, catalog, sriov=None, vf_types=None):
    """Restore MIG modes, VFs, layouts and VF types (see the module);
    a ``Result`` naming each device.

    ``sriov``: a ``sriov.SriovStore``; ``vf_types``: a
    ``vf_types.VfTypes`` (None: that step is skipped).
    """
    result = Result()
    manager = carver.manager
    nvml = manager.nvml
    has_nvml = nvml is not None and nvml.available
    if has_nvml:
        _mig_modes(carver, result)
    else:
        LOG.warning('no NVML: MIG modes and GPU layouts not restored')
    if sriov is not None and manager.sysfs is not None:
        enabled, dropped, failed = sriov_mod.restore_vfs(manager, sriov)
        result.vfs_enabled += enabled
        result.vfs_dropped += dropped
        result.failed += failed
    if has_nvml:
        _layouts(carver, catalog, result)
    if vf_types is not None and manager.sysfs is not None:
        _vf_types(manager, vf_types, result)
    return result


def _index_of(nvml, address, what, result):
    """NVML's index of the GPU at ``address``; None, logged, when NVML
    lists no GPU there; ``False``, logged and counted failed (``what`` is
    kept for the next restore), when NVML cannot tell or read it now.
    """
    try:
        index = nvml.index_of(address)
        if index is not None:
            nvml.mig_mode(index)  # a GPU NVML cannot read raises here
        return index
    except errors.AgentError as e:
        LOG.error('GPU %s cannot be read through NVML (%s): its %s is kept '
                  'for the next restore', address, e, what)
        result.failed.append('%s: %s' % (address, e))
        return False


def _mig_modes(carver, result):
    nvml = carver.manager.nvml
    for address, enabled in sorted(carver.mig_modes.load().items()):
        index = _index_of(nvml, address, 'MIG mode', result)
        if index is False:
            continue
        if index is None:
            LOG.warning('GPU %s is gone: its MIG mode is not set again',
                        address)
            continue
        try:
            if carver.manager.set_mig_mode(index, enabled, at_boot=True):
                result.mig_modes.append(address)
        except errors.AgentError as e:
            LOG.error('GPU %s: MIG mode not %s again: %s', address,
                      'enabled' if enabled else 'disabled', e)
            result.failed.append('%s: %s' % (address, e))


def _vf_types(manager, types, result):
    if manager.libvirt is None:
        LOG.warning('no libvirt: the VFs\' vGPU types are not set again '
                    '(nothing says which domains still use them)')
        return
    try:
        refs = manager.libvirt.domain_refs()
    except errors.AgentError as e:
        LOG.error('cannot list the domains (%s): the VFs\' vGPU types are '
                  'not set again', e)
        result.failed.append('vGPU types: %s' % e)
        return
    done, dropped, failed = vf_types_mod.restore_types(manager, types, refs)
    result.vf_types += done
    result.vf_types_dropped += dropped
    result.failed += failed


def _layouts(carver, catalog, result):
    nvml = carver.manager.nvml
    stored = carver.store.load()
    for address, layout in sorted(stored.items()):
        index = _index_of(nvml, address, 'layout', result)
        if index is False:
            continue
        if index is None:
            LOG.warning('GPU %s is gone: its layout %s is dropped',
                        address, layout.describe())
            carver.store.set(address, None)
            result.dropped.append(address)
            continue
        try:
            model = _model(nvml, index, catalog)
            carver.apply(index, model, layout, restoring=True)
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


def _model(nvml, index, catalog):
    gpus, unreadable = nvml.read_gpus()
    for gpu in unreadable:
        if gpu.index == index:
            raise errors.Unavailable('GPU %d cannot be read through NVML: '
                                     '%s' % (index, gpu.reason))
    for gpu in gpus:
        if gpu.index == index:
            model = catalog.model_for_nvml_name(gpu.name)
            if model is None:
                raise exceptions.InvalidRequest(
                    'GPU %d (%s) is not in the catalog' % (index, gpu.name))
            return model
    raise exceptions.InvalidRequest('NVML lists no GPU %d' % index)


def main(argv=None):
    """``nova-gpu-restore``: restore once (see the module), then
    reconcile.

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
        result = agent.restore_layouts()
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
