"""The vGPU type of each vendor-VFIO VF, kept so a reboot does not lose it.

A VF's ``nvidia/current_vgpu_type`` is reset when the VFs are enabled
again after a reboot. The type matters beyond the guest that had it: on a
time-sliced GPU the first typed VF fixes the type of every VF (equal size
mode), and a MIG-backed type holds a GPU instance. If the guests of the
host were not stopped cleanly (power loss, a crash: no ``release`` hook
ran), another guest could take the GPU for another type first and the
old guest could not start again. So the type set for a guest is recorded
here (``vf_types.json`` in the agent's state directory), and
``nova-gpu-restore`` (before nova-compute) gives each VF that a defined
libvirt domain still references its recorded type again; records of VFs
no domain references are dropped.

Who writes the record: the ``qemu`` hook (as root) after it typed a VF at
``prepare begin`` calls ``record(state_dir, vf, type_id)``, and
``forget(state_dir, vf)`` when it clears the type again at ``release
end``; the agent's device manager does the same for the types it sets and
clears (``VfTypes``). ``state_dir`` is ``[gpu_agent] state_dir``.
"""

from oslo_log import log as logging

from nova_gpu.agent import errors
from nova_gpu.agent import jsonstore
from nova_gpu.agent import sysfs as sysfs_mod

LOG = logging.getLogger(__name__)
STORE_NAME = 'vf_types.json'


def _check(vf, type_id=None):
    if not sysfs_mod.is_pci_address(vf):
        raise ValueError('not a PCI address (DDDD:BB:SS.F, lower-case '
                         'hex): %r' % (vf,))
    if type_id is not None and (isinstance(type_id, bool) or
                                not isinstance(type_id, int) or
                                type_id <= 0):
        raise ValueError('vGPU type id must be a positive integer: %r'
                         % (type_id,))


class VfTypes:
    """``{VF address: vGPU type id}`` on disk (memory without a dir)."""

    def __init__(self, state_dir):
        self.store = jsonstore.JsonStore(state_dir, STORE_NAME, 'vfs')

    def load(self):
        return {vf: t for vf, t in self.store.load().items()
                if sysfs_mod.is_pci_address(vf) and isinstance(t, int)
                and not isinstance(t, bool) and t > 0}

    def record(self, vf, type_id):
        _check(vf, type_id)
        with self.store.change() as data:
            data[vf] = type_id

    def forget(self, vf):
        _check(vf)
        with self.store.change() as data:
            data.pop(vf, None)


def record(state_dir, vf, type_id):
    """For the ``qemu`` hook: VF ``vf`` was given vGPU type ``type_id``."""
    VfTypes(state_dir).record(vf, type_id)


def forget(state_dir, vf):
    """For the ``qemu`` hook: VF ``vf`` has no vGPU type any more."""
    VfTypes(state_dir).forget(vf)


def restore_types(manager, types, refs):
    """Type again the recorded VFs a domain references.

    ``refs``: ``{PCI address or mdev UUID: [domain names]}`` of every
    defined domain (``LibvirtHost.domain_refs``). Returns ``(set,
    dropped, failed)``: VFs typed now, records dropped (no domain
    references the VF), and failures (kept for the next restore). A VF
    that has another type already is not changed (a failure).
    """
    done, dropped, failed = [], [], []
    for vf, type_id in sorted(types.load().items()):
        if vf not in refs:
            LOG.info('VF %s: no domain references it any more; its vGPU '
                     'type %d is not set again', vf, type_id)
            types.forget(vf)
            dropped.append(vf)
            continue
        try:
            fn = manager.sysfs.pci_function(vf)
            if fn.current_vgpu_type is None:
                raise errors.NotFound('%s is not a vendor-VFIO VF (no '
                                      'nvidia/current_vgpu_type)' % vf)
            if fn.current_vgpu_type == type_id:
                continue
            if fn.current_vgpu_type:
                raise errors.InUse('VF %s has vGPU type %d, not the %d '
                                   'domain(s) %s had' % (
                                       vf, fn.current_vgpu_type, type_id,
                                       ', '.join(refs[vf])))
            manager.retype_vf(vf, type_id)
            done.append(vf)
        except (errors.AgentError, OSError, ValueError) as e:
            LOG.error('VF %s: vGPU type %d not set again: %s', vf, type_id,
                      e)
            failed.append('%s: %s' % (vf, e))
    return done, dropped, failed
