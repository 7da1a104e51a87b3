"""GPU health: which faults quarantine a GPU, and what clears them.

The agent samples NVML for each GPU (``Sample``: critical Xid events,
uncorrectable ECC counts, pending page retirement and row remapping, and
clock slowdown reasons) and folds each sample into the GPU's ``Health``
(``observe``), which it persists and reports. A GPU with a fault NVIDIA
says needs a GPU reset, a reboot or a replacement is *quarantined*: it
offers no device to new guests (``core.fragmentation.unit_slots``, the one
capacity rule every consumer uses), while guests already on it keep
running. Placement stays the authority on what is allocated; the
quarantine only keeps new guests off (see doc/source/operations.rst,
"GPU health and quarantine", for why the scheduler rather than
Placement inventory or traits).

Actions follow NVIDIA's Xid catalogue's resolution buckets
(https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html) and
its dynamic page retirement and row remapping guides
(https://docs.nvidia.com/deploy/dynamic-page-retirement/, "XID 48 / 63 /
64"):

* ``reset``: a GPU reset (or a driver reload, or a reboot) clears it. The
  quarantine lifts by itself once the agent sees the evidence the fault
  needs (``Fault.clears``): the volatile uncorrectable ECC count back at
  0 (NVML zeroes volatile counters at a reset) for ECC faults, the pending
  retirement / remapping flags cleared for pending ones, another host boot
  for the rest (a GPU reset that NVML cannot show: an operator clears).
* ``reboot``: the GPU fell off the bus (Xid 79); the quarantine lifts once
  the host booted again.
* ``replace``: a retirement or remapping *failure* (Xid 64, NVML's
  ``failureOccurred``): only an operator clears it (``nova-gpu quarantine
  clear``), after servicing the board.
* ``watch``: thermal or power slowdown, a high single-bit ECC rate: shown
  and counted, no quarantine.

No OpenStack here: the agent, the scheduler's view and the exporter all
read the same rule.
"""

import dataclasses

RESET = 'reset'
REBOOT = 'reboot'
REPLACE = 'replace'
WATCH = 'watch'
QUARANTINING = (RESET, REBOOT, REPLACE)

# Xid -> (what it is, action). Only the hardware Xids a cloud acts on;
# application Xids (13, 31, 43, 45...) and contained errors the driver
# recovered from by killing the application (94) leave the GPU in
# service.
XIDS = {
    48: ('double-bit ECC error', RESET),
    63: ('page retirement or row remapping pending', RESET),
    64: ('page retirement or row remapping failure', REPLACE),
    74: ('NVLink error', RESET),
    79: ('GPU has fallen off the bus', REBOOT),
    92: ('high single-bit ECC error rate', WATCH),
    95: ('uncontained ECC error', RESET),
    119: ('GSP RPC timeout', RESET),
    120: ('GSP error', RESET),
    140: ('unrecovered ECC error', RESET),
}

# Fault kinds from counters (no Xid).
ECC = 'ecc_uncorrectable'
RETIRE_PENDING = 'page_retirement_pending'
REMAP_PENDING = 'row_remapping_pending'
REMAP_FAILURE = 'row_remapping_failure'
SLOWDOWN = 'clock_slowdown'
XID = 'xid'
MAX_FAULTS = 32


@dataclasses.dataclass
class Sample:
    """What NVML said of one GPU in one pass.

    None: not supported by this GPU, or not read.
    """

    xids: tuple = ()                 # critical Xid codes since last pass
    ecc_volatile: int = None         # uncorrectable, since the last reset
    retired_pending: bool = None
    remap_pending: bool = None
    remap_failure: bool = None
    slowdown: tuple = ()             # names of the active slowdown reasons
    boot_id: str = None              # the host's boot (a reboot resets GPUs)


# What shows a fault is gone (Fault.clears): the volatile uncorrectable
# ECC count back at 0, the pending flags cleared, another host boot, or
# only an operator.
BY_ECC, BY_PENDING, BY_BOOT, BY_OPERATOR = 'ecc', 'pending', 'boot', \
    'operator'
_CLEARS = {48: BY_ECC, 63: BY_PENDING, 95: BY_ECC, 140: BY_ECC}


@dataclasses.dataclass
class Fault:
    kind: str
    action: str
    detail: str
    since: float
    code: int = None
    clears: str = BY_OPERATOR
    boot_id: str = None      # the host's boot when the fault was seen

    def to_dict(self):
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data):
        return cls(str(data['kind']), str(data['action']),
                   str(data['detail']), float(data['since']),
                   None if data.get('code') is None else int(data['code']),
                   str(data.get('clears') or BY_OPERATOR),
                   data.get('boot_id'))


@dataclasses.dataclass
class Health:
    """One GPU's faults; quarantined while one of them quarantines."""

    faults: list = dataclasses.field(default_factory=list)
    cleared: list = dataclasses.field(default_factory=list)  # evidence

    @property
    def quarantined(self):
        return any(f.action in QUARANTINING for f in self.faults)

    def reason(self):
        """One line naming the faults that quarantine the GPU, or None."""
        held = [f for f in self.faults if f.action in QUARANTINING]
        if not held:
            return None
        text = '; '.join('%s (%s, since %s)' % (f.detail, _needs(f.action),
                                                when(f.since))
                         for f in held)
        # The report's strings are bounded (core.report.MAX_NAME).
        return text if len(text) <= 250 else text[:247] + '...'

    def to_dict(self):
        return {'quarantined': self.quarantined, 'reason': self.reason(),
                'faults': [f.to_dict() for f in self.faults],
                'cleared': list(self.cleared[-MAX_FAULTS:])}

    @classmethod
    def from_dict(cls, data):
        return cls([Fault.from_dict(f) for f in data.get('faults') or ()],
                   list(data.get('cleared') or ()))


def _needs(action):
    return {RESET: 'needs a GPU reset', REBOOT: 'needs a reboot',
            REPLACE: 'needs service or replacement'}.get(action, action)


def when(ts):
    """An epoch time as ISO 8601 UTC (what the records and the log show)."""
    import datetime
    return datetime.datetime.fromtimestamp(
        ts, datetime.timezone.utc).strftime('%Y-%m-%dT%H:%M:%SZ')


def _add(faults, fault):
    """Keep the first time of a fault of the same kind and code."""
    for held in faults:
        if (held.kind, held.code) == (fault.kind, fault.code):
            return
    faults.append(fault)
    del faults[:-MAX_FAULTS]


def observe(health, sample, now):
    """The GPU's health after ``sample`` (a new ``Health``).

    A fault goes when the sample shows the evidence its kind needs
    (``Fault.clears``): the volatile uncorrectable ECC count back at 0
    (NVML zeroes it at a GPU reset), the pending retirement and remapping
    flags cleared, or another host boot (a reboot resets every GPU); the
    evidence is recorded in ``cleared``. Faults needing service stay until
    ``clear``.
    """
    cleared = list(health.cleared)
    faults = []
    for f in health.faults:
        evidence = _evidence(f, sample)
        if evidence and not sample.xids:
            cleared.append('%s: %s cleared (%s)'
                           % (when(now), f.detail, evidence))
        elif f.kind != SLOWDOWN:  # a slowdown is a state: re-read below
            faults.append(dataclasses.replace(f))
    boot = sample.boot_id
    for code in sample.xids:
        what, action = XIDS.get(code, (None, None))
        if what is not None:
            clears = _CLEARS.get(code, BY_BOOT if action in (RESET, REBOOT)
                                 else BY_OPERATOR)
            _add(faults, Fault(XID, action, 'Xid %d: %s' % (code, what),
                               now, code, clears, boot))
    if sample.ecc_volatile:
        _add(faults, Fault(ECC, RESET, 'uncorrectable ECC errors since the '
                           'last reset', now, None, BY_ECC, boot))
    if sample.retired_pending:
        _add(faults, Fault(RETIRE_PENDING, RESET, 'retired pages pending',
                           now, None, BY_PENDING, boot))
    if sample.remap_pending:
        _add(faults, Fault(REMAP_PENDING, RESET, 'row remapping pending',
                           now, None, BY_PENDING, boot))
    if sample.remap_failure:
        _add(faults, Fault(REMAP_FAILURE, REPLACE, 'row remapping failed',
                           now, None, BY_OPERATOR, boot))
    if sample.slowdown:
        _add(faults, Fault(SLOWDOWN, WATCH, 'clocks slowed down: %s'
                           % ', '.join(sorted(sample.slowdown)), now))
    return Health(faults, cleared[-MAX_FAULTS:])


def _evidence(fault, sample):
    """What in ``sample`` shows ``fault`` is gone, or None."""
    if fault.clears == BY_OPERATOR:
        return None
    if (fault.boot_id and sample.boot_id
            and sample.boot_id != fault.boot_id):
        return 'the host rebooted'
    if fault.clears == BY_ECC and sample.ecc_volatile == 0:
        return 'volatile uncorrectable ECC count back at 0'
    if fault.clears == BY_PENDING:
        # Read, and false: a flag NVML could not read this time (or that
        # the GPU lacks) is no evidence; the fault then waits for a reboot
        # or an operator.
        flags = {RETIRE_PENDING: (sample.retired_pending,),
                 REMAP_PENDING: (sample.remap_pending,)}.get(
            fault.kind, (sample.retired_pending, sample.remap_pending))
        if all(flag is False for flag in flags):
            return 'no retired pages or row remapping pending'
    return None


def clear(health, who, now):
    """An operator's clear: every fault goes, with the evidence line."""
    if not health.faults:
        return health
    cleared = list(health.cleared) + ['%s: cleared by %s: %s' % (
        when(now), who, '; '.join(f.detail for f in health.faults))]
    return Health([], cleared[-MAX_FAULTS:])
