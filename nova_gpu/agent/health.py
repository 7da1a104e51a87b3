"""GPU health from NVML: events and counters, folded into quarantines.

Each agent cycle, ``HealthWatch.cycle``:

1. drains NVML's event set (``nvmlEventSetWait_v2`` with a zero timeout
   until ``NVML_ERROR_TIMEOUT``: the driver queues events between
   passes) for ``nvmlEventTypeXidCriticalError`` and
   ``nvmlEventTypeDoubleBitEccError``, registered on every GPU that
   supports them (``nvmlDeviceGetSupportedEventTypes``);
2. reads each GPU's counters: volatile uncorrectable ECC errors
   (``nvmlDeviceGetTotalEccErrors``), pending page retirement
   (``nvmlDeviceGetRetiredPagesPendingStatus``), row remapping
   (``nvmlDeviceGetRemappedRows``: pending, failure) and the clock event
   reasons (``nvmlDeviceGetCurrentClocksEventReasons``, older drivers
   ``...ThrottleReasons``). A counter the GPU lacks
   (``NVML_ERROR_NOT_SUPPORTED``) is left unread, never taken for zero;
3. folds them into each GPU's ``core.health.Health`` and persists all of
   them in ``<state_dir>/health.json`` (``nova_gpu.atomic_file``), so a
   quarantine outlives an agent restart and a host reboot (after a
   reboot, the faults a reboot clears go with that evidence).

The report carries each GPU's health (``health``: quarantined, reason,
faults, cleared); the scheduler's view reads ``quarantined`` and
``reason`` (``core.report``), so a quarantined GPU offers nothing to new
guests on any path. An operator clears one with ``nova-gpu quarantine
clear``, which edits the same file under the same lock.
"""

import fcntl
import json
import os
import time

from oslo_log import log as logging

from nova_gpu.agent import nvml as nvml_mod
from nova_gpu import atomic_file
from nova_gpu.core import health as health_mod

LOG = logging.getLogger(__name__)

FILE = 'health.json'
# nvml.h: nvmlEventType*, nvmlClocksEventReason*.
EVENT_DBE = 0x2
EVENT_XID = 0x8
SLOWDOWN = {0x4: 'software power cap', 0x8: 'hardware slowdown',
            0x20: 'software thermal slowdown',
            0x40: 'hardware thermal slowdown',
            0x80: 'hardware power brake'}
MAX_EVENTS = 1024  # drained per cycle at most: a storm never stalls it
BOOT_ID = '/proc/sys/kernel/random/boot_id'


def boot_id(path=BOOT_ID):
    try:
        with open(path) as f:
            return f.read().strip() or None
    except OSError:
        return None


class HealthStore:
    """``{GPU address: Health}``, persisted, shared with the CLI."""

    def __init__(self, state_dir):
        self.path = os.path.join(state_dir, FILE)

    def load(self):
        # A file that cannot be read raises (atomic_file.Unreadable):
        # never lose a quarantine silently; the file stays as it is for
        # an operator to read, and the agent keeps quarantining.
        data = atomic_file.read_json(self.path) or {}
        return {address: health_mod.Health.from_dict(h)
                for address, h in (data.get('gpus') or {}).items()}

    def save(self, healths):
        text = json.dumps({'gpus': {a: h.to_dict() for a, h in
                                    sorted(healths.items())}},
                          indent=1, sort_keys=True)
        atomic_file.write(self.path, text)

    def update(self, change):
        """``change(healths)`` under the file's lock, then saved."""
        os.makedirs(os.path.dirname(self.path) or '.', exist_ok=True)
        with open(self.path + '.lock', 'a') as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            healths = self.load()
            result = change(healths)
            self.save(healths)
            return result


class HealthWatch:
    """The agent's NVML health pass (see the module doc)."""

    def __init__(self, nvml, store, boot=None, clock=time.time):
        self.nvml = nvml
        self.store = store
        self.boot = boot if boot is not None else boot_id()
        self.clock = clock
        self._events = None
        self._registered = set()

    def cycle(self):
        """Sample every GPU NVML reads; return ``{address: Health}``."""
        if not self.nvml.available:
            return self.store.update(lambda h: dict(h))
        samples = self.samples()
        now = self.clock()

        def change(healths):
            for address, sample in samples.items():
                before = healths.get(address, health_mod.Health())
                after = health_mod.observe(before, sample, now)
                if after.quarantined and not before.quarantined:
                    LOG.error('GPU %s quarantined: %s', address,
                              after.reason())
                elif before.quarantined and not after.quarantined:
                    LOG.warning('GPU %s back in service: %s', address,
                                after.cleared[-1] if after.cleared else '')
                healths[address] = after
            return dict(healths)
        return self.store.update(change)

    def samples(self):
        """``{address: core.health.Sample}`` of the GPUs NVML reads."""
        lib = self.nvml.lib
        handles = {}
        for index in range(self.nvml._count()):
            try:
                dev = lib.nvmlDeviceGetHandleByIndex(index)
                handles[nvml_mod.normalise_bus_id(
                    lib.nvmlDeviceGetPciInfo(dev).busId)] = dev
            except lib.NVMLError:
                continue  # unreadable: discovery leaves it out already
        events = self._drain(handles)
        samples = {}
        for address, dev in handles.items():
            xids, dbe = events.get(address, ((), False))
            xids = list(xids)
            try:
                ecc = lib.nvmlDeviceGetTotalEccErrors(
                    dev, getattr(lib, 'NVML_MEMORY_ERROR_TYPE_UNCORRECTED', 1),
                    getattr(lib, 'NVML_VOLATILE_ECC', 0))
            except lib.NVMLError_GpuIsLost:
                # NVML's "GPU is lost": fallen off the bus (Xid 79), which
                # holds until the host reboots even if it answers again.
                xids.append(79)
                ecc = None
            except lib.NVMLError:
                ecc = None
            if dbe and not ecc:
                ecc = 1  # the event came before the counter moved
            pending = self._read(lib.nvmlDeviceGetRetiredPagesPendingStatus,
                                 dev)
            remap = self._read(lib.nvmlDeviceGetRemappedRows, dev)
            reasons = self._clock_reasons(dev)
            samples[address] = health_mod.Sample(
                xids=tuple(xids), ecc_volatile=ecc,
                retired_pending=None if pending is None else bool(pending),
                remap_pending=None if remap is None else bool(remap[2]),
                remap_failure=None if remap is None else bool(remap[3]),
                slowdown=tuple(name for bit, name in sorted(SLOWDOWN.items())
                               if reasons and reasons & bit),
                boot_id=self.boot)
        return samples

    def _read(self, fn, *args):
        """``fn(*args)``, None where the GPU lacks it or NVML fails."""
        lib = self.nvml.lib
        try:
            return fn(*args)
        except lib.NVMLError:
            return None

    def _clock_reasons(self, dev):
        lib = self.nvml.lib
        fn = (getattr(lib, 'nvmlDeviceGetCurrentClocksEventReasons', None)
              or getattr(lib, 'nvmlDeviceGetCurrentClocksThrottleReasons',
                         None))
        return None if fn is None else self._read(fn, dev)

    def _drain(self, handles):
        """``{address: ([Xid codes], double-bit event seen)}`` queued since
        the last pass.
        """
        lib = self.nvml.lib
        if self._events is None:
            try:
                self._events = lib.nvmlEventSetCreate()
            except lib.NVMLError as e:
                LOG.warning('NVML events unavailable (%s): health from '
                            'counters only', e)
                self._events = False
        if self._events is False:
            return {}
        for address, dev in handles.items():
            if address in self._registered:
                continue
            supported = self._read(lib.nvmlDeviceGetSupportedEventTypes, dev)
            wanted = (supported or 0) & (EVENT_XID | EVENT_DBE)
            if not wanted:
                continue
            try:
                lib.nvmlDeviceRegisterEvents(dev, wanted, self._events)
            except lib.NVMLError as e:
                LOG.warning('GPU %s: NVML events not registered (%s)',
                            address, e)
                continue
            self._registered.add(address)
        found = {}
        for _n in range(MAX_EVENTS):
            try:
                data = lib.nvmlEventSetWait_v2(self._events, 0)
            except lib.NVMLError_Timeout:
                break
            except lib.NVMLError as e:
                LOG.warning('reading NVML events failed: %s', e)
                break
            try:
                address = nvml_mod.normalise_bus_id(
                    lib.nvmlDeviceGetPciInfo(data.device).busId)
            except lib.NVMLError:
                continue
            xids, dbe = found.get(address, ([], False))
            if data.eventType & EVENT_XID:
                xids.append(int(data.eventData))
            if data.eventType & EVENT_DBE:
                dbe = True
            found[address] = (xids, dbe)
        return found


def clear(store, address, who, clock=time.time):
    """An operator's clear of GPU ``address``; the Health after it."""
    def change(healths):
        if address not in healths:
            raise KeyError(address)
        healths[address] = health_mod.clear(healths[address], who, clock())
        return healths[address]
    return store.update(change)
