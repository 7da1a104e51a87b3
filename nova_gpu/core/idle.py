"""Idle GPU devices and right-sizing: the rule, from utilisation samples.

A ``Window`` keeps one guest device's utilisation readings (its compute,
as a share of one physical GPU, and the frame buffer it uses) over the
last ``span`` seconds, at most ``max_samples`` of them (oldest dropped:
memory is bounded whatever the sampling rate). A device is **idle** when
every reading for the last ``idle_after`` seconds (30 minutes by default)
put its use under ``threshold`` (5%); use is its compute over its own
share of the GPU (a 1/8 vGPU busy for its whole time slice is busy, not
12.5% used), capped at 1 (a time-sliced vGPU may run beyond its share
while others are idle).

Missing samples give no verdict, never "idle": a device NVML cannot read
(unsupported counter, NVML away) has no readings and its verdict is
``UNKNOWN``; a gap longer than ``max_gap`` between two readings (or since
the last one) breaks the run, which starts again at the next reading.
A reading whose time goes back (the clock was set back) starts the
window again.

``suggest`` right-sizes: the smallest device of the same model (any
kind: time-sliced vGPU type, MIG profile, whole GPU) whose compute share
and frame buffer hold the observed peak, when it is smaller than the
device the guest has. A smaller model is suggested only for a guest
whose peak compute stays under the threshold of its own share: the
catalog gives frame buffers, not the relative speed of two models, so
only a guest that barely computes can be moved by memory alone.

Nothing here imports OpenStack.
"""

import collections
import dataclasses

from nova_gpu.core import host as host_mod

DEFAULT_THRESHOLD = 0.05
DEFAULT_IDLE_AFTER = 1800.0
DEFAULT_MAX_GAP = 300.0
DEFAULT_MAX_SAMPLES = 2048
IDLE, BUSY, UNKNOWN = 'idle', 'busy', 'unknown'
WHOLE = 'whole'
MIB = 2 ** 20


@dataclasses.dataclass(frozen=True)
class Verdict:
    """What a window says of its device at one time."""

    state: str                    # IDLE, BUSY or UNKNOWN
    since: float = None           # first reading of the idle run (IDLE)
    seconds: float = 0.0          # how long it has been idle (IDLE)
    peak_compute: float = None    # highest compute, share of one GPU
    peak_memory_mib: float = None  # most frame buffer used (MiB)
    samples: int = 0              # readings in the window

    @property
    def idle(self):
        """True when the device is idle."""
        return self.state == IDLE


class Window:
    """One device's utilisation readings over the last ``span`` seconds.

    ``share``: the device's share of one GPU (0..1], against which its
    use is judged.
    """

    def __init__(self, share=1.0, threshold=DEFAULT_THRESHOLD,
                 idle_after=DEFAULT_IDLE_AFTER, max_gap=DEFAULT_MAX_GAP,
                 max_samples=DEFAULT_MAX_SAMPLES):
        if not 0 < share <= 1:
            raise ValueError('share must be in (0, 1], got %r' % (share,))
        if idle_after <= 0 or max_gap <= 0 or max_samples < 1:
            raise ValueError('idle_after, max_gap and max_samples must be '
                             'positive')
        self.share = float(share)
        self.threshold = float(threshold)
        self.idle_after = float(idle_after)
        self.max_gap = float(max_gap)
        self.span = self.idle_after
        self._readings = collections.deque(maxlen=int(max_samples))
        self._run_start = None     # first reading of the run under threshold
        self._last = None          # time of the newest reading

    def __len__(self):
        return len(self._readings)

    def use(self, compute):
        """``compute`` (share of one GPU) over the device's share, <= 1."""
        return min(1.0, max(0.0, compute) / self.share)

    def add(self, t, compute, memory_mib=None):
        """Take one reading at ``t``; ``compute`` None is a missing one.

        A missing reading adds nothing: the next verdict is UNKNOWN once
        ``max_gap`` has passed without a reading.
        """
        if compute is None:
            return
        if self._last is not None and t <= self._last:
            # the clock went back, or the same time twice: start again
            if t == self._last:
                return
            self._readings.clear()
            self._run_start = None
        elif self._last is not None and t - self._last > self.max_gap:
            self._readings.clear()
            self._run_start = None
        self._last = t
        self._readings.append((t, float(compute), memory_mib))
        while self._readings and self._readings[0][0] < t - self.span:
            self._readings.popleft()
        if self.use(compute) >= self.threshold:
            self._run_start = None
        elif self._run_start is None:
            self._run_start = t

    def verdict(self, now):
        """The device's ``Verdict`` at ``now``."""
        if self._last is None or now - self._last > self.max_gap:
            return Verdict(UNKNOWN)
        computes = [c for _t, c, _m in self._readings]
        memories = [m for _t, _c, m in self._readings if m is not None]
        peak_c = max(computes) if computes else None
        peak_m = (max(memories) if len(memories) == len(computes)
                  else None)  # a peak only from every reading
        common = dict(peak_compute=peak_c, peak_memory_mib=peak_m,
                      samples=len(computes))
        if self._run_start is not None and \
                now - self._run_start >= self.idle_after:
            return Verdict(IDLE, since=self._run_start,
                           seconds=now - self._run_start, **common)
        return Verdict(BUSY, **common)


class Tracker:
    """A ``Window`` per device key, for the devices seen lately.

    ``observe`` is called once per sampling pass with the readings of
    the devices that exist now; a window whose device is gone is
    dropped, so that memory is bounded by the devices of the host.
    """

    def __init__(self, threshold=DEFAULT_THRESHOLD,
                 idle_after=DEFAULT_IDLE_AFTER, max_gap=DEFAULT_MAX_GAP,
                 max_samples=DEFAULT_MAX_SAMPLES):
        self.options = dict(threshold=threshold, idle_after=idle_after,
                            max_gap=max_gap, max_samples=max_samples)
        self.windows = {}

    def observe(self, now, readings, present=None):
        """Record one pass at ``now``.

        ``readings``: {key: (share, compute or None, memory MiB or
        None)}; ``present``: the keys that exist now (default: those of
        ``readings``); any other window is dropped.
        """
        keep = set(readings) if present is None else set(present)
        for key in set(self.windows) - keep:
            del self.windows[key]
        for key, (share, compute, memory_mib) in readings.items():
            if key not in keep:
                continue
            window = self.windows.get(key)
            if window is None or window.share != float(share):
                window = self.windows[key] = Window(share, **self.options)
            window.add(now, compute, memory_mib)

    def verdict(self, key, now):
        """The ``Verdict`` of ``key``'s device (UNKNOWN when unseen)."""
        window = self.windows.get(key)
        return window.verdict(now) if window is not None else Verdict(
            UNKNOWN)


@dataclasses.dataclass(frozen=True)
class Size:
    """A device a guest could be given: kind, profile and capacity."""

    model: str
    kind: str          # 'vgpu', 'mig' or 'whole'
    profile: str       # vGPU type, MIG profile, 'whole'
    compute: float     # share of one GPU of that model
    memory_mib: int

    @property
    def name(self):
        """The profile, or ``<model> whole`` for a whole GPU."""
        return '%s whole' % self.model if self.kind == WHOLE else \
            self.profile


def sizes(model):
    """Every ``Size`` one catalog ``GpuModel`` offers."""
    out = [Size(model.name, WHOLE, WHOLE, 1.0, model.framebuffer_mib)]
    for name, p in model.vgpu_profiles.items():
        if p.mig_backed:
            continue  # its MIG profile stands for it
        if model.time_sliced_mixing and model.framebuffer_mib:
            share = p.framebuffer_mib / model.framebuffer_mib
        else:
            share = 1.0 / p.max_instances
        out.append(Size(model.name, host_mod.VGPU, name, share,
                        p.framebuffer_mib))
    if model.mig:
        for name, p in model.mig.profiles.items():
            out.append(Size(model.name, host_mod.MIG, name,
                            p.compute_slices / model.mig.compute_slices,
                            p.framebuffer_mib))
    return out


def device_size(model, kind, detail):
    """The ``Size`` of a report device (``kind``, ``detail`` as there).

    A MIG-backed vGPU (``detail`` [profile, start, vGPU type]) is sized
    by its MIG profile; a share by its thousandths.
    """
    if kind == host_mod.WHOLE:
        return Size(model.name, WHOLE, WHOLE, 1.0, model.framebuffer_mib)
    if kind == host_mod.SHARE:
        share = float(detail) / host_mod.MILLI
        return Size(model.name, host_mod.SHARE, host_mod.SHARE, share,
                    int(model.framebuffer_mib * share))
    if kind == host_mod.VGPU:
        model.vgpu_profile(detail)  # UnknownProfile for a foreign type
        for size in sizes(model):
            if size.kind == host_mod.VGPU and size.profile == detail:
                return size
    if kind == host_mod.MIG:
        name = list(detail)[0]
        model.mig_profile(name)
        for size in sizes(model):
            if size.kind == host_mod.MIG and size.profile == name:
                return size
    raise ValueError('no size for a %r device %r on %s'
                     % (kind, detail, model.name))


def _smallest(candidates, compute, memory_mib):
    fits = [s for s in candidates
            if s.compute >= compute and s.memory_mib >= memory_mib]
    return min(fits, key=lambda s: (s.compute, s.memory_mib, s.name),
               default=None)


def suggest(model, current, verdict, models=(), threshold=DEFAULT_THRESHOLD):
    """The smaller ``Size`` the guest's observed peak fits, or None.

    ``model``: the device's catalog ``GpuModel``; ``current``: its
    ``Size``; ``verdict``: its window's ``Verdict`` (a peak of compute
    and memory needed: none without them); ``models``: the catalog's
    models, for a smaller model (see the module's docstring).
    """
    if verdict.peak_compute is None or verdict.peak_memory_mib is None:
        return None
    compute, memory = verdict.peak_compute, verdict.peak_memory_mib
    best = _smallest(sizes(model), compute, memory)
    if best is not None and best.compute <= current.compute and \
            best.memory_mib <= current.memory_mib and \
            (best.compute, best.memory_mib) != (current.compute,
                                                current.memory_mib):
        return best
    if compute / current.compute >= threshold:
        return None  # computes: the catalog cannot say how fast another is
    smaller = [m for m in models
               if m.name != model.name
               and 0 < m.framebuffer_mib < model.framebuffer_mib]
    # The smallest model whose whole GPU holds the memory, then its
    # smallest device holding it (compute: as little as it uses).
    fitting = sorted((m for m in smaller if m.framebuffer_mib >= memory),
                     key=lambda m: (m.framebuffer_mib, m.name))
    for other in fitting:
        found = _smallest(sizes(other), 0.0, memory)
        if found is not None:
            return found
    return None


def gpu_key(address):
    """The window key of a whole physical GPU's own utilisation."""
    return 'gpu:%s' % address


def _vgpu_of(dev, vgpus):
    """The vGPU sample of a report device: by its mdev UUID, else its
    guest's when that guest has one vGPU on the GPU; None when none or
    which is which cannot be told.
    """
    uuid = (dev.get('uuid') or '').lower()
    instance = (dev.get('instance') or '').lower()
    found = [v for v in vgpus if uuid and v.get('mdev') == uuid]
    if not found and instance:
        found = [v for v in vgpus if v.get('vm') == instance]
    return found[0] if len(found) == 1 else None


def _reading(kind, dev, size, gpu_sample, vgpus, migs):
    """(compute as a share of one GPU, memory MiB) of one report device
    from a pass's samples; None for what NVML did not give.

    * a whole GPU: the GPU's own figures (NVML on the host does not list
      a GPU passed through to a guest: none);
    * a vGPU (mdev on a full GPU, or a vendor-VFIO VF): its vGPU's;
    * a GPU instance (MIG, a MIG-backed vGPU's or not): the instance's
      (its activity is a share of the instance: times the instance's
      share of the GPU), else the one vGPU running on it;
    * a share: NVML gives no figure of its own.
    """
    if kind == host_mod.WHOLE:
        return gpu_sample.get('compute'), gpu_sample.get('memory_mib')
    if kind == host_mod.VGPU:
        vgpu = _vgpu_of(dev, vgpus) or {}
        return vgpu.get('compute'), vgpu.get('memory_mib')
    if kind != host_mod.MIG:
        return None, None
    start = (dev.get('detail') or [None, None])[1]
    inst = next((m for m in migs if m.get('start') == start), {})
    if inst.get('gi') is not None:
        # The instance is known: only a vGPU NVML runs on it is its own.
        on = [v for v in vgpus if v.get('gi') == inst['gi']]
        vgpu = on[0] if len(on) == 1 else {}
    else:
        vgpu = _vgpu_of(dev, vgpus) or {}
    compute = inst.get('compute')
    compute = (compute * size.compute if compute is not None
               else vgpu.get('compute'))
    memory = inst.get('memory_mib')
    return compute, memory if memory is not None else vgpu.get(
        'memory_mib')


def annotate(report, samples, tracker, catalog, now):
    """Feed ``tracker`` one pass and mark ``report``'s idle devices.

    ``report``: a host report (dict) as the agent sends it; ``samples``:
    what NVML read this pass, None when it read nothing::

        {'gpus': {address: {'compute': 0..1, 'memory_mib': MiB}},
         'vgpus': {address: [{'mdev': uuid, 'vm': uuid, 'gi': GPU
                              instance id, 'compute': share of the GPU,
                              'memory_mib': MiB}, ...]},
         'migs': {address: [{'gi': GPU instance id, 'start': slice,
                             'compute': share of the instance,
                             'memory_mib': MiB}, ...]}}

    (a value NVML cannot read is None or absent). Each idle device gets
    ``idle`` (``since``, ``seconds``, ``peak_compute``,
    ``peak_memory_mib``, ``suggestion``, ``samples``); a GPU whose own
    utilisation is idle while it holds devices gets ``idle`` too. Returns
    the number of idle devices.
    """
    samples = samples or {}
    gpu_samples = samples.get('gpus') or {}
    vgpu_samples = samples.get('vgpus') or {}
    mig_samples = samples.get('migs') or {}
    readings, found = {}, []
    models = list(catalog.models.values())
    for gpu in report.get('gpus', ()):
        address = gpu.get('address')
        try:
            model = catalog.model(gpu.get('model'))
        except Exception:  # a model the catalog does not know
            continue
        mine = gpu_samples.get(address) or {}
        readings[gpu_key(address)] = (1.0, mine.get('compute'),
                                      mine.get('memory_mib'))
        vgpus = vgpu_samples.get(address) or ()
        migs = mig_samples.get(address) or ()
        for dev in gpu.get('devices') or ():
            if not isinstance(dev, dict):
                continue
            kind = dev.get('kind')
            try:
                size = device_size(model, kind, dev.get('detail'))
            except Exception:  # an odd device is no one's verdict
                continue
            key = _device_key(address, dev)
            compute, memory = _reading(kind, dev, size, mine, vgpus, migs)
            readings[key] = (size.compute, compute, memory)
            found.append((dev, key, model, size))
        if gpu.get('devices'):
            found.append((gpu, gpu_key(address), model,
                          device_size(model, host_mod.WHOLE, None)))
    tracker.observe(now, readings)
    count = 0
    for entry, key, model, size in found:
        verdict = tracker.verdict(key, now)
        if not verdict.idle:
            continue
        better = suggest(model, size, verdict, models,
                         tracker.options['threshold'])
        entry['idle'] = {
            'since': verdict.since, 'seconds': round(verdict.seconds, 3),
            'peak_compute': verdict.peak_compute,
            'peak_memory_mib': verdict.peak_memory_mib,
            'suggestion': better.name if better else None,
            'samples': verdict.samples}
        if 'kind' in entry:  # a device, not a GPU
            count += 1
    return count


def _device_key(address, dev):
    kind = dev.get('kind')
    if kind == host_mod.VGPU:
        return dev.get('uuid') or dev.get('vf') or '%s/vgpu' % address
    if kind == host_mod.MIG:
        return '%s/mig@%s' % (address, (dev.get('detail') or [0, 0])[1])
    return '%s/%s' % (address, kind)


# What an owner is told of the idle devices of a server (``notices``).
TELL, UPDATE, CLEAR = 'tell', 'update', 'clear'


@dataclasses.dataclass(frozen=True)
class Notice:
    """One change to tell the owner of ``server_id`` (``notices``)."""

    action: str        # TELL, UPDATE or CLEAR
    server_id: str
    host: str
    devices: tuple = ()   # the server's idle device rows (TELL, UPDATE)

    def told(self):
        """What is kept of it once done: {'host', 'devices': {key:
        since}} (None for CLEAR).
        """
        if self.action == CLEAR:
            return None
        return {'host': self.host,
                'devices': {r['device']: r['since'] for r in self.devices}}


def notices(told, host, idle_rows):
    """What to tell owners after one report of ``host``, a list of
    ``Notice``.

    ``told``: {server: {'host', 'devices': {device key: since}}}, what
    owners were told and not yet cleared; ``idle_rows``: the idle
    devices the report marks (one dict each: ``server_id``, ``device``,
    ``since``, ...). Once per idle episode: a server is told (TELL) when
    one of its devices starts an idle run not told yet (a new ``since``);
    UPDATE when it was told but the set of its idle devices shrank or it
    moved to this host; CLEAR when it was told from this host and no
    device of it is idle here now (busy again, released, or the server
    is gone). A device of no known server tells no one.
    """
    now = {}
    for row in idle_rows:
        if row.get('server_id') and row.get('device'):
            now.setdefault(row['server_id'], []).append(row)
    out = []
    for server, rows in sorted(now.items()):
        rows = tuple(sorted(rows, key=lambda r: r['device']))
        notice = Notice(TELL, server, host, rows)
        before = told.get(server)
        if before is None or any(
                before['devices'].get(d) != s
                for d, s in notice.told()['devices'].items()):
            out.append(notice)
        elif before != notice.told():
            out.append(Notice(UPDATE, server, host, rows))
    for server, before in sorted(told.items()):
        if before.get('host') == host and server not in now:
            out.append(Notice(CLEAR, server, host))
    return out
