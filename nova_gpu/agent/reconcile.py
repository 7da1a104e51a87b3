"""Bring the host's GPU devices in line with what the domains need.

At start and then periodically:

* roll back: an operation recorded in the intent journal
  (``nova_gpu.agent.journal``) whose process died before it finished is
  undone: a half-made mdev is stopped and undefined, a VF's vGPU type is
  cleared, a MIG GPU instance is destroyed with its compute instances
  (through NVML), a cut-short MIG mode switch is set back; a cut-short
  removal is finished. Done whatever
  ``remove_orphans`` says: these devices were never handed to anyone;
* adopt: an active mdev libvirt only knows as transient (made by hand or
  by an older agent) is defined persistently when a domain uses it;
* start: a persistent mdev that is not active (after a reboot) is started
  when it is autostart or a domain references it;
* orphans (``remove_orphans``): an mdev, a VF with a vGPU type, or a MIG
  GPU instance that nothing uses, for longer than the grace period, is
  removed. When each was first seen unused is kept in the journal, so the
  grace period survives agent restarts;
* a device in use is never touched: an mdev or PCI function (VF)
  referenced by any defined domain (running or not, live or persistent
  XML), a MIG GPU instance with a vGPU on it, or one NVML cannot say of.
"""

import dataclasses
import time

from oslo_log import log as logging
import tenacity

from nova_gpu.agent import devices
from nova_gpu.agent import errors

LOG = logging.getLogger(__name__)


@dataclasses.dataclass
class ReconcileResult:
    adopted: list = dataclasses.field(default_factory=list)
    started: list = dataclasses.field(default_factory=list)
    removed: list = dataclasses.field(default_factory=list)
    rolled_back: list = dataclasses.field(default_factory=list)
    in_use: list = dataclasses.field(default_factory=list)
    # unused MIG instances kept: the layout planner carved them ahead
    carved: list = dataclasses.field(default_factory=list)
    waiting: list = dataclasses.field(default_factory=list)
    # mdevs only libvirt lists (devices.is_stale_libvirt_entry): nothing
    # to remove on the host; shown, so that nobody takes them for leaks
    libvirt_stale: list = dataclasses.field(default_factory=list)
    errors: list = dataclasses.field(default_factory=list)

    def as_dict(self):
        return dataclasses.asdict(self)


def _retrying(attempts):
    """Retry a rollback step while libvirtd is briefly away."""
    return tenacity.Retrying(
        retry=tenacity.retry_if_exception_type(errors.Unavailable),
        stop=tenacity.stop_after_attempt(attempts),
        wait=tenacity.wait_exponential(multiplier=0.2, max=2),
        reraise=True)


# What "unused" may remove. Only mdevs by default: Nova makes and reuses
# mdevs itself, while a vendor-VFIO VF's vGPU type and a MIG GPU instance
# are set up ahead of any guest (the type of a PCI-in-Placement pool, an
# operator's or the planner's MIG layout) and an unused one is capacity,
# not a leak.
ORPHAN_MDEV = 'mdev'
ORPHAN_VF_TYPE = 'vf_type'
ORPHAN_MIG = 'mig_instance'
ORPHAN_KINDS = (ORPHAN_MDEV, ORPHAN_VF_TYPE, ORPHAN_MIG)


class Reconciler:
    def __init__(self, manager, remove_orphans=True, grace_period=300,
                 clock=time.time, retries=3, layouts=None,
                 orphan_kinds=(ORPHAN_MDEV,)):
        """``layouts``: a callable returning the carved layouts
        (``{GPU address: core.layout.Layout}``, the carver's store), whose
        GPU instances are kept though no guest uses them yet.
        ``orphan_kinds``: which unused devices are removed (see
        ``ORPHAN_KINDS``); cut-short operations are rolled back whatever
        this says.
        """
        unknown = set(orphan_kinds) - set(ORPHAN_KINDS)
        if unknown:
            raise ValueError('unknown orphan kinds %s (allowed: %s)' % (
                ', '.join(sorted(unknown)), ', '.join(ORPHAN_KINDS)))
        self.orphan_kinds = frozenset(orphan_kinds)
        self.manager = manager
        self.layouts = layouts
        self.remove_orphans = remove_orphans
        self.grace_period = grace_period
        self.clock = clock
        self.retries = retries
        self._stale_seen = {}  # mdevs only libvirt lists: cycles seen

    @property
    def journal(self):
        return self.manager.journal

    def run(self):
        lv = self.manager.libvirt
        result = ReconcileResult()
        refs = lv.domain_refs() if lv is not None else None
        if refs is not None:
            self._rollback(refs, result)
            self._mdevs(refs, result)
            self._vfs(refs, result)
        self._migs(result)
        if any((result.adopted, result.started, result.removed,
                result.rolled_back)):
            LOG.info('reconcile: rolled back %s, adopted %s, started %s, '
                     'removed %s', result.rolled_back, result.adopted,
                     result.started, result.removed)
        return result

    def roll_back(self):
        """Only the journal pass: undo what a killed operation left.

        The restore at boot runs it first: an intent a killed restore left
        (a MIG mode switch, a GPU instance) must be undone *before* the
        restore makes the device again, not after (that would undo the
        restore's own work).
        """
        result = ReconcileResult()
        lv = self.manager.libvirt
        if lv is not None:
            self._rollback(lv.domain_refs(), result)
        return result

    # -- journal ----------------------------------------------------------

    def _rollback(self, refs, result):
        self._failed = set()
        for key, intent in self.journal.abandoned():
            op, args = intent['op'], intent['args']
            what = '%s %s' % (op, ', '.join(
                '%s=%s' % kv for kv in sorted(args.items())))
            try:
                outcome = _retrying(self.retries)(self._undo, op, args, refs)
            except (errors.AgentError, OSError, ValueError) as e:
                LOG.error('cannot roll back the cut-short %s: %s (retried '
                          'at the next reconcile)', what, e)
                result.errors.append('%s: %s' % (what, e))
                # left for the next rollback, not the other passes
                self._failed.add(_device_name(op, args))
                continue
            if outcome == 'in use':
                LOG.warning('cut-short %s: the device is in use now; kept',
                            what)
            elif outcome == 'removed':
                LOG.warning('rolled back the cut-short %s', what)
                result.rolled_back.append(_device_name(op, args))
            self.journal.done(key)

    def _undo(self, op, args, refs):
        m = self.manager
        if op in ('mdev_create', 'mdev_remove'):
            return m.rollback_mdev(args['uuid'], refs)
        if op in ('vf_create', 'vf_remove'):
            return m.rollback_vf(args['vf'], refs)
        if op == 'mig_mode':
            return m.rollback_mig_mode(args, refs)
        return m.rollback_mig(args)

    # -- mdevs ------------------------------------------------------------

    def _busy(self):
        """Devices an operation of a live process is changing now."""
        return {str(v) for i in self.journal.in_flight()
                for k, v in i['args'].items() if k in ('uuid', 'vf')} | \
            getattr(self, '_failed', set())

    def _mdevs(self, refs, result):
        lv = self.manager.libvirt
        sysfs = self.manager.sysfs
        known = lv.mdevs()
        active = sysfs.mdevs()
        busy = self._busy()
        unused = []
        for uuid in sorted(set(known) | set(active)):
            info = known.get(uuid)
            try:
                if uuid in refs:
                    result.in_use.append(uuid)
                    if info is None or not info['persistent']:
                        self._adopt(uuid, info, active.get(uuid))
                        result.adopted.append(uuid)
                        info = lv.mdevs().get(uuid)
                    if info and not sysfs.mdev_active(uuid):
                        self.manager.start_mdev(info['name'], uuid)
                        result.started.append(uuid)
                    continue
                if uuid in busy:
                    continue
                if devices.is_stale_libvirt_entry(info, uuid in active):
                    if self._stale_entry(uuid, info):
                        result.libvirt_stale.append(uuid)
                    continue
                if info and info['persistent'] and info['autostart'] \
                        and not sysfs.mdev_active(uuid):
                    self.manager.start_mdev(info['name'], uuid)
                    result.started.append(uuid)
                unused.append(uuid)
            except errors.AgentError as e:
                LOG.error('reconcile of mdev %s failed: %s', uuid, e)
                result.errors.append('%s: %s' % (uuid, e))
        # forget what is no longer listed (bounded by libvirt's list)
        for uuid in set(self._stale_seen) - set(known):
            del self._stale_seen[uuid]
        if ORPHAN_MDEV not in self.orphan_kinds:
            unused = []
        for uuid in self._expired('mdev', unused, result):
            try:
                self.manager.remove_mdev(uuid, refs=refs)
                result.removed.append(uuid)
            except errors.AgentError as e:
                LOG.error('removing orphan mdev %s failed: %s', uuid, e)
                result.errors.append('%s: %s' % (uuid, e))

    def _stale_entry(self, uuid, info):
        """Handle an mdev only libvirt lists; True if it stays listed.

        Seen in one cycle, it may be an mdev removed a moment ago (libvirt
        forgets it on udev's word): the next cycle tries once to clear it
        (``DeviceManager.clear_stale_entry``), then warns; not every cycle.
        """
        seen = self._stale_seen.get(uuid, 0) + 1
        self._stale_seen[uuid] = seen
        if seen == 2:
            if self.manager.clear_stale_entry(uuid, info):
                del self._stale_seen[uuid]
                return False
            LOG.warning(devices.STALE_ENTRY, uuid)
        return True

    def _expired(self, scope, unused, result):
        """Unused devices past the grace period (first-seen times are kept
        in the journal); the rest are listed as waiting.
        """
        if not self.remove_orphans:
            return []
        seen = self.journal.first_seen(scope, unused, now=self.clock())
        now = self.clock()
        expired = []
        for name in unused:
            if now - seen[name] < self.grace_period:
                result.waiting.append(name)
            else:
                expired.append(name)
        return expired

    def _adopt(self, uuid, info, mdev):
        if mdev is None:
            raise errors.NotFound('mdev %s is referenced but neither libvirt '
                                  'nor sysfs has it' % uuid)
        lv = self.manager.libvirt
        name = lv.define_mdev(mdev.parent, mdev.type_id, uuid)
        # already active: this only sets autostart (mdevctl starts it at
        # boot), once libvirt's list shows the new definition
        lv.start_device(name, autostart=True)
        self.manager.wait_for(
            lambda: (lv.mdevs().get(uuid) or {}).get('persistent'),
            'libvirt to list mdev %s as persistent' % uuid)

    # -- NVIDIA vendor VFIO VFs -------------------------------------------

    def _vfs(self, refs, result):
        busy = self._busy()
        unused = []
        for addr, fn in sorted(self.manager.sysfs.nvidia_gpus().items()):
            if not fn.physfn or not fn.current_vgpu_type:
                continue
            if addr in refs:
                result.in_use.append(addr)
            elif addr not in busy:
                unused.append(addr)
        if ORPHAN_VF_TYPE not in self.orphan_kinds:
            unused = []
        for addr in self._expired('vf', unused, result):
            try:
                self.manager.remove_vf_vgpu(addr, refs=refs)
                result.removed.append(addr)
            except (errors.AgentError, OSError) as e:
                LOG.error('clearing the vGPU type of orphan VF %s failed: '
                          '%s', addr, e)
                result.errors.append('%s: %s' % (addr, e))

    # -- MIG --------------------------------------------------------------

    def _migs(self, result):
        nvml = self.manager.nvml
        if nvml is None or not nvml.available:
            return
        if self.manager.libvirt is None:
            return  # cannot see domains: treat everything as in use
        busy = {(i['args'].get('gpu'), i['args'].get('start'))
                for i in self.journal.in_flight()
                if i['op'].startswith('mig_')}
        unused = {}
        carved = self._carved_instances()
        for gpu in nvml.gpus():
            if not gpu.mig_enabled:
                continue
            used = nvml.mig_in_use(gpu.index)
            for inst in gpu.mig_instances:
                name = '%s/%d@%d' % (gpu.address, inst.gi_id, inst.start)
                if used is None or inst.gi_id in used:
                    result.in_use.append(name)
                elif (gpu.address, inst.start) in carved:
                    result.carved.append(name)
                elif (gpu.address, inst.start) not in busy:
                    unused[name] = (gpu.index, inst.gi_id)
        if ORPHAN_MIG not in self.orphan_kinds:
            unused = {}
        for name in self._expired('mig', list(unused), result):
            index, gi_id = unused[name]
            try:
                self.manager.remove_mig(index, gi_id)
                result.removed.append(name)
            except errors.AgentError as e:
                LOG.error('removing orphan MIG instance %s failed: %s',
                          name, e)
                result.errors.append('%s: %s' % (name, e))

    def _carved_instances(self):
        """``{(GPU address, start slice)}`` of the saved MIG layouts."""
        if self.layouts is None:
            return set()
        return {(addr, start) for addr, layout in self.layouts().items()
                for _profile, start, _type in layout.instances}


def _device_name(op, args):
    if op.startswith('mdev_'):
        return args['uuid']
    if op.startswith('vf_'):
        return args['vf']
    if op == 'mig_mode':
        return '%s/mig-mode' % args.get('gpu')
    return '%s/%s@%s' % (args.get('gpu'), args.get('gi_id'),
                         args.get('start'))
