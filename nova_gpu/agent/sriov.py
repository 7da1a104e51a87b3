"""SR-IOV VFs of vendor-VFIO GPUs, enabled again after a reboot.

NVIDIA's SR-IOV GPUs (Ampere and later) serve vGPUs through virtual
functions, and VFs are runtime state: NVIDIA's vGPU guide says the VFs "in
the sysfs file system are disabled after the hypervisor host is rebooted
or if the driver is reloaded or upgraded", and has the administrator run
``/usr/lib/nvidia/sriov-manage -e <ssss:bb:dd.f|ALL>`` after each boot
(also cited in NVIDIA/gpu-operator issue #2600: "SR-IOV VFs (created via
``sriov-manage -e``) are gone ... VFs are runtime state"). That tool
writes the PF's ``sriov_totalvfs`` into its ``sriov_numvfs`` (the kernel's
interface, Documentation/PCI/pci-iov-howto.rst), with the PF bound to
``pci-pf-stub`` meanwhile.

Nova's PCI tracker lists the VFs in ``[pci] device_spec`` and takes the
host's PCI devices only once, when nova-compute starts: Nova 34's
``ResourceTracker._setup_pci_tracker`` (nova/compute/resource_tracker.py)
hands the driver's ``pci_passthrough_devices`` to the tracker only when it
creates it (``if not self.pci_tracker``); later periodic updates do not.
A VF enabled after nova-compute started is not Nova's (no Placement
inventory, no PCI claim) until nova-compute restarts. So the VFs must be
there before nova-compute starts, and nothing here changes them while it
may run:

* the agent records which PFs have how many VFs (``sriov.json`` in its
  state directory, updated every cycle);
* ``nova-gpu-restore`` (ordered before nova-compute) enables them again
  through the privsep entry point ``privsep.enable_sriov_vfs``
  (``restore_vfs``), and logs a WARNING naming the VFs it enabled, since
  a nova-compute already running (the command run by hand) must be
  restarted to track them;
* the agent at its start, when nova-compute may already run, enables
  nothing (``missing_vfs``): it names each PF short of its recorded VFs
  in a WARNING that says to run ``nova-gpu-restore`` and then restart
  nova-compute.

The write is one step, made again at every restore until it holds; a crash
in it leaves nothing to roll back.

The record follows what the host shows, with one guard: after a reboot
every PF shows 0 VFs, and that must not erase the record before the
restore has used it. The record is therefore only updated once the
restore of the current boot (``/proc/sys/kernel/random/boot_id``) has run
(or the agent found every recorded VF there); a PF the restore could not
enable keeps its record.
"""

from oslo_log import log as logging

from nova_gpu.agent import errors
from nova_gpu.agent import jsonstore

LOG = logging.getLogger(__name__)
STORE_NAME = 'sriov.json'
BOOT_ID_FILE = '/proc/sys/kernel/random/boot_id'


def current_boot_id(path=BOOT_ID_FILE):
    """The kernel's id of this boot; None where it cannot be read."""
    try:
        with open(path) as f:
            return f.read().strip() or None
    except OSError:
        return None


class SriovStore:
    """The VFs each PF had enabled, by PF address."""

    def __init__(self, state_dir, boot_id=None):
        self.store = jsonstore.JsonStore(state_dir, STORE_NAME, 'sriov')
        self.boot_id = boot_id or current_boot_id()

    def pfs(self):
        """``{PF address: number of VFs}``."""
        pfs = self.store.load().get('pfs') or {}
        return {a: n for a, n in pfs.items()
                if isinstance(n, int) and not isinstance(n, bool) and n > 0}

    def set(self, address, count):
        with self.store.change() as data:
            pfs = data.setdefault('pfs', {})
            if count:
                pfs[address] = int(count)
            else:
                pfs.pop(address, None)

    def restored(self, failed=()):
        """The restore of this boot ran; ``failed`` PFs keep their record
        until a later restore enables them.
        """
        with self.store.change() as data:
            data['restored_boot'] = self.boot_id
            data['failed'] = sorted(failed)

    def observe(self, sysfs):
        """Record the VFs the NVIDIA PFs have now; True when it changed.

        Nothing before the restore of this boot has run (the zeros a
        reboot leaves are not what the operator wants).
        """
        try:
            seen = sysfs.sriov_pfs()
        except OSError as e:
            LOG.warning('cannot read the SR-IOV PFs: %s', e)
            return False
        with self.store.change() as data:
            if self.boot_id is None or \
                    data.get('restored_boot') != self.boot_id:
                return False
            pfs = data.setdefault('pfs', {})
            failed = set(data.get('failed') or ())
            before = dict(pfs)
            for address, (numvfs, _total) in seen.items():
                if numvfs:
                    pfs[address] = numvfs
                    failed.discard(address)
                elif address in pfs and address not in failed:
                    del pfs[address]  # disabled by hand (sriov-manage -d)
            data['failed'] = sorted(failed)
            return pfs != before


# Why the VFs are set before nova-compute starts, for the log.
NOVA_READS_PCI_AT_START = (
    'nova-compute takes the host\'s PCI devices only when it starts, Nova '
    '34 ResourceTracker._setup_pci_tracker')


def restore_vfs(manager, store):
    """Enable the recorded VFs; ``(enabled, dropped, failed)`` lists.

    Run by ``nova-gpu-restore``, before nova-compute starts. A PF that is
    gone (or is no SR-IOV PF any more) is dropped from the record; one
    that fails stays recorded and is tried at the next restore. The VFs
    enabled are named in one WARNING: a nova-compute started before them
    must be restarted to track them.
    """
    enabled, dropped, failed, failed_pfs = [], [], [], []
    fs = manager.sysfs
    if fs is None:
        return enabled, dropped, failed
    for address, count in sorted(store.pfs().items()):
        try:
            counts = fs.sriov_counts(address)
            if counts is None:
                LOG.warning('PF %s is gone or has no SR-IOV: its %d VFs '
                            'are not enabled again (record dropped)',
                            address, count)
                store.set(address, None)
                dropped.append(address)
                continue
            if counts[0] == count:
                continue
            manager.enable_vfs(address, count)
            enabled.append(address)
        except (errors.AgentError, OSError, ValueError) as e:
            LOG.error('PF %s: %d VFs not enabled again: %s', address,
                      count, e)
            failed.append('%s: %s' % (address, e))
            failed_pfs.append(address)
    store.restored(failed=failed_pfs)
    if enabled:
        LOG.warning('SR-IOV VFs enabled: %s. %s: nova-compute must start '
                    'after this (nova-gpu-restore.service is ordered before '
                    'it); if it is running, restart it so that it tracks '
                    'them', '; '.join(_vfs_of(fs, pf) for pf in enabled),
                    NOVA_READS_PCI_AT_START)
    return enabled, dropped, failed


def missing_vfs(manager, store):
    """The recorded VFs the host lacks, without enabling any.

    For the agent at its start, when nova-compute may already run: VFs
    enabled then would not be Nova's until nova-compute restarts, so they
    are left to ``nova-gpu-restore``. Returns ``(missing, dropped)``:
    ``missing`` names each PF without its recorded number of VFs
    (``"<PF>: <n> VFs recorded, <m> enabled ..."``, also logged at
    WARNING), ``dropped`` the
    PFs that are gone (record dropped). When nothing is missing the
    restore of this boot counts as done, so that the record follows the
    host again; otherwise the record is kept for ``nova-gpu-restore``.
    """
    missing, dropped = [], []
    fs = manager.sysfs
    if fs is None:
        return missing, dropped
    for address, count in sorted(store.pfs().items()):
        try:
            counts = fs.sriov_counts(address)
        except OSError as e:
            counts = e
        if counts is None:
            LOG.warning('PF %s is gone or has no SR-IOV: record of its %d '
                        'VFs dropped', address, count)
            store.set(address, None)
            dropped.append(address)
            continue
        present = None if isinstance(counts, OSError) else counts[0]
        if present == count:
            continue
        why = ('%s: %d VFs recorded, %s enabled; not enabled by the agent '
               'while nova-compute may run (%s): run nova-gpu-restore, then '
               'restart nova-compute' % (
                   address, count,
                   'unknown' if present is None else present,
                   NOVA_READS_PCI_AT_START))
        LOG.warning('SR-IOV VFs missing on PF %s', why)
        missing.append(why)
    if not missing:
        store.restored()
    return missing, dropped


def _vfs_of(fs, pf):
    """``"<PF> (<VF>, ...)"`` for the log; the PF alone if unreadable."""
    try:
        vfs = fs.pci_function(pf).vfs
    except (errors.AgentError, OSError):
        vfs = ()
    return '%s (%s)' % (pf, ', '.join(vfs)) if vfs else pf
