"""Bring the host's mdevs in line with what the domains need.

At start and then periodically:

* adopt: an active mdev libvirt only knows as transient (made by hand or
  by an older agent) is defined persistently when a domain uses it;
* start: a persistent mdev that is not active (after a reboot) is started
  when it is autostart or a domain references it;
* orphans: an mdev that no domain references, running or not, for longer
  than the grace period is removed;
* a device that any defined domain references is never touched.
"""

import dataclasses
import time

from oslo_log import log as logging

from nova_gpu.agent import errors

LOG = logging.getLogger(__name__)


@dataclasses.dataclass
class Result:
    adopted: list = dataclasses.field(default_factory=list)
    started: list = dataclasses.field(default_factory=list)
    removed: list = dataclasses.field(default_factory=list)
    in_use: list = dataclasses.field(default_factory=list)
    waiting: list = dataclasses.field(default_factory=list)
    errors: list = dataclasses.field(default_factory=list)

    def as_dict(self):
        return dataclasses.asdict(self)


class Reconciler:
    def __init__(self, manager, remove_orphans=True, grace_period=300,
                 clock=time.monotonic):
        self.manager = manager
        self.remove_orphans = remove_orphans
        self.grace_period = grace_period
        self.clock = clock
        self._unused_since = {}

    def run(self):
        lv = self.manager.libvirt
        sysfs = self.manager.sysfs
        result = Result()
        refs = lv.domain_refs()
        known = lv.mdevs()
        active = sysfs.mdevs()
        now = self.clock()
        for uuid in sorted(set(known) | set(active)):
            info = known.get(uuid)
            used = uuid in refs
            try:
                if used:
                    result.in_use.append(uuid)
                    self._unused_since.pop(uuid, None)
                    if info is None or not info['persistent']:
                        self._adopt(uuid, info, active.get(uuid))
                        result.adopted.append(uuid)
                        info = lv.mdevs().get(uuid)
                    if info and not sysfs.mdev_active(uuid):
                        self.manager.start_mdev(info['name'], uuid)
                        result.started.append(uuid)
                    continue
                if info and info['persistent'] and info['autostart'] \
                        and not sysfs.mdev_active(uuid):
                    self.manager.start_mdev(info['name'], uuid)
                    result.started.append(uuid)
                if not self.remove_orphans:
                    continue
                since = self._unused_since.setdefault(uuid, now)
                if now - since < self.grace_period:
                    result.waiting.append(uuid)
                    continue
                self.manager.remove_mdev(uuid, refs=refs)
                self._unused_since.pop(uuid, None)
                result.removed.append(uuid)
            except errors.AgentError as e:
                LOG.error('reconcile of mdev %s failed: %s', uuid, e)
                result.errors.append('%s: %s' % (uuid, e))
        for uuid in list(self._unused_since):
            if uuid not in known and uuid not in active:
                del self._unused_since[uuid]
        if any((result.adopted, result.started, result.removed)):
            LOG.info('reconcile: adopted %s, started %s, removed %s',
                     result.adopted, result.started, result.removed)
        return result

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
