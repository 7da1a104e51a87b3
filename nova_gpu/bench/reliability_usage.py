"""Reliability: usage for billing through outages, restarts and migrations.

Part ``usage`` of ``nova_gpu.bench.reliability``. Each round plays a day
of a small cloud (4 hosts, 16 servers, each holding one vGPU for a random
span, a third of them live-migrated once, with both hosts holding a
device for ``OVERLAP`` seconds) into the exporter's ledger
(``core.usage.Ledger``) as the exporter does: one observation per host
report, every ``INTERVAL`` seconds with jitter, while

* reports are lost (an agent or broker outage: a host's observations
  stop for up to ``OUTAGE`` seconds);
* the exporter restarts: the ledger goes back to its last saved form
  (``to_dict`` / ``from_dict``, saved every ``SAVE_EVERY`` seconds, as
  ``[gpu_exporter] usage_write_interval``), losing what it took since.

Each server's true time is known (its span). Measured against it, per
session, with the error the rule allows (``core.usage``: each end late by
up to the longest gap between two observations of the host around it,
and, where the exporter restarted just after an end, by what it had not
saved yet: up to ``SAVE_EVERY`` plus two intervals; at a migration the
source counts until its last report and the destination from its first,
so an outage of either there goes uncounted):

* seconds counted twice (two sessions of a server overlapping, or more
  than the span plus the allowed error; target 0);
* seconds lost (less than the span minus the allowed error; target 0);
* the mean and largest error of a server's total, in seconds.

In process, a few seconds.
"""

import random

from nova_gpu.bench import reliability
from nova_gpu.core import usage

PART = 'usage'
ROUNDS, QUICK_ROUNDS = 20, 5
DAY = 86400.0
INTERVAL = 60.0
JITTER = 5.0
OUTAGE = 600.0
OVERLAP = 10.0
SAVE_EVERY = 60.0
HOSTS = ('h1', 'h2', 'h3', 'h4')
SERVERS = 16
SEED = 20261204


def _holding(server):
    return usage.Holding(server, 'A100-40GB', 'A100-10C', 'vgpu', 0.25, 10.0)


def _plan(rng):
    """[(server, [(host, start, end)...], true start, true end)]."""
    plans = []
    for n in range(SERVERS):
        server = 'srv-%02d' % n
        start = rng.uniform(0, DAY * 0.8)
        end = start + rng.uniform(600, DAY * 0.2)
        host = rng.choice(HOSTS)
        if rng.random() < 1 / 3:
            move = rng.uniform(start + 120, end - 120)
            other = rng.choice([h for h in HOSTS if h != host])
            spans = [(host, start, move + OVERLAP), (other, move, end)]
        else:
            spans = [(host, start, end)]
        plans.append((server, spans, start, end))
    return plans


def play(rng):
    """One round: (per server (true s, counted s, allowed error s),
    overlapping seconds, restarts, outages).
    """
    plans = _plan(rng)
    ledger = usage.Ledger(max_interval=3 * INTERVAL)
    saved = ledger.to_dict()
    times = {h: [] for h in HOSTS}  # observation times of each host
    restarts = outages = 0
    t, last_save = 0.0, 0.0
    down_until = {h: -1.0 for h in HOSTS}
    restart_times = []
    events = []
    for host in HOSTS:
        at = rng.uniform(0, INTERVAL)
        while at < DAY:
            events.append((at, host))
            at += INTERVAL + rng.uniform(-JITTER, JITTER)
    for t, host in sorted(events):
        if t >= last_save + SAVE_EVERY:
            saved, last_save = ledger.to_dict(), t
        if rng.random() < 0.002:
            ledger = usage.Ledger.from_dict(saved, max_interval=3 * INTERVAL)
            restarts += 1
            restart_times.append(t)
        if t < down_until[host]:
            continue
        if rng.random() < 0.003:
            down_until[host] = t + rng.uniform(INTERVAL, OUTAGE)
            outages += 1
            continue
        held = {}
        for server, spans, _a, _b in plans:
            for h, a, b in spans:
                if h == host and a <= t < b:
                    held['%s:%s' % (host, server)] = _holding(server)
        ledger.observe(host, t, held)
        times[host].append(t)
    results = []
    overlap = 0.0
    for server, spans, a, b in plans:
        rows = ledger.usage(0, DAY * 2, server=server)
        counted = sum(r['seconds'] for r in rows)
        sessions = sorted((s.start, s.end) for s in ledger.sessions
                          if s.server == server)
        for (_s0, e0), (s1, _e1) in zip(sessions, sessions[1:]):
            overlap += max(0.0, e0 - s1)
        allowed = 0.0
        for edge in (a, b):
            allowed += max(_gap(times[h], edge) for h, _x, _y in spans)
            # A restart forgets what the ledger took since its last save:
            # an attachment first seen then starts at the next report.
            if any(edge <= r <= edge + SAVE_EVERY + 2 * INTERVAL
                   for r in restart_times):
                allowed += SAVE_EVERY + 2 * INTERVAL
        # A migration: the destination counts from its first report, so
        # its reports' gap there (an outage) is not counted, nor what a
        # restart right after it forgot.
        for (source, _a, end), (host, start, _b) in zip(spans, spans[1:]):
            allowed += _gap(times[source], end) + _gap(times[host], start)
            if any(start <= r <= start + SAVE_EVERY + 2 * INTERVAL
                   for r in restart_times):
                allowed += SAVE_EVERY + 2 * INTERVAL
        results.append((b - a, counted, allowed))
    return results, overlap, restarts, outages


def _gap(times, edge):
    """The longest gap between two observations around ``edge``."""
    before = [t for t in times if t <= edge]
    after = [t for t in times if t > edge]
    lo = before[-1] if before else 0.0
    hi = after[0] if after else DAY
    return hi - lo


def run(quick=False):
    rng = random.Random(SEED)
    twice = lost = 0.0
    errors = []
    restarts = outages = sessions = 0
    for _n in range(QUICK_ROUNDS if quick else ROUNDS):
        results, overlap, r, o = play(rng)
        restarts += r
        outages += o
        twice += overlap
        for true, counted, allowed in results:
            sessions += 1
            errors.append(abs(counted - true))
            twice += max(0.0, counted - true - allowed)
            lost += max(0.0, true - allowed - counted)
    fig = reliability.Figure
    return [
        fig(PART, 'server sessions / exporter restarts / report outages',
            '%d / %d / %d' % (sessions, restarts, outages), '-', True),
        fig(PART, 'seconds counted twice', round(twice, 1), '0',
            twice == 0),
        fig(PART, 'seconds lost', round(lost, 1), '0', lost == 0),
        fig(PART, 'error of a server\'s total, mean / max (s)',
            '%.1f / %.1f' % (sum(errors) / len(errors), max(errors)),
            '-', True),
    ]


if __name__ == '__main__':
    import sys

    sys.exit(reliability.part_main(PART, run))
