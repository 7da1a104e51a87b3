"""Carve to demand, measured: a time-ordered replay with departures.

The Alibaba trace gives each pod a creation and a deletion time. Every
GPU pod becomes a request that arrives, holds its devices and leaves. It
asks by need: a share of ``gpu_milli`` of a reference 80 GiB GPU becomes
a framebuffer need, served by the smallest fitting profile of the GPU
model (``layout.need_options``); ``gpu_milli`` 1000 asks for ``num_gpu``
whole GPUs (passthrough) on one host. Three ways to run the cluster:

* ``static``: Nova's way, one configuration per GPU fixed for the whole
  run (``[devices] enabled_mdev_types`` / a MIG layout set by hand),
  chosen from the whole trace's demand (``best_static`` searches it).
* ``carve``: the core planner (``nova_gpu.core.layout.LayoutPlanner``)
  re-carves idle GPUs to the demand of the recent arrivals, periodically
  and when a request finds no carved device.
* ``ideal``: a bound where any GPU holds any mix of sizes at any time
  (framebuffer bins, no layout rules).
"""

import collections
import csv
import dataclasses
import heapq
import os

from nova_gpu.core import catalog as catalog_mod
from nova_gpu.core import exceptions
from nova_gpu.core import host as host_mod
from nova_gpu.core import layout as layout_mod

REFERENCE_FB_MIB = 81920  # the need of a share: milli of an 80 GiB GPU
GPUS_PER_HOST = 8
# The cluster: vGPU- and MIG-capable models, each with its board's types.
DEFAULT_MODELS = (('A100-80GB', 'A100D-'), ('H100-80GB', 'H100-'))
DAY = 86400.0


@dataclasses.dataclass(frozen=True)
class Request:
    name: str
    arrival: float
    departure: float
    milli: int
    count: int

    @property
    def gpu_hours(self):
        return (self.departure - self.arrival) * self.milli * self.count / (
            1000.0 * 3600.0)


def load_requests(path):
    """GPU pods of a trace task list, with their lifetimes, by arrival."""
    if not os.path.isfile(path):
        raise exceptions.InvalidRequest('task list %s does not exist' % path)
    out = []
    with open(path, newline='') as f:
        reader = csv.DictReader(f)
        need = ('name', 'num_gpu', 'gpu_milli', 'creation_time',
                'deletion_time')
        missing = [c for c in need if c not in (reader.fieldnames or ())]
        if missing:
            raise exceptions.InvalidRequest(
                '%s lacks column(s) %s: a replay with departures needs '
                'creation and deletion times' % (path, ', '.join(missing)))
        for line, row in enumerate(reader, 2):
            try:
                count = int(row['num_gpu'])
                milli = int(row['gpu_milli'])
                start = float(row['creation_time'])
                end = float(row['deletion_time'])
            except (TypeError, ValueError):
                raise exceptions.InvalidRequest(
                    '%s line %d: num_gpu, gpu_milli, creation_time and '
                    'deletion_time must be numbers' % (path, line)) from None
            if not count or not milli or end <= start:
                continue  # CPU-only, or never held anything
            out.append(Request(row['name'], start, end, milli, count))
    if not out:
        raise exceptions.InvalidRequest('%s lists no GPU pod' % path)
    out.sort(key=lambda r: (r.arrival, r.name))
    return out


class Cluster:
    """Hosts of ``GPUS_PER_HOST`` GPUs, ``hosts`` of each model in turn."""

    def __init__(self, hosts, models=DEFAULT_MODELS, catalog=None):
        catalog = catalog or catalog_mod.load_catalog()
        self.models = []
        self.types = {}
        for name, prefix in models:
            model = catalog.model(name)
            self.models.append(model)
            self.types[model.name] = frozenset(
                n for n in model.vgpu_profiles if n.startswith(prefix))
        self.hosts = []
        for i in range(hosts):
            model = self.models[i % len(self.models)]
            self.hosts.append(host_mod.Host(
                'host%02d' % i,
                [host_mod.Gpu(g, model) for g in range(GPUS_PER_HOST)]))

    @property
    def gpu_count(self):
        return len(self.hosts) * GPUS_PER_HOST

    def classes_for(self, requests):
        """``{(milli, count): DemandClass}``, weights = arrivals.

        Requests served by the same options share one class (8.8 GiB and
        9.0 GiB both take a 10 GiB profile): fewer, truer classes.
        """
        counts = collections.Counter((r.milli, r.count) for r in requests)
        by_options = {}
        keys = {}
        for (milli, count), n in sorted(counts.items()):
            if milli >= 1000:
                options = {m.name: (layout_mod.WHOLE,) for m in self.models}
                name = '%dx whole' % count
                units = count
            else:
                need = milli * REFERENCE_FB_MIB / 1000.0
                options = {m.name: layout_mod.need_options(
                    m, need, self.types[m.name]) for m in self.models}
                size = _option_mib(self.models[0],
                                   options[self.models[0].name][0])
                name = '<=%d GiB' % (size // 1024)
                units = 1
            ident = (tuple(sorted(options.items())), units)
            old = by_options.get(ident)
            by_options[ident] = layout_mod.DemandClass(
                name, float(n) + (old.weight if old else 0.0), options,
                units=units)
            keys[(milli, count)] = ident
        return {key: by_options[ident] for key, ident in keys.items()}


@dataclasses.dataclass
class CarvingOutcome:
    mode: str
    gpus: int
    arrived: int = 0
    refused: int = 0
    offered_gpu_hours: float = 0.0
    served_gpu_hours: float = 0.0
    recarves: int = 0
    refused_by: dict = dataclasses.field(
        default_factory=collections.Counter)
    refused_gpu_hours_by: dict = dataclasses.field(
        default_factory=collections.Counter)
    active_days: float = 0.0
    # (day, refused so far, served GPU-hours so far, GPUs busy now)
    curve: list = dataclasses.field(default_factory=list)

    @property
    def served_pct(self):
        return 100.0 * self.served_gpu_hours / (self.offered_gpu_hours or 1)

    @property
    def recarves_per_gpu_day(self):
        return self.recarves / float(self.gpus * (self.active_days or 1))

    def row(self):
        return (self.mode, self.arrived, self.refused,
                round(self.served_gpu_hours, 1), round(self.served_pct, 2),
                round(self.recarves_per_gpu_day, 3))


# -- devices on carved GPUs (static and carve) ---------------------------


class CarvedCluster:
    """The cluster's GPUs with a layout each, and what runs on them."""

    def __init__(self, cluster):
        self.cluster = cluster
        self.layouts = [dict() for _ in cluster.hosts]

    def set_layout(self, h, g, layout):
        host = self.cluster.hosts[h]
        gpu = host.gpus[g]
        if not gpu.is_free:
            raise exceptions.AllocationError(
                '%s GPU %d is in use: it cannot be re-carved'
                % (host.name, g))
        host.gpus[g] = layout_mod.gpu_for_layout(gpu, layout)
        self.layouts[h][g] = layout

    def place(self, cls):
        """Slots for one request of ``cls``: ``(host index, slots)``."""
        if cls.units > 1:
            return self._place_whole(cls)
        best = best_key = None
        for h, host in enumerate(self.cluster.hosts):
            options = cls.on(host.gpus[0].model)
            if not options:
                continue
            idle_gpus = sum(1 for g in host.gpus if g.is_free)
            for gpu in host.gpus:
                layout = self.layouts[h].get(gpu.index)
                free = layout_mod.free_units(gpu, layout)
                for rank, option in enumerate(options):
                    n = free.get(option, 0)
                    if not n:
                        continue
                    # Pack: used GPUs first, on the busiest host, then
                    # the fewest free units, so idle GPUs stay idle (and
                    # re-carvable) and whole hosts stay free.
                    key = (gpu.is_free, idle_gpus, n, rank)
                    if best_key is None or key < best_key:
                        best, best_key = (h, gpu, layout, option), key
        if best is None:
            return None
        h, gpu, layout, option = best
        return h, (_slot(gpu, layout, option),)

    def _place_whole(self, cls):
        for h, host in enumerate(self.cluster.hosts):
            if layout_mod.WHOLE not in cls.on(host.gpus[0].model):
                continue
            free = [g for g in host.gpus
                    if layout_mod.free_units(
                        g, self.layouts[h].get(g.index)).get(
                            layout_mod.WHOLE)]
            if len(free) >= cls.units:
                return h, tuple(host_mod.Slot(g.index, host_mod.WHOLE)
                                for g in free[:cls.units])
        return None

    def busy(self):
        return sum(1 for h in self.cluster.hosts for g in h.gpus
                   if not g.is_free)

    def take(self, h, slots):
        self.cluster.hosts[h].allocate(
            host_mod.Assignment(self.cluster.hosts[h].name, slots))

    def release(self, h, slots):
        self.cluster.hosts[h].free(
            host_mod.Assignment(self.cluster.hosts[h].name, slots))


def _slot(gpu, layout, option):
    if option == layout_mod.WHOLE:
        return host_mod.Slot(gpu.index, host_mod.WHOLE)
    if option[0] == 'vgpu':
        return host_mod.Slot(gpu.index, host_mod.VGPU, option[1])
    taken = gpu.mig_instances
    for gi, start, vgpu in layout.instances:
        if (gi, vgpu) == option[1:] and start not in taken:
            return host_mod.Slot(gpu.index, host_mod.MIG, (gi, start, vgpu))
    raise exceptions.AllocationError('no free %s instance' % (option,))


# -- the replay -----------------------------------------------------------


def replay(requests, hosts, mode, static_layouts=None, planner=None,
           window=200, interval=300.0, prior=0.02, on_miss=True):
    """Replay ``requests`` on ``hosts`` hosts in ``mode``; an CarvingOutcome.

    ``carve`` plans every ``interval`` seconds on the demand of the last
    ``window`` arrivals (plus ``prior`` per class, so that no class is
    forgotten) and, with ``on_miss``, carves an idle GPU for a request
    that finds no device (just in time, as a qemu hook can). Without it,
    only the periodic plan carves (carve ahead, as a restart-based design
    must).
    """
    if mode not in ('static', 'carve', 'ideal'):
        raise exceptions.InvalidRequest('unknown mode %r' % mode)
    cluster = Cluster(hosts)
    classes = cluster.classes_for(requests)
    unique = list({c.name: c for c in classes.values()}.values())
    if mode == 'ideal':
        state = _IdealCluster(cluster)
    else:
        state = CarvedCluster(cluster)
        if mode == 'static':
            if static_layouts is None:
                raise exceptions.InvalidRequest('static needs layouts')
            for h, host in enumerate(cluster.hosts):
                for g in range(GPUS_PER_HOST):
                    state.set_layout(h, g, static_layouts[
                        h * GPUS_PER_HOST + g])
    planner = planner or layout_mod.LayoutPlanner()
    out = CarvingOutcome(mode, cluster.gpu_count)
    recent = collections.deque()
    recent_counts = collections.Counter()
    held = {}
    busy_gpus = 0
    last_plan = None
    days = set()
    next_sample = None

    def demand():
        weights = collections.Counter()
        total = float(sum(recent_counts.values())) or 1.0
        for key, n in recent_counts.items():
            weights[classes[key].name] += n / total
        return [dataclasses.replace(cls, weight=weights[cls.name] + prior)
                for cls in unique]

    def plan(now):
        nonlocal last_plan
        last_plan = now
        current = demand()
        for h, host in enumerate(cluster.hosts):
            if all(not g.is_free for g in host.gpus):
                continue
            for d in planner.plan(host, state.layouts[h], current, now):
                if d.changed:
                    state.set_layout(h, d.gpu, d.layout)
                    if d.previous is not None:
                        out.recarves += 1

    def carve_for(cls, now):
        # A miss: carve an idle GPU for this request if any host has one.
        # A multi-GPU request may need several GPUs carved on one host.
        # Busiest host first (best fit) so that whole hosts stay free for
        # multi-GPU requests; a host must have enough idle GPUs.
        current = demand()
        order = sorted(
            (sum(1 for g in host.gpus if g.is_free), h)
            for h, host in enumerate(cluster.hosts))
        for idle, h in order:
            host = cluster.hosts[h]
            if idle < cls.units:
                continue
            for _ in range(cls.units):
                d = planner.carve_for(host, state.layouts[h], cls, current,
                                      now)
                if d is None:
                    break
                if d.changed:
                    state.set_layout(h, d.gpu, d.layout)
                    if d.previous is not None:
                        out.recarves += 1
                found = state.place(cls)
                if found is not None:
                    return found
        return None

    heap = [(r.arrival, 1, i) for i, r in enumerate(requests)]
    heapq.heapify(heap)
    while heap:
        now, kind, i = heapq.heappop(heap)
        if next_sample is None:
            next_sample = now
        while now >= next_sample:
            out.curve.append((next_sample / DAY, out.refused,
                              out.served_gpu_hours, busy_gpus))
            next_sample += DAY / 4
        r = requests[i]
        key = (r.milli, r.count)
        if kind == 0:
            h, slots = held.pop(i)
            state.release(h, slots)
            busy_gpus = state.busy()
            continue
        days.add(int(now // DAY))
        out.arrived += 1
        out.offered_gpu_hours += r.gpu_hours
        recent.append(key)
        recent_counts[key] += 1
        if len(recent) > window:
            old = recent.popleft()
            recent_counts[old] -= 1
        cls = classes[key]
        if mode == 'carve' and (last_plan is None
                                or now - last_plan >= interval):
            plan(now)
        found = state.place(cls)
        if found is None and mode == 'carve' and on_miss:
            found = carve_for(cls, now)
        if found is None:
            out.refused += 1
            out.refused_by[cls.name] += 1
            out.refused_gpu_hours_by[cls.name] += r.gpu_hours
            continue
        state.take(*found)
        held[i] = found
        out.served_gpu_hours += r.gpu_hours
        heapq.heappush(heap, (r.departure, 0, i))
        busy_gpus = state.busy()
    out.curve.append((next_sample / DAY, out.refused, out.served_gpu_hours,
                      busy_gpus))
    out.active_days = float(len(days))
    return out


class _IdealCluster:
    """Any GPU holds any mix of sizes at any time: framebuffer bins."""

    def __init__(self, cluster):
        self.cluster = cluster
        self.free = [[h.gpus[0].model.framebuffer_mib] * GPUS_PER_HOST
                     for h in cluster.hosts]
        self.layouts = [dict() for _ in cluster.hosts]

    def place(self, cls):
        best = best_key = None
        for h, host in enumerate(self.cluster.hosts):
            model = host.gpus[0].model
            options = cls.on(model)
            if not options:
                continue
            full = model.framebuffer_mib
            if options[0] == layout_mod.WHOLE:
                idle = [g for g in range(GPUS_PER_HOST)
                        if self.free[h][g] == full]
                if len(idle) >= cls.units:
                    return h, tuple((g, full) for g in idle[:cls.units])
                continue
            size = _option_mib(model, options[0])
            idle_gpus = sum(1 for left in self.free[h] if left == full)
            for g in range(GPUS_PER_HOST):
                left = self.free[h][g]
                if left >= size:
                    key = (left == full, idle_gpus, left)
                    if best_key is None or key < best_key:
                        best, best_key = (h, ((g, size),)), key
        return best

    def take(self, h, slots):
        for g, size in slots:
            self.free[h][g] -= size

    def release(self, h, slots):
        for g, size in slots:
            self.free[h][g] += size

    def busy(self):
        return sum(1 for h, host in enumerate(self.cluster.hosts)
                   for g, gpu in enumerate(host.gpus)
                   if self.free[h][g] < gpu.model.framebuffer_mib)


def _option_mib(model, option):
    if option == layout_mod.WHOLE:
        return model.framebuffer_mib
    if option[0] == 'vgpu':
        return model.vgpu_profiles[option[1]].framebuffer_mib
    return model.mig.profiles[option[1]].framebuffer_mib


# -- the best static mix --------------------------------------------------


def static_layouts(cluster, classes, gpus_per_class):
    """One layout per GPU: ``gpus_per_class[key]`` GPUs for each class.

    Passthrough GPUs fill whole hosts first (multi-GPU requests need
    them together); a class is served by its first option on the GPU's
    model (the time-sliced type where there is one).
    """
    order = sorted((k for k in gpus_per_class if gpus_per_class[k] > 0),
                   key=lambda k: (-k[0], k[1]))
    flat = []
    for key in order:
        flat.extend([key] * gpus_per_class[key])
    if not flat:
        raise exceptions.InvalidRequest('a static mix needs GPUs')
    flat = (flat + [flat[-1]] * cluster.gpu_count)[:cluster.gpu_count]
    out = []
    for i, key in enumerate(flat):
        model = cluster.hosts[i // GPUS_PER_HOST].gpus[0].model
        out.append(layout_mod.layout_for_option(
            model, classes[key].on(model)[0]))
    return out


def proportional_mix(cluster, classes, requests):
    """GPUs per class in proportion to the GPU time each class holds.

    A request holds ``units / instances-per-GPU`` of a GPU for its
    lifetime; every class gets at least one GPU (largest remainders).
    """
    model = cluster.models[0]
    held = collections.Counter()
    for r in requests:
        key = (r.milli, r.count)
        option = classes[key].on(model)[0]
        per_gpu = layout_mod.layout_units(
            model, layout_mod.layout_for_option(model, option))[option]
        held[_class_key(classes, key)] += (
            (r.departure - r.arrival) * classes[key].units / per_gpu)
    total = sum(held.values())
    gpus = cluster.gpu_count
    spare = gpus - len(held)
    raw = {k: spare * v / total for k, v in held.items()}
    mix = {k: 1 + int(v) for k, v in raw.items()}
    left = gpus - sum(mix.values())
    for k in sorted(raw, key=lambda k: raw[k] - int(raw[k]),
                    reverse=True)[:left]:
        mix[k] += 1
    return mix


def _class_key(classes, key):
    """One representative request key per class.

    One for passthrough: a static passthrough GPU serves every whole-GPU
    class.
    """
    name = classes[key].name
    whole = [k for k, c in classes.items() if k[0] >= 1000]
    if key in whole:
        return min(whole)
    return min(k for k, c in classes.items() if c.name == name)


def best_static(requests, hosts, budget=60, log=None):
    """The best static mix found: start proportional, then hill-climb.

    Moves one GPU from one class to another while that lowers the
    refusals (ties: more GPU-hours served), within ``budget`` replays.
    Returns ``(mix, outcome)``.
    """
    cluster = Cluster(hosts)
    classes = cluster.classes_for(requests)

    def run(mix):
        layouts = static_layouts(Cluster(hosts), classes, mix)
        out = replay(requests, hosts, 'static', static_layouts=layouts)
        return (out.refused, -out.served_gpu_hours), out

    mix = proportional_mix(cluster, classes, requests)
    best_key, best_out = run(mix)
    spent = 1
    improved = True
    while improved and spent < budget:
        improved = False
        # The most refused classes gain first; the least refused give.
        names = {classes[k].name: k for k in mix}
        for k, c in classes.items():
            names.setdefault(c.name, _class_key(classes, k))
        gainers = list(dict.fromkeys(
            names[n] for n, _c in best_out.refused_by.most_common()))
        givers = sorted(mix, key=lambda k: best_out.refused_by.get(
            classes[k].name, 0))
        for gain in gainers:
            for give in givers:
                if give == gain or mix[give] <= 1 or spent >= budget:
                    continue
                trial = dict(mix)
                trial[give] -= 1
                trial[gain] += 1
                key, out = run(trial)
                spent += 1
                if key < best_key:
                    mix, best_key, best_out = trial, key, out
                    improved = True
                    if log:
                        log('static mix %s: %d refused' % (
                            mix_text(classes, mix), out.refused))
                    break
            if improved:
                break
    return mix, best_out


def mix_text(classes, mix):
    return ', '.join('%s x%d' % (classes[k].name, n)
                     for k, n in sorted(mix.items()))
