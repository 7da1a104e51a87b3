"""Create and remove GPU devices for KVM guests.

* mdevs: persistent, through libvirt's node-device API (define, create,
  autostart), so Nova's libvirt driver finds and reuses them;
* NVIDIA vendor VFIO vGPUs: the type id written into a free SR-IOV VF's
  ``nvidia/current_vgpu_type``;
* MIG GPU + compute instances through NVML;
* whole-GPU passthrough: ``<hostdev>`` XML for every function of the
  IOMMU group, after checking each is bound to vfio-pci.

Every operation checks its inputs first (unknown type, missing parent, no
instances left) and undoes its own partial work when a later step fails.
"""

import shutil
import time
import uuid as uuid_mod

from oslo_log import log as logging

from nova_gpu.agent import errors
from nova_gpu.agent import privsep
from nova_gpu.agent import xmlbuild

LOG = logging.getLogger(__name__)


class DeviceManager:
    def __init__(self, sysfs, libvirt=None, nvml=None, timeout=10.0,
                 check_mdevctl=True):
        self.sysfs = sysfs
        self.libvirt = libvirt
        self.nvml = nvml
        self.timeout = timeout
        self.check_mdevctl = check_mdevctl

    def _need_libvirt(self):
        if self.libvirt is None:
            raise errors.Unavailable('no libvirt connection configured')
        return self.libvirt

    def wait_for(self, predicate, what):
        deadline = time.monotonic() + self.timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise errors.AgentError('timed out after %.1fs waiting for '
                                        '%s' % (self.timeout, what))
            time.sleep(0.005)

    # -- mdev -------------------------------------------------------------

    def free_mdev_types(self, parent):
        fn = self.sysfs.pci_function(parent)
        return {t.id: t for t in fn.mdev_types.values()}

    def create_mdev(self, parent, type_id, uuid=None, autostart=True):
        """Define, start and autostart an mdev; return its UUID."""
        lv = self._need_libvirt()
        xmlbuild.check(type_id, xmlbuild.MDEV_TYPE_RE, 'mdev type')
        uuid = (uuid or str(uuid_mod.uuid4())).lower()
        xmlbuild.check_uuid(uuid)
        try:
            fn = self.sysfs.pci_function(parent)
        except errors.NotFound as e:
            raise errors.NotFound('mdev parent %s does not exist: %s'
                                  % (parent, e)) from e
        if not fn.mdev_types:
            raise errors.NotFound('PCI device %s is not an mdev parent (no '
                                  'mdev_supported_types)' % parent)
        mtype = fn.mdev_types.get(type_id)
        if mtype is None:
            raise errors.NotFound('mdev type %r is not supported by %s '
                                  '(supported: %s)' % (
                                      type_id, parent,
                                      ', '.join(sorted(fn.mdev_types))))
        if mtype.available < 1:
            raise errors.NoCapacity('no instances of mdev type %s (%s) left '
                                    'on %s' % (type_id, mtype.name, parent))
        if self.check_mdevctl and shutil.which('mdevctl') is None:
            raise errors.Unavailable('mdevctl is not installed: libvirt '
                                     'needs it to define mdevs')
        name = None
        try:
            name = lv.define_mdev(parent, type_id, uuid)
            lv.start_device(name, autostart=autostart)
            self._wait_up(uuid)
        except Exception:
            LOG.warning('creating mdev %s on %s failed; undoing', uuid,
                        parent)
            self._undo_mdev(uuid, name)
            raise
        LOG.info('created mdev %s (%s) on %s', uuid, type_id, parent)
        return uuid

    def _undo_mdev(self, uuid, name):
        lv = self.libvirt
        try:
            known = lv.mdevs().get(uuid)
            if known:
                if known['active']:
                    lv.stop_device(known['name'])
                if known['persistent']:
                    lv.undefine_device(known['name'])
        except errors.AgentError as e:
            LOG.error('could not undo mdev %s: %s', uuid, e)

    def start_mdev(self, name, uuid):
        """Start a defined mdev (after a reboot) and wait until it is up."""
        self._need_libvirt().start_device(name, autostart=False)
        self._wait_up(uuid)

    def _wait_up(self, uuid):
        # sysfs is the truth; libvirt learns of the device from udev a
        # moment later, and only then can it stop it again.
        self.wait_for(lambda: self.sysfs.mdev_active(uuid),
                      'mdev %s to appear' % uuid)
        self.wait_for(lambda: self._libvirt_active(uuid),
                      'libvirt to see mdev %s active' % uuid)

    def _libvirt_active(self, uuid):
        info = self.libvirt.mdevs().get(uuid)
        return bool(info and info['active'])

    def remove_mdev(self, uuid, refs=None):
        """Stop and undefine an mdev unless a domain references it."""
        lv = self._need_libvirt()
        uuid = xmlbuild.check_uuid(uuid.lower())
        refs = lv.domain_refs() if refs is None else refs
        if uuid in refs:
            raise errors.InUse('mdev %s is used by domain(s) %s; detach it '
                               'first' % (uuid, ', '.join(refs[uuid])))
        known = lv.mdevs().get(uuid)
        if known is None and not self.sysfs.mdev_active(uuid):
            raise errors.NotFound('no mdev %s on this host' % uuid)
        if known is None:
            raise errors.AgentError('mdev %s is active but libvirt does not '
                                    'know it; cannot remove it' % uuid)
        if self.sysfs.mdev_active(uuid):
            self.wait_for(lambda: self._libvirt_active(uuid),
                          'libvirt to see mdev %s active' % uuid)
            lv.stop_device(known['name'])
            self.wait_for(lambda: not self.sysfs.mdev_active(uuid),
                          'mdev %s to go away' % uuid)
        if known['persistent']:
            lv.undefine_device(known['name'])
        # libvirtd drops the device when udev reports it gone; return only
        # then, so that the next look at libvirt agrees with sysfs.
        self.wait_for(lambda: uuid not in lv.mdevs(),
                      'libvirt to forget mdev %s' % uuid)
        LOG.info('removed mdev %s', uuid)

    # -- NVIDIA vendor VFIO vGPU on SR-IOV VFs ----------------------------

    def create_vf_vgpu(self, address, type_id):
        """Give a free VF of ``address`` (a PF or VF) the vGPU type id."""
        fn = self.sysfs.pci_function(address)
        candidates = [fn] if fn.physfn else [
            self.sysfs.pci_function(v) for v in fn.vfs]
        if not candidates:
            raise errors.NotFound('%s has no SR-IOV virtual functions' %
                                  address)
        creatable = {}
        for vf in candidates:
            creatable.update(vf.creatable_vgpu_types)
        if int(type_id) not in creatable:
            raise errors.NotFound(
                'vGPU type id %s cannot be created on %s (creatable: %s)'
                % (type_id, address, ', '.join('%d (%s)' % kv for kv in
                                               sorted(creatable.items()))
                   or 'none left'))
        free = [vf for vf in candidates if not vf.current_vgpu_type
                and int(type_id) in vf.creatable_vgpu_types]
        if not free:
            raise errors.NoCapacity('no free VF of %s can take vGPU type %s'
                                    % (address, type_id))
        vf = free[0]
        rel = 'bus/pci/devices/%s/nvidia/current_vgpu_type' % vf.address
        privsep.write_sysfs(self.sysfs.root, rel, '%d\n' % int(type_id))
        if self.sysfs.pci_function(vf.address).current_vgpu_type != \
                int(type_id):
            privsep.write_sysfs(self.sysfs.root, rel, '0\n')
            raise errors.AgentError('VF %s did not take vGPU type %s'
                                    % (vf.address, type_id))
        return vf.address

    def remove_vf_vgpu(self, vf_address, refs=None):
        xmlbuild.check_pci(vf_address)
        refs = self._need_libvirt().domain_refs() if refs is None else refs
        if vf_address in refs:
            raise errors.InUse('VF %s is used by domain(s) %s'
                               % (vf_address, ', '.join(refs[vf_address])))
        rel = 'bus/pci/devices/%s/nvidia/current_vgpu_type' % vf_address
        privsep.write_sysfs(self.sysfs.root, rel, '0\n')

    # -- MIG --------------------------------------------------------------

    def create_mig(self, index, profile, start):
        if self.nvml is None or not self.nvml.available:
            raise errors.Unavailable('MIG needs NVML: %s' % (
                self.nvml.reason if self.nvml else 'not configured'))
        return self.nvml.create_mig(index, profile, start)

    def remove_mig(self, index, gi_id):
        if self.nvml is None or not self.nvml.available:
            raise errors.Unavailable('MIG needs NVML')
        self.nvml.destroy_mig(index, gi_id)

    # -- whole-GPU passthrough --------------------------------------------

    def passthrough_hostdevs(self, address, bind=False):
        """``<hostdev>`` XML for every function in ``address``'s IOMMU group.

        A guest can only get a whole IOMMU group, so every function in it
        (the GPU, its audio function, ...) must be bound to vfio-pci. With
        ``bind`` the functions are rebound through privsep first.
        """
        fn = self.sysfs.pci_function(address)
        if fn.iommu_group is None:
            raise errors.AgentError('%s has no IOMMU group: enable the IOMMU '
                                    '(intel_iommu=on / amd_iommu=on)'
                                    % address)
        members = [self.sysfs.pci_function(m) for m in fn.group_members]
        if bind:
            for m in members:
                if m.driver != 'vfio-pci':
                    self._bind_vfio(m)
            members = [self.sysfs.pci_function(m) for m in fn.group_members]
        wrong = ['%s (%s)' % (m.address, m.driver or 'no driver')
                 for m in members if m.driver != 'vfio-pci']
        if wrong:
            raise errors.AgentError(
                'IOMMU group %d of %s has functions not bound to vfio-pci: '
                '%s' % (fn.iommu_group, address, ', '.join(wrong)))
        return [xmlbuild.pci_hostdev(m.address) for m in members]

    def _bind_vfio(self, fn):
        root = self.sysfs.root
        base = 'bus/pci/devices/%s/' % fn.address
        privsep.write_sysfs(root, base + 'driver_override', 'vfio-pci\n')
        if fn.driver:
            privsep.write_sysfs(root, base + 'driver/unbind', fn.address)
        privsep.write_sysfs(root, 'bus/pci/drivers_probe', fn.address)
