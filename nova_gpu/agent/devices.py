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
Each one records its intent in the journal (``nova_gpu.agent.journal``)
before the first change and drops it after the last, so that reconcile
can roll back what a crash cut short.
"""

import contextlib
import shutil
import time
import uuid as uuid_mod

from oslo_log import log as logging
import tenacity

from nova_gpu.agent import errors
from nova_gpu.agent import journal as journal_mod
from nova_gpu.agent import privsep
from nova_gpu.agent import xmlbuild

LOG = logging.getLogger(__name__)


# libvirt 9's node-device driver applies an ``mdevctl list`` of active
# mdevs that may have begun before the mdev stopped; applied after udev's
# "remove", it lists the mdev again as active and transient, and only a
# later udev event or a restart of libvirt's node-device daemon drops it.
STALE_ENTRY = ('mdev %s is gone from sysfs and has no mdevctl definition, '
               'but libvirt still lists it: a stale entry of libvirt\'s '
               'node-device driver; nothing is left on the host, but Nova '
               'lists mdevs through libvirt and may give this one to a new '
               'guest, whose start then fails: restart virtnodedevd (or '
               'libvirtd) to clear it')
STALE_CLEARED = ('libvirt listed mdev %s, gone from sysfs and mdevctl (a '
                 'stale entry of its node-device driver): cleared by '
                 'starting and stopping a transient mdev of that UUID')


def is_stale_libvirt_entry(info, in_sysfs):
    """Whether libvirt lists an mdev that exists nowhere else: not in
    sysfs, and not defined (libvirt marks it transient once mdevctl's
    definitions no longer hold it). There is nothing left to remove.
    """
    return info is not None and not info['persistent'] and not in_sysfs


class DeviceManager:
    def __init__(self, sysfs, libvirt=None, nvml=None, timeout=10.0,
                 check_mdevctl=True, journal=None, vf_types=None):
        self.sysfs = sysfs
        # vf_types.VfTypes: the VF types set, for the restore at boot
        self.vf_types = vf_types
        self.libvirt = libvirt
        self.nvml = nvml
        self.timeout = timeout
        self.check_mdevctl = check_mdevctl
        # None: intents are kept in memory only (tests, one-shot tools)
        self.journal = journal or journal_mod.Journal()

    @contextlib.contextmanager
    def _released_on_error(self, intent):
        """A removal that failed half-way is finished by reconcile."""
        try:
            yield
        except Exception:
            self.journal.release(intent)
            raise

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
        intent = self.journal.begin('mdev_create', uuid=uuid, parent=parent,
                                    type_id=type_id)
        try:
            name = lv.define_mdev(parent, type_id, uuid)
            lv.start_device(name, autostart=autostart)
            self._wait_up(uuid)
        except Exception:
            LOG.warning('creating mdev %s on %s failed; undoing', uuid,
                        parent)
            if self._undo_mdev(uuid, name):
                self.journal.done(intent)
            else:
                self.journal.release(intent)
            raise
        self.journal.done(intent)
        LOG.info('created mdev %s (%s) on %s', uuid, type_id, parent)
        return uuid

    def _undo_mdev(self, uuid, name):
        """Stop and undefine what libvirt knows of ``uuid``; True if done
        (False leaves the intent for reconcile to retry).
        """
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
            return False
        return True

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
        in_sysfs = self.sysfs.mdev_active(uuid)
        if known is None and not in_sysfs:
            raise errors.NotFound('no mdev %s on this host' % uuid)
        if is_stale_libvirt_entry(known, in_sysfs):
            forgotten = self._forgotten(uuid)
            if forgotten == 'cleared':
                return
            raise errors.NotFound('no mdev %s on this host' % uuid + (
                '; ' + STALE_ENTRY % uuid if forgotten == 'stale' else ''))
        if known is None:
            raise errors.AgentError('mdev %s is active but libvirt does not '
                                    'know it; cannot remove it' % uuid)
        intent = self.journal.begin('mdev_remove', uuid=uuid)
        with self._released_on_error(intent):
            self._remove_known(uuid, known)
        self.journal.done(intent)
        LOG.info('removed mdev %s', uuid)

    def _remove_known(self, uuid, known):
        lv = self.libvirt
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
        if self._forgotten(uuid) == 'stale':
            LOG.warning(STALE_ENTRY, uuid)

    def _forgotten(self, uuid):
        """Wait until libvirt no longer lists mdev ``uuid``: 'forgotten';
        a stale entry (``is_stale_libvirt_entry``) that stays is cleared
        (``clear_stale_entry``): 'cleared', or 'stale' if it cannot be.
        Anything else libvirt still lists fails the wait.
        """
        lv = self.libvirt
        try:
            self.wait_for(lambda: uuid not in lv.mdevs(),
                          'libvirt to forget mdev %s' % uuid)
            return 'forgotten'
        except errors.AgentError:
            info = lv.mdevs().get(uuid)
            if info is None:
                return 'forgotten'
            if not is_stale_libvirt_entry(info, self.sysfs.mdev_active(uuid)):
                raise
        return 'cleared' if self.clear_stale_entry(uuid, info) else 'stale'

    def clear_stale_entry(self, uuid, info):
        """Make libvirt forget a stale entry (``is_stale_libvirt_entry``):
        start a transient mdev of the same UUID, parent and type, which
        udev's "add" makes libvirt's entry real, and stop it, which udev's
        "remove" then drops. No mdevctl definition changes, so no re-read
        of mdevctl's lists can race it. True if libvirt no longer lists
        the mdev; False if it could not be done (no instance of the type
        free on the parent, say): a transient mdev it started and could
        not stop is left to reconcile through the journal.

        Only for an entry that has stayed stale a while: libvirt lists an
        mdev someone just removed until udev's "remove" reaches it.
        """
        lv = self.libvirt
        intent = self.journal.begin('mdev_create', uuid=uuid)
        try:
            name = lv.create_transient_mdev(info['parent_addr'],
                                            info['mdev_type'], uuid)
            self._wait_up(uuid)
            lv.stop_device(name)
            self.wait_for(lambda: not self.sysfs.mdev_active(uuid),
                          'mdev %s to go away' % uuid)
            self.wait_for(lambda: uuid not in lv.mdevs(),
                          'libvirt to forget mdev %s' % uuid)
        except (errors.AgentError, KeyError, ValueError) as e:
            LOG.debug('could not clear the stale entry of mdev %s: %s',
                      uuid, e)
            if self.sysfs.mdev_active(uuid):
                # started but not stopped: the journal's intent has
                # reconcile remove it
                self.journal.release(intent)
            else:
                self.journal.done(intent)
            return False
        self.journal.done(intent)
        LOG.warning(STALE_CLEARED, uuid)
        return True

    def rollback_mdev(self, uuid, refs):
        """Remove mdev ``uuid`` that a cut-short operation left, unless a
        domain references it. Returns what was done.
        """
        if uuid in refs:
            return 'in use'
        lv = self._need_libvirt()
        if self.sysfs.mdev_active(uuid):
            # libvirt learns of a new device from udev a moment later
            self.wait_for(lambda: uuid in lv.mdevs(),
                          'libvirt to see mdev %s' % uuid)
        if lv.mdevs().get(uuid) is None:
            return 'absent'
        # A kill during undefine can leave libvirt listing a definition
        # mdevctl has already dropped ("No devices match"): libvirt catches
        # up when it re-reads mdevctl's definitions, so look again.
        for attempt in tenacity.Retrying(
                retry=tenacity.retry_if_exception_type(errors.AgentError),
                stop=tenacity.stop_after_delay(self.timeout),
                wait=tenacity.wait_fixed(0.2), reraise=True):
            with attempt:
                known = lv.mdevs().get(uuid)
                if known is not None:
                    self._remove_known(uuid, known)
        return 'removed'

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
        root = self.sysfs.root
        intent = self.journal.begin('vf_create', vf=vf.address,
                                    type_id=int(type_id))
        try:
            privsep.set_vgpu_type(root, vf.address, int(type_id))
            taken = self.sysfs.pci_function(vf.address).current_vgpu_type
            if taken != int(type_id):
                privsep.clear_vgpu_type(root, vf.address)
        except Exception:
            self.journal.release(intent)  # reconcile clears it
            raise
        self.journal.done(intent)
        if taken != int(type_id):
            raise errors.AgentError('VF %s did not take vGPU type %s'
                                    % (vf.address, type_id))
        self._record_type(vf.address, int(type_id))
        LOG.info('gave VF %s vGPU type %s', vf.address, type_id)
        return vf.address

    def _record_type(self, vf, type_id):
        if self.vf_types is None:
            return
        try:
            if type_id:
                self.vf_types.record(vf, type_id)
            else:
                self.vf_types.forget(vf)
        except (OSError, ValueError) as e:  # the type itself is set
            LOG.warning('cannot record the vGPU type of VF %s: %s', vf, e)

    def enable_vfs(self, pf, count):
        """Enable ``count`` SR-IOV VFs on GPU PF ``pf`` (``sriov-manage
        -e``; ``nova_gpu.agent.sriov``). True when enabled now.
        """
        xmlbuild.check_pci(pf)
        counts = self.sysfs.sriov_counts(pf)
        if counts is None:
            raise errors.NotFound('%s is not an SR-IOV physical function '
                                  '(no sriov_numvfs)' % pf)
        done = privsep.enable_sriov_vfs(self.sysfs.root, pf, int(count))
        if done:
            LOG.info('enabled %d SR-IOV VFs on %s', count, pf)
        return done

    def retype_vf(self, vf_address, type_id):
        """Give VF ``vf_address`` its recorded vGPU type again (restore at
        boot): compare and set, journalled like a create.
        """
        xmlbuild.check_pci(vf_address)
        intent = self.journal.begin('vf_create', vf=vf_address,
                                    type_id=int(type_id))
        try:
            privsep.set_vgpu_type_if_free(self.sysfs.root, vf_address,
                                          int(type_id))
            taken = self.sysfs.pci_function(vf_address).current_vgpu_type
        except Exception:
            self.journal.release(intent)  # reconcile clears it
            raise
        self.journal.done(intent)
        if taken != int(type_id):
            raise errors.AgentError('VF %s did not take vGPU type %s (it '
                                    'shows %s)' % (vf_address, type_id,
                                                   taken))
        LOG.info('VF %s has its vGPU type %s again', vf_address, type_id)

    def remove_vf_vgpu(self, vf_address, refs=None):
        """Clear the vGPU type of VF ``vf_address`` unless a domain uses
        it.
        """
        xmlbuild.check_pci(vf_address)
        fn = self.sysfs.pci_function(vf_address)
        if not fn.physfn or fn.current_vgpu_type is None:
            raise errors.NotFound('%s is not an SR-IOV VF with NVIDIA vendor '
                                  'VFIO (no nvidia/current_vgpu_type)'
                                  % vf_address)
        refs = self._need_libvirt().domain_refs() if refs is None else refs
        if vf_address in refs:
            raise errors.InUse('VF %s is used by domain(s) %s'
                               % (vf_address, ', '.join(refs[vf_address])))
        intent = self.journal.begin('vf_remove', vf=vf_address)
        with self._released_on_error(intent):
            privsep.clear_vgpu_type(self.sysfs.root, vf_address)
        self.journal.done(intent)
        self._record_type(vf_address, 0)
        LOG.info('cleared the vGPU type of VF %s', vf_address)

    def rollback_vf(self, vf_address, refs):
        """Clear a VF's vGPU type that a cut-short operation left, unless a
        domain references the VF. Returns what was done.
        """
        if vf_address in refs:
            return 'in use'
        try:
            fn = self.sysfs.pci_function(vf_address)
        except errors.NotFound:
            return 'absent'
        if not fn.current_vgpu_type:
            return 'absent'
        privsep.clear_vgpu_type(self.sysfs.root, vf_address)
        self._record_type(vf_address, 0)
        return 'removed'

    # -- MIG --------------------------------------------------------------

    def _need_nvml(self):
        if self.nvml is None or not self.nvml.available:
            raise errors.Unavailable('MIG needs NVML: %s' % (
                self.nvml.reason if self.nvml else 'not configured'))
        return self.nvml

    def create_mig(self, index, profile, start):
        nvml = self._need_nvml()
        address = nvml.address(index)
        intent = self.journal.begin(
            'mig_create', gpu=address, profile=profile.name,
            start=int(start), memory_slices=profile.memory_slices)
        try:
            gi_id = nvml.create_mig(
                index, profile, start,
                on_gpu_instance=lambda gi: self.journal.update(intent,
                                                               gi_id=gi))
        except errors.AgentError:
            # create_mig destroyed what it made (or made nothing)
            self.journal.done(intent)
            raise
        except Exception:
            self.journal.release(intent)  # reconcile destroys it
            raise
        self.journal.done(intent)
        LOG.info('created MIG %s at slice %d on GPU %d (GPU instance %d)',
                 profile.name, start, index, gi_id)
        return gi_id

    def remove_mig(self, index, gi_id):
        nvml = self._need_nvml()
        used = nvml.mig_in_use(index)
        if used is None or gi_id in used:
            raise errors.InUse('MIG GPU instance %d of GPU %d %s' % (
                gi_id, index, 'has a vGPU on it' if used is not None else
                'may be in use (NVML cannot list the vGPUs on it)'))
        intent = self.journal.begin('mig_remove', gpu=nvml.address(index),
                                    gi_id=int(gi_id))
        with self._released_on_error(intent):
            nvml.destroy_mig(index, gi_id)
        self.journal.done(intent)
        LOG.info('removed MIG GPU instance %d of GPU %d', gi_id, index)

    def rollback_mig(self, args):
        """Destroy the MIG GPU instance a cut-short create (or remove) left,
        with its compute instances, unless a vGPU is on it.
        """
        nvml = self._need_nvml()
        index = nvml.index_of(args.get('gpu'))
        if index is None:
            return 'absent'
        gi_id = args.get('gi_id')
        if gi_id is None:
            # killed before the id was recorded: the instance at the slice
            # the create asked for, if one is there
            for inst in nvml.mig_instances_of(index):
                if inst.start == args.get('start') and \
                        inst.size == args.get('memory_slices'):
                    gi_id = inst.gi_id
        if gi_id is None or gi_id not in {
                i.gi_id for i in nvml.mig_instances_of(index)}:
            return 'absent'
        used = nvml.mig_in_use(index)
        if used is None or gi_id in used:
            return 'in use'
        nvml.destroy_mig(index, gi_id)
        return 'removed'

    def set_mig_mode(self, index, enabled, refs=None, at_boot=False):
        """Switch idle GPU ``index`` into (``enabled``) or out of MIG mode.

        Idle: no MIG GPU instance, no vGPU NVML lists, no mdev on the GPU
        or its VFs, and neither the GPU nor a VF referenced by a libvirt
        domain; otherwise InUse, and Unavailable when libvirt cannot say.
        ``at_boot`` (the restore, before any guest runs): the mode the
        agent had set is set again though defined domains reference the
        GPU's VFs (those guests need it back); the NVML and mdev checks
        still apply.
        Journalled (``mig_mode``, with the mode before): reconcile sets a
        cut-short switch back. Raises ResetRequired when the new mode is
        pending a GPU reset (NVML could not reset the GPU itself). True
        when the mode changed (or is now pending), False when it was
        already there.
        """
        nvml = self._need_nvml()
        address = nvml.address(index)
        mode = nvml.mig_mode(index)
        if mode is None:
            raise errors.NotFound('GPU %d (%s) has no MIG mode'
                                  % (index, address))
        current, pending = mode
        enabled = bool(enabled)
        if current == enabled and pending == enabled:
            return False
        self._check_idle(index, address, {} if at_boot else refs)
        intent = self.journal.begin('mig_mode', gpu=address,
                                    enabled=enabled, previous=current)
        try:
            current, pending = nvml.set_mig_mode(index, enabled)
        except errors.AgentError:
            self.journal.done(intent)  # NVML refused: nothing changed
            raise
        except Exception:
            self.journal.release(intent)  # reconcile sets it back
            raise
        self.journal.done(intent)
        if current != enabled:
            raise errors.ResetRequired(
                'GPU %d (%s): MIG mode %s is pending: NVML could not reset '
                'the GPU, so it takes effect only after a GPU reset '
                '(nvidia-smi -i %d -r, with nothing using the GPU) or a '
                'reboot' % (index, address,
                            'enable' if enabled else 'disable', index))
        LOG.info('GPU %d (%s): MIG mode %s', index, address,
                 'enabled' if enabled else 'disabled')
        return True

    def _check_idle(self, index, address, refs=None):
        """Raise InUse unless nothing is on GPU ``index`` (see
        ``set_mig_mode``).
        """
        nvml = self.nvml
        instances = nvml.mig_instances_of(index) if nvml.mig_enabled(
            index) else []
        if instances:
            raise errors.InUse(
                'GPU %d (%s) holds MIG GPU instance(s) %s: remove them '
                'before its MIG mode changes' % (
                    index, address,
                    ', '.join(str(i.gi_id) for i in instances)))
        used = nvml.mig_in_use(index)
        if used is None or used:
            raise errors.InUse('GPU %d (%s) %s' % (
                index, address, 'may have vGPUs on it (NVML cannot list '
                'them)' if used is None else 'has vGPUs on it'))
        functions = {address}
        if self.sysfs is not None:
            try:
                functions.update(self.sysfs.pci_function(address).vfs)
            except errors.NotFound:
                pass
            mdevs = sorted(m.uuid for m in self.sysfs.mdevs().values()
                           if m.parent in functions)
            if mdevs:
                raise errors.InUse('GPU %d (%s) has mdev(s) %s'
                                   % (index, address, ', '.join(mdevs)))
        if refs is None:
            if self.libvirt is None:
                raise errors.Unavailable(
                    'GPU %d (%s): without libvirt nothing says whether a '
                    'guest uses it; MIG mode not changed' % (index, address))
            refs = self.libvirt.domain_refs()
        used_by = sorted(f for f in functions if f in refs)
        if used_by:
            raise errors.InUse('GPU %d (%s): %s used by domain(s) %s' % (
                index, address, ', '.join(used_by),
                ', '.join(sorted({d for f in used_by for d in refs[f]}))))

    def rollback_mig_mode(self, args, refs):
        """Set back the MIG mode a cut-short switch may have changed,
        unless the GPU is in use now.
        """
        nvml = self._need_nvml()
        index = nvml.index_of(args.get('gpu'))
        if index is None:
            return 'absent'
        previous = bool(args.get('previous'))
        mode = nvml.mig_mode(index)
        if mode is None or mode == (previous, previous):
            return 'absent'
        try:
            self._check_idle(index, args.get('gpu'), refs)
        except errors.InUse:
            return 'in use'
        nvml.set_mig_mode(index, previous)
        return 'removed'

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
        privsep.bind_vfio_pci(self.sysfs.root, fn.address)
