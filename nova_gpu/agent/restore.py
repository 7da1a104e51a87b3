"""Make the carved layouts again after a reboot.

A reboot loses every GPU instance (and VF type) the agent made.
``nova-gpu-restore`` (``etc/systemd/nova-gpu-restore.service``, a oneshot
ordered ``Before=nova-compute.service``) re-applies, in order, the MIG
modes the agent set, the SR-IOV VFs of each PF (``nova_gpu.agent.sriov``),
each GPU's layout from ``layouts.json``
(``nova_gpu.agent.carver.LayoutStore``) and the vGPU types of the VFs a
defined domain references. A GPU that is gone or whose model changed is
dropped from the store with a warning; one that fails stays in the store
and is retried at the next start. The reconciler restarts persistent
mdevs as before.

The agent runs the same restore at its start (``Agent.restore_layouts``),
but without the VFs (``enable_vfs`` False, the default): it may start, or
restart, while nova-compute runs, and nova-compute takes the host's PCI
devices only when it starts (Nova 34's
``ResourceTracker._setup_pci_tracker``, nova/compute/resource_tracker.py:
the driver's ``pci_passthrough_devices`` reach the PCI tracker only when
the tracker is created). VFs it enabled then would be on the host but not
in Nova until a restart; it names the PFs short of their VFs instead
(``RestoreResult.vfs_not_enabled``, a WARNING), and ``nova-gpu-restore`` then a
nova-compute restart bring them back.
"""

import dataclasses

from oslo_log import log as logging

from nova_gpu.agent import errors
from nova_gpu.agent import sriov as sriov_mod
from nova_gpu.agent import vf_types as vf_types_mod
from nova_gpu.core import exceptions

LOG = logging.getLogger(__name__)


@dataclasses.dataclass
class RestoreResult:
    # GPU layouts (by GPU address)
    restored: list = dataclasses.field(default_factory=list)
    dropped: list = dataclasses.field(default_factory=list)
    # every failure of any step, "<device>: <why>"
    failed: list = dataclasses.field(default_factory=list)
    mig_modes: list = dataclasses.field(default_factory=list)
    vfs_enabled: list = dataclasses.field(default_factory=list)
    vfs_dropped: list = dataclasses.field(default_factory=list)
    # PFs short of their recorded VFs that were left alone (the agent at
    # its start): "<PF>: <why>", also in ``failed``
    vfs_not_enabled: list = dataclasses.field(default_factory=list)
    vf_types: list = dataclasses.field(default_factory=list)
    vf_types_dropped: list = dataclasses.field(default_factory=list)


def restore(carver, catalog, sriov=None, vf_types=None, enable_vfs=False):
    """Restore MIG modes, VFs, layouts and VF types (see the module);
    a ``RestoreResult`` naming each device.

    ``sriov``: a ``sriov.SriovStore``; ``vf_types``: a
    ``vf_types.VfTypes`` (None: that step is skipped). ``enable_vfs``:
    write ``sriov_numvfs`` for the recorded VFs, which only
    ``nova-gpu-restore`` does (before nova-compute starts); without it the
    PFs short of their VFs are named in ``vfs_not_enabled`` and
    ``failed``, and nothing changes the host's set of PCI devices.
    """
    result = RestoreResult()
    manager = carver.manager
    nvml = manager.nvml
    has_nvml = nvml is not None and nvml.available
    if has_nvml:
        _mig_modes(carver, result)
    else:
        LOG.warning('no NVML: MIG modes and GPU layouts not restored')
    if sriov is not None and manager.sysfs is not None:
        if enable_vfs:
            enabled, dropped, failed = sriov_mod.restore_vfs(manager, sriov)
            result.vfs_enabled += enabled
        else:
            failed, dropped = sriov_mod.missing_vfs(manager, sriov)
            result.vfs_not_enabled += failed
        result.vfs_dropped += dropped
        result.failed += failed
    if has_nvml:
        _layouts(carver, catalog, result)
    if vf_types is not None and manager.sysfs is not None:
        _vf_types(manager, vf_types, result)
    return result


def boot_restore(agent):
    """What ``nova-gpu-restore`` makes: what the agent's start makes
    (``Agent.restore_layouts``), and the VFs.

    What a killed operation (a killed restore too) left is rolled back
    first, so that the reconcile after the restore does not undo what the
    restore makes.
    """
    try:
        agent.reconciler.roll_back()
    except errors.AgentError as e:
        LOG.warning('rolling back cut-short operations before the '
                    'restore failed (%s); the reconcile retries', e)
    return restore(agent.carver, agent.catalog, sriov=agent.sriov,
                   vf_types=agent.vf_types, enable_vfs=True)


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
