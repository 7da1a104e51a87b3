"""GPU usage for billing: the accounting rule, from host reports.

A *holding* is one guest device a host's report shows held by a Nova
server (``devices[].instance``): its model, profile, its share of one GPU
and the GiB of frame buffer it has. The ``Ledger`` turns the successive
reports of every host (each an *observation*, at the time the receiver
took it) into usage per server, model and profile: seconds held,
GPU-seconds (seconds x share) and frame-buffer GiB-seconds.

The rule, for two successive observations of one host at ``t0 < t1``:

* a device shown at ``t0`` and again at ``t1``, by the same server with
  the same profile, is counted from ``t0`` to ``t1``, however long that
  is (the same server held it before and after: an agent, broker or
  receiver outage in between is no release);
* a device shown at ``t0`` and not at ``t1`` (released, or given to
  another server) is counted from ``t0`` to ``t1``, but at most
  ``max_interval`` seconds: when it went away within a long gap is not
  known, and billing more than an observation interval for it would
  charge for time it may not have been held.

Each attachment is so counted from the first observation that shows it
to the first that does not: it starts late by up to one interval and
ends late by up to one interval, so a session's error is within one
observation interval either way (bounded by ``max_interval`` after a
gap), and the errors do not add up over a long session.

One server, one host at a time: during a resize or a cold migration the
source keeps the guest's device (libvirt keeps the shut-off domain) until
the resize is confirmed, while the destination holds the new one; during
a live migration both hosts hold one. The ledger keeps a *home* host per
server, the host whose devices count: the host that showed the server
last *newly* (the destination, as soon as it is seen), or, when the home
host stops showing it, another host that still does (a reverted
resize). A holding on another host counts nothing, so no span of time is
counted twice for one server, and none is lost at the switch: the old
home counts until the switch, the new one from it.

The clock is the receiver's: one clock for all hosts (an agent's clock
may be off, and a migration compares two hosts). An observation whose
time is before the previous one of its host (the clock was set back)
counts nothing and starts again from it (``clock_steps`` counts them);
a jump forward is indistinguishable from a gap and is counted as one.

Shares (``device_size``): a whole GPU counts 1; a time-sliced vGPU
``1 / max_instances`` of its type (on a model that mixes sizes, its frame
buffer over the GPU's), as the core's capacity counts it
(``host.Gpu.used_milli``); a MIG instance (or MIG-backed vGPU) its memory
slices over the GPU's; a share its thousandths. The frame buffer is the
catalog's: the vGPU type's, the MIG profile's, the whole GPU's.

The ledger is plain data (``to_dict`` / ``from_dict``): the receiver
writes it whole and resumes from it, so that a restart neither counts
twice (the totals and each host's last observation are written together)
nor loses time (the first observation after the restart counts from the
last one written, by the rule above). Nothing here imports OpenStack.
"""

import dataclasses
import math

from nova_gpu.core import host as host_mod

VERSION = 1
MIB_PER_GIB = 1024.0
WHOLE_PROFILE = 'whole'
# Home changes kept per server: a credit looks back one observation
# interval, in which a server moves host once or twice.
MAX_HOMES = 16
DAY = 86400.0


class LedgerError(ValueError):
    """A ledger's saved form is not one this release reads."""


@dataclasses.dataclass(frozen=True)
class Holding:
    """A device held by a server, as one observation shows it."""

    server: str
    model: str
    profile: str
    kind: str
    share: float      # of one GPU
    fb_gib: float     # GiB of frame buffer

    def to_list(self):
        return [self.server, self.model, self.profile, self.kind,
                self.share, self.fb_gib]

    @classmethod
    def from_list(cls, value):
        server, model, profile, kind, share, fb = value
        return cls(str(server), str(model), str(profile), str(kind),
                   _number(share), _number(fb))


def device_size(model, kind, detail):
    """(profile label, share of one GPU, frame-buffer GiB) of a device.

    ``model``: a catalog ``GpuModel``; ``kind`` and ``detail`` as in a
    report's device (``detail``: the vGPU type, ``[MIG profile, start,
    vGPU type or None]``, the thousandths of a share, None for a whole
    GPU).
    """
    gpu_fb = model.framebuffer_mib / MIB_PER_GIB
    if kind == host_mod.WHOLE:
        return WHOLE_PROFILE, 1.0, gpu_fb
    if kind == host_mod.SHARE:
        share = float(detail) / host_mod.MILLI
        return host_mod.SHARE, share, gpu_fb * share
    if kind == host_mod.VGPU:
        profile = model.vgpu_profile(detail)
        if model.time_sliced_mixing and model.framebuffer_mib:
            share = profile.framebuffer_mib / model.framebuffer_mib
        else:
            share = 1.0 / profile.max_instances
        return detail, share, profile.framebuffer_mib / MIB_PER_GIB
    if kind == host_mod.MIG:
        name, _start, vgpu = (list(detail) + [None])[:3]
        profile = model.mig_profile(name)
        share = profile.memory_slices / model.mig.memory_slices
        return vgpu or name, share, profile.framebuffer_mib / MIB_PER_GIB
    raise ValueError('unknown device kind %r' % (kind,))


def device_key(address, device):
    """A device's name within its host, stable across reports."""
    kind = device.get('kind')
    if kind == host_mod.VGPU:
        return device.get('uuid') or device.get('vf') or '%s/vgpu' % address
    if kind == host_mod.MIG:
        return '%s/mig@%s' % (address, (device.get('detail') or [0, 0])[1])
    return '%s/%s' % (address, kind)


def holdings(report, raw):
    """({device key: Holding}, devices held by no known server) of a host.

    ``report``: the core ``Report`` parsed from ``raw``, the report as
    received (its devices' ``instance``, which the parsed host does not
    keep). A device without ``instance`` (the agent could not tell which
    guest holds it) is no server's: it is counted apart, not billed.
    """
    found, unattributed = {}, 0
    raws = sorted(raw.get('gpus') or (), key=lambda g: g['index'])
    for gpu, graw in zip(report.host.gpus, raws):
        for n, dev in enumerate(graw.get('devices') or ()):
            server = dev.get('instance')
            if not server:
                unattributed += 1
                continue
            kind = dev.get('kind')
            detail = dev.get('detail')
            profile, share, fb = device_size(gpu.model, kind, detail)
            key = device_key(gpu.address, dev)
            if key in found:  # two entries with one name: keep both
                key = '%s#%d' % (key, n)
            found[key] = Holding(server, gpu.model.name, profile, kind,
                                 share, fb)
    return found, unattributed


@dataclasses.dataclass
class View:
    """A host's last observation: when, and what it showed held."""

    t: float
    holdings: dict

    def holds(self, server):
        return any(h.server == server for h in self.holdings.values())


@dataclasses.dataclass
class Session:
    """Time one device was counted for one server, without a break."""

    server: str
    host: str
    device: str
    model: str
    profile: str
    share: float
    fb_gib: float
    start: float
    end: float

    def to_list(self):
        return [self.server, self.host, self.device, self.model,
                self.profile, self.share, self.fb_gib, self.start, self.end]

    @classmethod
    def from_list(cls, value):
        (server, host, device, model, profile, share, fb, start,
         end) = value
        return cls(str(server), str(host), str(device), str(model),
                   str(profile), _number(share), _number(fb),
                   _number(start), _number(end))


@dataclasses.dataclass
class Total:
    """A server's usage of one model and profile since it was first seen:
    the monotonic counters.
    """

    seconds: float = 0.0
    gpu_seconds: float = 0.0
    fb_gib_seconds: float = 0.0


def _number(value):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            not math.isfinite(value):
        raise LedgerError('not a finite number: %r' % (value,))
    return float(value)


class Ledger:
    """Usage per server, model and profile, from hosts' observations."""

    def __init__(self, max_interval=180.0, retention=400 * DAY):
        self.max_interval = float(max_interval)
        self.retention = float(retention)
        self.views = {}      # host -> View
        self.homes = {}      # server -> [[since, host], ...], oldest first
        self.sessions = []   # Session, in the order they started
        self.totals = {}     # (server, model, profile) -> Total
        self.projects = {}   # server -> project ID, once known
        self.since = None    # the first observation
        self.clock_steps = 0
        self._open = {}      # (host, device, server, profile) -> Session

    # -- input ------------------------------------------------------------

    def observe(self, host, t, held):
        """Count what host ``host`` held since its previous observation;
        ``held``: {device key: Holding} it shows at time ``t``. Returns
        the seconds counted.
        """
        t = float(t)
        if self.since is None:
            self.since = t
        view = self.views.get(host)
        counted = 0.0
        if view is not None:
            if t < view.t:
                # The clock was set back: nothing is known of the time in
                # between; start again from here.
                self.clock_steps += 1
            else:
                for key, holding in view.holdings.items():
                    end = t if held.get(key) == holding else min(
                        t, view.t + self.max_interval)
                    counted += self._count(host, key, holding, view.t, end)
        for holding in held.values():
            # A series starts at 0 (Prometheus' rate() reads nothing of a
            # series' first value).
            self.totals.setdefault(
                (holding.server, holding.model, holding.profile), Total())
        self._move_homes(host, t, view, held)
        self.views[host] = View(t, dict(held))
        return counted

    def set_project(self, server, project):
        self.projects[server] = project

    def unknown_projects(self):
        """Servers counted whose project is not known yet."""
        return sorted({s for s, _m, _p in self.totals} - set(self.projects))

    def _move_homes(self, host, t, view, held):
        before = {h.server for h in view.holdings.values()} if view else set()
        after = {h.server for h in held.values()}
        for server in sorted(after):
            homes = self.homes.setdefault(server, [])
            if not homes:
                homes.append([t, host])
                continue
            home = homes[-1][1]
            if home == host:
                continue
            home_view = self.views.get(home)
            if (server not in before or home_view is None
                    or not home_view.holds(server)
                    or t - home_view.t > self.max_interval):
                # Newly here (a migration's destination), or its home no
                # longer shows it: this host's devices count from now.
                homes.append([t, host])
        for server in sorted(before - after):
            homes = self.homes.get(server)
            if not homes or homes[-1][1] != host:
                continue
            others = [(v.t, name) for name, v in self.views.items()
                      if name != host and v.holds(server)]
            if others:  # a reverted resize: the source still holds it
                homes.append([t, max(others)[1]])
        for server in after | before:
            homes = self.homes.get(server)
            if homes and len(homes) > MAX_HOMES:
                del homes[:-MAX_HOMES]

    def _home_spans(self, server, host, a, b):
        """Parts of [a, b] during which ``host`` was ``server``'s home."""
        homes = self.homes.get(server) or ()
        spans = []
        for i, (since, home) in enumerate(homes):
            until = homes[i + 1][0] if i + 1 < len(homes) else math.inf
            if home == host:
                start, end = max(a, since), min(b, until)
                if end > start:
                    spans.append((start, end))
        return spans

    def _count(self, host, key, holding, a, b):
        counted = 0.0
        for start, end in self._home_spans(holding.server, host, a, b):
            self._add(host, key, holding, start, end)
            counted += end - start
        return counted

    def _add(self, host, key, holding, start, end):
        opened = (host, key, holding.server, holding.profile)
        session = self._open.get(opened)
        if session is not None and session.end == start:
            session.end = end
        else:
            session = Session(holding.server, host, key, holding.model,
                              holding.profile, holding.share,
                              holding.fb_gib, start, end)
            self.sessions.append(session)
            self._open[opened] = session
        total = self.totals.setdefault(
            (holding.server, holding.model, holding.profile), Total())
        seconds = end - start
        total.seconds += seconds
        total.gpu_seconds += seconds * holding.share
        total.fb_gib_seconds += seconds * holding.fb_gib

    def prune(self, now):
        """Forget sessions that ended more than ``retention`` seconds
        before ``now``, and the counters of servers with nothing left.
        """
        horizon = float(now) - self.retention
        self.sessions = [s for s in self.sessions if s.end >= horizon]
        kept = {id(s) for s in self.sessions}
        self._open = {k: s for k, s in self._open.items() if id(s) in kept}
        alive = {s.server for s in self.sessions}
        alive |= {h.server for v in self.views.values()
                  for h in v.holdings.values()}
        for key in [k for k in self.totals if k[0] not in alive]:
            del self.totals[key]
        for table in (self.homes, self.projects):
            for server in [s for s in table if s not in alive]:
                del table[server]

    # -- output -----------------------------------------------------------

    def usage(self, start, end, project=None, server=None):
        """Usage between ``start`` and ``end`` (Unix times), one row per
        project, server, model and profile, sorted.
        """
        rows = {}
        for s in self.sessions:
            if server is not None and s.server != server:
                continue
            owner = self.projects.get(s.server, '')
            if project is not None and owner != project:
                continue
            lo, hi = max(s.start, start), min(s.end, end)
            if hi <= lo:
                continue
            key = (owner, s.server, s.model, s.profile)
            row = rows.get(key)
            if row is None:
                row = rows[key] = {
                    'project_id': owner, 'server_id': s.server,
                    'model': s.model, 'profile': s.profile,
                    'seconds': 0.0, 'gpu_seconds': 0.0,
                    'fb_gib_seconds': 0.0, 'first': lo, 'last': hi}
            seconds = hi - lo
            row['seconds'] += seconds
            row['gpu_seconds'] += seconds * s.share
            row['fb_gib_seconds'] += seconds * s.fb_gib
            row['first'] = min(row['first'], lo)
            row['last'] = max(row['last'], hi)
        return [rows[k] for k in sorted(rows)]

    # -- saved form -------------------------------------------------------

    def to_dict(self):
        return {
            'version': VERSION, 'since': self.since,
            'clock_steps': self.clock_steps,
            'views': {host: {'t': v.t, 'holdings': {
                k: h.to_list() for k, h in sorted(v.holdings.items())}}
                for host, v in sorted(self.views.items())},
            'homes': {s: [list(h) for h in homes]
                      for s, homes in sorted(self.homes.items())},
            'sessions': [s.to_list() for s in self.sessions],
            'totals': [[server, model, profile, t.seconds, t.gpu_seconds,
                        t.fb_gib_seconds] for (server, model, profile), t
                       in sorted(self.totals.items())],
            'projects': dict(sorted(self.projects.items())),
        }

    @classmethod
    def from_dict(cls, data, max_interval=180.0, retention=400 * DAY):
        """The ledger ``to_dict`` saved; raises LedgerError naming what
        is wrong.
        """
        if not isinstance(data, dict) or data.get('version') != VERSION:
            raise LedgerError('not a version %d usage ledger' % VERSION)
        ledger = cls(max_interval, retention)
        try:
            since = data.get('since')
            ledger.since = None if since is None else _number(since)
            ledger.clock_steps = int(data.get('clock_steps') or 0)
            for host, v in data['views'].items():
                ledger.views[str(host)] = View(_number(v['t']), {
                    str(k): Holding.from_list(h)
                    for k, h in v['holdings'].items()})
            for server, homes in data['homes'].items():
                ledger.homes[str(server)] = [[_number(t), str(h)]
                                             for t, h in homes]
            for value in data['sessions']:
                s = Session.from_list(value)
                ledger.sessions.append(s)
                # the last session of each device goes on, if it can
                ledger._open[(s.host, s.device, s.server, s.profile)] = s
            for server, model, profile, sec, gpu, fb in data['totals']:
                ledger.totals[(str(server), str(model), str(profile))] = (
                    Total(_number(sec), _number(gpu), _number(fb)))
            ledger.projects = {str(k): str(v)
                               for k, v in data['projects'].items()}
        except LedgerError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise LedgerError('malformed usage ledger: %s: %s'
                              % (type(e).__name__, e)) from e
        return ledger

    def copy(self):
        return type(self).from_dict(self.to_dict(), self.max_interval,
                                    self.retention)
