"""Reliability: GPU faults, resets, reboots and agent restarts.

Part ``health`` of ``nova_gpu.bench.reliability``. Each round runs an HGX
H100 board of 8 GPUs faked at NVML's boundary (``nova_gpu/tests/unit/agent/
fakenvml.py``: events through an event set, ``NVML_ERROR_TIMEOUT`` when
it is empty, counters, ``NVML_ERROR_NOT_SUPPORTED`` on GPUs without them)
through the agent's health pass (``agent.health.HealthWatch``) for
``STEPS`` cycles. Before each cycle, drawn at random:

* a hardware fault on one GPU as the driver shows it: Xid 48 / 95 / 140
  with the volatile uncorrectable ECC count raised, Xid 63 with retired
  pages pending, Xid 64 with a row remapping failure, Xid 74 / 119 / 120
  / 79 alone; or a harmless event: an application Xid (13, 31, 43, 94), a
  thermal slowdown;
* a GPU reset (NVML zeroes the volatile counters and pending flags), a
  host reboot (every GPU reset, a new boot id, the event set gone), an
  agent restart (a new watch on the same state directory), an operator's
  ``clear`` of a quarantined GPU;
* an NVML counter read failing on one GPU for that cycle (an NVML error
  other than "not supported").

Each GPU's expected state follows the actions alone (a reset lifts the
ECC and pending faults, a reboot every fault but a remapping failure, a
clear every fault), not the evidence the agent reads, and is compared
after every cycle with what the watch reports:

* healthy GPUs quarantined (target 0): never given a quarantining fault,
  or given only harmless ones, or lifted by an action;
* quarantines missed (target 0): a quarantining fault not held after the
  cycle that saw it, or lost across an agent restart or a reboot that
  does not clear it;
* quarantines lifted by a failed NVML read (target 0).

Everything runs in process, in about a second.
"""

import random
import tempfile

import pynvml

from nova_gpu.agent import health as health_mod
from nova_gpu.agent import nvml as nvml_mod
from nova_gpu.bench import reliability

PART = 'health'
ROUNDS = 40
QUICK_ROUNDS = 8
STEPS = 60
SEED = 20261204
# Faults and what lifts them: 'reset' (ECC / pending: a GPU reset or a
# reboot), 'boot' (a reboot), 'operator' (a clear only).
FAULTS = {48: 'reset', 95: 'reset', 140: 'reset', 63: 'reset',
          74: 'boot', 119: 'boot', 120: 'boot', 79: 'boot', 64: 'operator'}
HARMLESS = (13, 31, 43, 94)
COUNTERS = ('nvmlDeviceGetTotalEccErrors',
            'nvmlDeviceGetRetiredPagesPendingStatus',
            'nvmlDeviceGetRemappedRows')


class Round:
    def __init__(self, rng, state_dir):
        from nova_gpu.tests.unit.agent import fakenvml
        self.rng = rng
        self.lib = fakenvml.hgx_h100()
        self.nvml = nvml_mod.Nvml(lib=self.lib)
        self.store = health_mod.HealthStore(state_dir)
        self.boot = 0
        self.now = 1.0e9
        self.watch = self._watch()
        self.addresses = ['0000:%s:00.0' % b for b in fakenvml.H100_BUS]
        # address -> set of open lift classes ('reset', 'boot', 'operator')
        self.open = {a: set() for a in self.addresses}
        self.tally = {'faults': 0, 'harmless': 0, 'resets': 0, 'reboots': 0,
                      'restarts': 0, 'clears': 0, 'failed_reads': 0,
                      'wrong': 0, 'missed': 0, 'lifted_by_failure': 0,
                      'quarantined_seen': 0, 'lift_delayed': 0}

    def _watch(self):
        return health_mod.HealthWatch(self.nvml, self.store,
                                      boot='boot-%d' % self.boot,
                                      clock=lambda: self.now)

    def _dev(self, address):
        return self.lib.gpus[self.addresses.index(address)]

    def step(self):
        rng = self.rng
        address = rng.choice(self.addresses)
        dev = self._dev(address)
        roll = rng.random()
        if roll < 0.15:
            code = rng.choice(sorted(FAULTS))
            if code in (48, 95, 140):
                dev.ecc_volatile += 1
            elif code == 63:
                dev.retired_pending = True
            elif code == 64:
                corr, unc, pending, _failure = dev.remap
                dev.remap = (corr, unc + 1, pending, True)
            self.lib.raise_event(dev, health_mod.EVENT_XID, code)
            self.open[address].add(FAULTS[code])
            self.tally['faults'] += 1
        elif roll < 0.25:
            if rng.random() < 0.7:
                self.lib.raise_event(dev, health_mod.EVENT_XID,
                                     rng.choice(HARMLESS))
            else:
                dev.clock_reasons = 0x40
            self.tally['harmless'] += 1
        elif roll < 0.32:
            self.lib.reset_counters(dev)
            self.open[address].discard('reset')
            self.tally['resets'] += 1
        elif roll < 0.35:
            for other in self.lib.gpus:
                self.lib.reset_counters(other)
                other.clock_reasons = 0
            for held in self.open.values():
                held.discard('reset')
                held.discard('boot')
            self.boot += 1
            self.lib.event_sets = []  # the driver's sets die with the boot
            self.watch = self._watch()
            self.tally['reboots'] += 1
        elif roll < 0.40:
            self.watch = self._watch()
            self.tally['restarts'] += 1
        elif roll < 0.43 and self.open[address]:
            health_mod.clear(self.store, address, 'bench operator',
                             clock=lambda: self.now)
            # What is still true of the GPU comes back at the next cycle
            # only through new events: the counters a clear cannot reset
            # are cleared with it (the operator serviced the board).
            self.lib.reset_counters(dev)
            corr, unc, _pending, _failure = dev.remap
            dev.remap = (corr, unc, False, False)
            self.open[address].clear()
            self.tally['clears'] += 1
        failing = None
        if rng.random() < 0.1:
            failing = (rng.choice(COUNTERS), address)
            self.tally['failed_reads'] += 1
        before = {a: h.quarantined for a, h in self.store.load().items()}
        self._cycle(failing)
        after = self.store.load()
        for a in self.addresses:
            got = a in after and after[a].quarantined
            expected = bool(self.open[a])
            self.tally['quarantined_seen'] += got
            unread = failing is not None and failing[1] == a
            if got and not expected and unread:
                # The evidence of the reset could not be read this cycle:
                # the quarantine waits for the next one (conservative).
                self.tally['lift_delayed'] += 1
            elif got and not expected:
                self.tally['wrong'] += 1
            elif expected and not got:
                self.tally['missed'] += 1
                if failing and failing[1] == a and before.get(a):
                    self.tally['lifted_by_failure'] += 1
            self._dev(a).clock_reasons = 0
        self.now += 60

    def _cycle(self, failing):
        if failing is None:
            self.watch.cycle()
            return
        name, address = failing
        real = getattr(self.lib, name)
        dev = self._dev(address)

        def broken(handle, *args):
            if handle is dev:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)
            return real(handle, *args)
        setattr(self.lib, name, broken)
        try:
            self.watch.cycle()
        finally:
            setattr(self.lib, name, real)


def run(quick=False):
    rng = random.Random(SEED)
    totals = {}
    for _n in range(QUICK_ROUNDS if quick else ROUNDS):
        with tempfile.TemporaryDirectory() as state_dir:
            r = Round(rng, state_dir)
            for _s in range(STEPS):
                r.step()
            for key, value in r.tally.items():
                totals[key] = totals.get(key, 0) + value
    fig = reliability.Figure

    def zero(name, key):
        return fig(PART, name, totals[key], '0', totals[key] == 0)
    return [
        fig(PART, 'rounds x cycles (8 GPUs each)', '%d x %d' % (
            QUICK_ROUNDS if quick else ROUNDS, STEPS), '-', True),
        fig(PART, 'faults injected / harmless events', '%d / %d' % (
            totals['faults'], totals['harmless']), '-', True),
        fig(PART, 'GPU resets / reboots / agent restarts / clears',
            '%d / %d / %d / %d' % (totals['resets'], totals['reboots'],
                                   totals['restarts'], totals['clears']),
            '-', True),
        fig(PART, 'NVML counter reads failed', totals['failed_reads'], '-',
            True),
        fig(PART, 'GPU-cycles quarantined', totals['quarantined_seen'], '-',
            True),
        zero('healthy GPUs quarantined (GPU-cycles)', 'wrong'),
        fig(PART, 'lifts waiting a cycle: the evidence read failed',
            totals['lift_delayed'], '-', True),
        zero('quarantines missed or lost (GPU-cycles)', 'missed'),
        zero('quarantines lifted by a failed NVML read', 'lifted_by_failure'),
    ]


if __name__ == '__main__':
    import sys

    sys.exit(reliability.part_main(PART, run))
