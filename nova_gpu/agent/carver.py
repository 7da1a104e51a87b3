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

What was carved is kept in ``layouts.json`` in the agent's state
directory (atomic replace, fsync'd), so that ``nova_gpu.agent.restore``
can make it again after a reboot.
"""

import json
import os
import re

from oslo_log import log as logging

from nova_gpu.agent import errors
from nova_gpu.core import exceptions
from nova_gpu.core import layout as layout_mod

LOG = logging.getLogger(__name__)
STORE_NAME = 'layouts.json'
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
    """The layout of each carved GPU, by PCI address, on disk."""

    def __init__(self, state_dir):
        self.path = os.path.join(state_dir, STORE_NAME)

    def load(self):
        """``{address: Layout}``; a file that cannot be read is set aside."""
        try:
            with open(self.path, encoding='utf-8') as f:
                doc = json.load(f)
            if doc.get('version') != STORE_VERSION:
                raise ValueError('unsupported version %r'
                                 % doc.get('version'))
            return {addr: layout_from_dict(d)
                    for addr, d in doc['gpus'].items()}
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, KeyError, AttributeError,
                exceptions.InvalidRequest) as e:
            aside = self.path + '.bad'
            LOG.warning('layout store %s cannot be read (%s): moved to %s',
                        self.path, e, aside)
            try:
                os.replace(self.path, aside)
            except OSError:
                pass
            return {}

    def save(self, layouts):
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        tmp = self.path + '.tmp'
        doc = {'version': STORE_VERSION,
               'gpus': {addr: layout_to_dict(lay)
                        for addr, lay in sorted(layouts.items())}}
        with open(tmp, 'w', encoding='utf-8') as f:
            json.dump(doc, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)

    def set(self, address, layout):
        layouts = self.load()
        if layout is None:
            layouts.pop(address, None)
        else:
            layouts[address] = layout
        self.save(layouts)


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

    def __init__(self, manager, store):
        self.manager = manager
        self.store = store

    def apply(self, index, model, layout):
        """Make GPU ``index`` (a ``model``) hold ``layout``; record it."""
        layout_mod.check_layout(model, layout)
        nvml = self.manager.nvml
        if nvml is None or not nvml.available:
            raise errors.Unavailable('carving needs NVML')
        address = nvml.address(index)
        if layout.kind == layout_mod.MIG:
            self.apply_mig(index, model, layout)
        else:
            self.clear_other_vf_types(address, layout)
        self.store.set(address, layout)
        LOG.info('GPU %d (%s) carved: %s', index, address,
                 layout.describe())

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
                '-mig 1) before carving a MIG layout' % (index, index))
        wanted = {(gi, start) for gi, start, _vgpu in layout.instances}
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
                      index, layout.describe(), e)
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
