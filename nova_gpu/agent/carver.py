"""Carry out the layout planner's decisions on this host.

The planner (``nova_gpu.core.layout``) says what each idle GPU should be.
This module makes it so, through the device manager (journalled steps):

* a MIG layout: GPU instances (each with its compute instance) destroyed
  and created through NVML until the GPU holds exactly the layout's
  instances; nothing is done when any instance to remove is in use (or
  NVML cannot tell), and a failed create rolls the GPU back to what it
  held;
* a time-sliced type: nothing to make ahead. The VF's type is written just
  in time (``doc/source/carving.rst``); idle VFs typed otherwise are
  cleared for it; the layout is recorded so the scheduler's view and the
  restore at boot know it;
* passthrough: idle typed VFs cleared, recorded; the PF stays as it is
  (binding is done at attach by libvirt's managed hostdev).

No layout changes the GPU's set of VFs (``sriov_numvfs``): nova-compute
takes the host's PCI devices only when it starts (Nova 34's
``ResourceTracker._setup_pci_tracker``), so a VF enabled or disabled
here would not be seen (or would stay tracked) until it restarts. The VFs
are set before nova-compute starts, by ``nova-gpu-restore``
(``nova_gpu.agent.sriov``). A passthrough layout on a GPU whose VFs are
Nova's PCI devices therefore does not make it a whole-GPU device: Nova
34 takes a GPU in ``[pci] device_spec`` as its PF or as its VFs, never
both (``PlacementPciDependentDeviceException``), fixed at its start.

What was carved is kept in ``layouts.json`` in the agent's state
directory (atomic replace, fsync'd), so that ``nova_gpu.agent.restore``
can make it again after a reboot.

MIG mode: with ``switch_mig_mode`` (``[gpu_agent] carve_switch_mig_mode``)
an idle GPU is switched into MIG mode for a MIG layout, and out of it for
a time-sliced or passthrough one (its idle GPU instances removed first),
through the device manager's journalled ``set_mig_mode``; the mode set is
kept in ``mig_mode.json`` for the restore at boot. Without it a GPU keeps
its mode and a layout of the other mode is refused. A switch NVML could
not activate (pending a GPU reset) raises ResetRequired: the layout is
not recorded, the pending mode is.
"""

import re

from oslo_log import log as logging

from nova_gpu.agent import errors
from nova_gpu.agent import jsonstore
from nova_gpu.core import exceptions
from nova_gpu.core import layout as layout_mod

LOG = logging.getLogger(__name__)
STORE_NAME = 'layouts.json'
MIG_MODE_STORE = 'mig_mode.json'
STORE_VERSION = 1
_VENDOR_PREFIX = re.compile(r'^(GRID|NVIDIA)\s+', re.I)


def layout_to_dict(layout):
    return {'kind': layout.kind, 'vgpu_type': layout.vgpu_type,
            'instances': [list(i) for i in layout.instances]}


def layout_from_dict(data):
    try:
        return layout_mod.Layout(
            data['kind'], data.get('vgpu_type'),
            tuple(tuple(i) for i in data.get('instances') or ()))
    except (KeyError, TypeError, ValueError) as e:
        raise exceptions.InvalidRequest('bad layout record %r: %s'
                                        % (data, e)) from None


class LayoutStore:
    """The layout of each carved GPU, by PCI address, on disk
    (``jsonstore``: atomic, locked against the restore and the agent).
    """

    def __init__(self, state_dir):
        self.store = jsonstore.JsonStore(state_dir, STORE_NAME, 'gpus',
                                         version=STORE_VERSION)
        self.path = self.store.path

    def load(self):
        """``{address: Layout}``; a record that cannot be read is left out
        with a warning (a restore then makes less, never something wrong).
        """
        layouts = {}
        for addr, data in self.store.load().items():
            try:
                layouts[addr] = layout_from_dict(data)
            except exceptions.InvalidRequest as e:
                LOG.warning('layout store %s: GPU %s left out: %s',
                            self.path, addr, e)
        return layouts

    def save(self, layouts):
        with self.store.change() as data:
            data.clear()
            data.update({addr: layout_to_dict(lay)
                         for addr, lay in sorted(layouts.items())})

    def set(self, address, layout):
        with self.store.change() as data:
            if layout is None:
                data.pop(address, None)
            else:
                data[address] = layout_to_dict(layout)


class MigModeStore:
    """The MIG mode the agent set on each GPU (PCI address -> enabled).

    Only GPUs whose mode the agent changed: the restore at boot sets
    those again (MIG mode is kept across reboots on Ampere, not on every
    later GPU); a mode the operator set is left to the operator.
    """

    def __init__(self, state_dir):
        self.store = jsonstore.JsonStore(state_dir, MIG_MODE_STORE, 'gpus')

    def load(self):
        return {a: v for a, v in self.store.load().items()
                if isinstance(v, bool)}

    def set(self, address, enabled):
        with self.store.change() as data:
            data[address] = bool(enabled)


def _catalog_profile(model, inst):
    """The catalog MIG profile of an NVML GPU instance (media-less)."""
    for profile in model.mig.profiles.values():
        if (profile.compute_slices == inst.compute_slices
                and profile.memory_slices == inst.size
                and not profile.name.endswith('+me')):
            return profile
    return None


class Carver:
    """Applies layouts to GPUs through a ``devices.DeviceManager``."""

    def __init__(self, manager, store, mig_modes=None,
                 switch_mig_mode=False):
        self.manager = manager
        self.store = store
        self.mig_modes = mig_modes or MigModeStore(None)
        self.switch_mig_mode = switch_mig_mode

    def apply(self, index, model, layout, restoring=False):
        """Make GPU ``index`` (a ``model``) hold ``layout``; record it.

        ``restoring``: the restore at boot, which may enable the MIG mode
        a stored MIG layout was made in (and never disables it).
        """
        layout_mod.check_layout(model, layout)
        nvml = self.manager.nvml
        if nvml is None or not nvml.available:
            raise errors.Unavailable('carving needs NVML')
        address = nvml.address(index)
        if layout.kind == layout_mod.MIG:
            if not nvml.mig_enabled(index) and (self.switch_mig_mode
                                                or restoring):
                if not restoring:  # at boot no VF has a type yet
                    self.clear_other_vf_types(address, layout)
                self.set_mig_mode(index, address, True, at_boot=restoring)
            self.apply_mig(index, model, layout)
        else:
            if self.switch_mig_mode and not restoring and \
                    model.mig_capable and nvml.mig_enabled(index):
                # idle GPU instances first (InUse when one is not)
                self._reshape(index, model, set(), 'no MIG instance')
                self.set_mig_mode(index, address, False)
            self.clear_other_vf_types(address, layout)
        self.store.set(address, layout)
        LOG.info('GPU %d (%s) carved: %s', index, address,
                 layout.describe())

    def set_mig_mode(self, index, address, enabled, at_boot=False):
        """Switch MIG mode through the device manager and record it (a
        pending switch too: the GPU takes it at its next reset).
        """
        try:
            self.manager.set_mig_mode(index, enabled, at_boot=at_boot)
        except errors.ResetRequired:
            self.mig_modes.set(address, enabled)
            raise
        self.mig_modes.set(address, enabled)

    def clear_other_vf_types(self, address, layout):
        """Clear the vGPU type of the GPU's idle VFs that ``layout`` does
        not serve (another time-sliced type, or passthrough), so that the
        ``qemu`` hook can set the new one just in time.

        Each through the device manager (journalled; a VF a domain
        references is refused with InUse, and the layout is then not
        recorded). Nothing without sysfs.
        """
        fs = self.manager.sysfs
        if fs is None:
            return []
        try:
            pf = fs.pci_function(address)
            vfs = [fs.pci_function(vf) for vf in pf.vfs]
        except errors.NotFound:
            return []
        names = {}
        for vf in vfs:
            names.update(vf.creatable_vgpu_types)
        keep = layout.vgpu_type if layout.kind == layout_mod.TIME_SLICED \
            else None
        cleared = []
        for vf in vfs:
            if not vf.current_vgpu_type:
                continue
            name = _VENDOR_PREFIX.sub('', names.get(vf.current_vgpu_type)
                                      or '')
            if keep is not None and name == keep:
                continue
            self.manager.remove_vf_vgpu(vf.address)
            cleared.append(vf.address)
        return cleared

    def mig_state(self, index, model):
        """``{(profile name, start): gi_id}`` of GPU ``index`` now."""
        state = {}
        for inst in self.manager.nvml.mig_instances_of(index):
            profile = _catalog_profile(model, inst)
            name = profile.name if profile else 'profile-%d' % (
                inst.profile_id)
            state[(name, inst.start)] = inst.gi_id
        return state

    def apply_mig(self, index, model, layout):
        """Destroy and create GPU instances until ``layout`` is there."""
        nvml = self.manager.nvml
        if not nvml.mig_enabled(index):
            raise errors.AgentError(
                'GPU %d is not in MIG mode: enable it (nvidia-smi -i %d '
                '-mig 1, or [gpu_agent] carve_switch_mig_mode) before '
                'carving a MIG layout' % (index, index))
        self._reshape(index, model,
                      {(gi, start) for gi, start, _vgpu in layout.instances},
                      layout.describe())

    def _reshape(self, index, model, wanted, what):
        """Destroy and create GPU instances until exactly ``wanted``
        (``{(profile name, start)}``) is there; rolled back on failure.
        """
        nvml = self.manager.nvml
        have = self.mig_state(index, model)
        extra = {k: v for k, v in have.items() if k not in wanted}
        missing = sorted(wanted - set(have), key=lambda k: k[1])
        used = nvml.mig_in_use(index)
        if extra and (used is None or set(extra.values()) & used):
            raise errors.InUse(
                'GPU %d: MIG instance(s) %s %s' % (
                    index, ', '.join('%s@%d' % k for k in sorted(extra)),
                    'may be in use (NVML cannot list the vGPUs on them)'
                    if used is None else 'are in use'))
        removed, created = [], []
        try:
            for key, gi_id in sorted(extra.items(), key=lambda kv: kv[0][1]):
                self.manager.remove_mig(index, gi_id)
                removed.append(key)
            for name, start in missing:
                gi_id = self.manager.create_mig(
                    index, model.mig_profile(name), start)
                created.append(gi_id)
        except errors.AgentError as e:
            LOG.error('GPU %d: carving %s failed (%s); rolling back',
                      index, what, e)
            self._roll_back(index, model, created, removed)
            raise

    def _roll_back(self, index, model, created, removed):
        """Undo a half-done carve: the GPU holds what it held before."""
        for gi_id in reversed(created):
            try:
                self.manager.remove_mig(index, gi_id)
            except errors.AgentError as e:
                LOG.error('GPU %d: roll back of GPU instance %d failed: %s'
                          ' (reconcile reclaims it)', index, gi_id, e)
        for name, start in removed:
            try:
                self.manager.create_mig(index, model.mig_profile(name),
                                        start)
            except errors.AgentError as e:
                LOG.error('GPU %d: could not re-create %s@%d: %s',
                          index, name, start, e)
