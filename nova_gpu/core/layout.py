"""Carve to demand: choose each idle GPU's configuration from the demand.

A GPU serves one configuration at a time (a ``Layout``): whole-GPU
passthrough, one time-sliced vGPU type (homogeneous: every catalog model
has ``time_sliced_mixing`` false), or a MIG layout (GPU instances at valid
start slices, each with its MIG-backed vGPU type or bare). The planner
turns the demand the scheduler already measures into layouts:

* The demand is a list of ``DemandClass``: a weight (share of arrivals)
  and, per GPU model, the options that serve one unit of it (``WHOLE``,
  ``('vgpu', type)``, ``('mig', gi_profile, type_or_None)``).
* The free supply of a class is how many more units of it the host can
  take now. The planner aims for free supply in proportion to arrivals:
  it maximises, leximin, the ratios ``free_units / weight`` (the class
  that would run out first gets the next idle GPU). That is what keeps
  the next arrivals placeable whatever their mix.
* A GPU with anything in use keeps its layout: the planner never touches
  a device in use (its free units still count as supply).
* Idle GPUs without a layout are always carved. An idle GPU with a
  layout is re-carved only when it has held that layout for
  ``min_hold`` seconds, at most ``max_changes`` GPUs per plan, and only
  when the change raises the first differing ratio by the factor
  ``1 + hysteresis`` (so two near-equal plans do not flap).
* Every decision carries a one-line reason.

Pure core: no OpenStack imports. The simulator (``nova_gpu.sim.carving``)
and the agent run this same function.
"""

import dataclasses
import math

from nova_gpu.core import exceptions
from nova_gpu.core import host as host_mod

# Option tags: what one unit of a class is on a GPU model.
WHOLE = ('whole',)
# Layout kinds.
PASSTHROUGH = 'passthrough'
TIME_SLICED = 'vgpu'
MIG = 'mig'
LAYOUT_KINDS = (PASSTHROUGH, TIME_SLICED, MIG)

# Defaults; the agent takes them from its options.
DEFAULT_HYSTERESIS = 0.25
DEFAULT_MIN_HOLD = 600.0
DEFAULT_MAX_CHANGES = 2


@dataclasses.dataclass(frozen=True)
class Layout:
    """What a GPU is set up to serve.

    ``instances`` (MIG only) are ``(gi_profile, start_slice, vgpu_type)``
    with ``vgpu_type`` None for a bare GPU instance.
    """

    kind: str
    vgpu_type: str = None
    instances: tuple = ()

    def __post_init__(self):
        if self.kind not in LAYOUT_KINDS:
            raise exceptions.InvalidRequest(
                'unknown layout kind %r (allowed: %s)'
                % (self.kind, ', '.join(LAYOUT_KINDS)))
        if (self.kind == TIME_SLICED) != bool(self.vgpu_type):
            raise exceptions.InvalidRequest(
                'a time-sliced layout, and only it, names one vGPU type')
        if self.kind != MIG and self.instances:
            raise exceptions.InvalidRequest(
                'only a MIG layout has GPU instances')
        if self.kind == MIG:
            object.__setattr__(self, 'instances',
                               tuple(sorted(tuple(i)
                                            for i in self.instances)))
            if not self.instances:
                raise exceptions.InvalidRequest(
                    'a MIG layout needs at least one GPU instance')

    def describe(self):
        if self.kind == PASSTHROUGH:
            return 'passthrough'
        if self.kind == TIME_SLICED:
            return 'vGPU %s' % self.vgpu_type
        return 'MIG ' + ' '.join(
            '%s@%d%s' % (gi, start, '(%s)' % vgpu if vgpu else '')
            for gi, start, vgpu in self.instances)

    def options(self):
        """The option each unit of this layout serves, with its count."""
        if self.kind == PASSTHROUGH:
            return {WHOLE: 1}
        if self.kind == TIME_SLICED:
            return {('vgpu', self.vgpu_type): None}  # count: from the model
        counts = {}
        for gi, _start, vgpu in self.instances:
            key = ('mig', gi, vgpu)
            counts[key] = counts.get(key, 0) + 1
        return counts


def check_layout(model, layout):
    """Raise InvalidRequest unless ``layout`` can be made on ``model``.

    A scratch ``Gpu`` does the checking, so the rules (start slices,
    compute slices, which vGPU type a GPU instance backs) are the core's
    one set of rules.
    """
    if layout.kind == PASSTHROUGH:
        return
    if layout.kind == TIME_SLICED:
        profile = model.vgpu_profile(layout.vgpu_type)
        if profile.mig_backed:
            raise exceptions.InvalidRequest(
                '%s is MIG-backed: it needs a MIG layout' % profile.name)
        return
    if not model.mig_capable:
        raise exceptions.InvalidRequest('%s does not support MIG'
                                        % model.name)
    scratch = host_mod.Gpu(0, model, mig_enabled=True)
    for gi, start, vgpu in layout.instances:
        try:
            scratch.take(host_mod.Slot(0, host_mod.MIG, (gi, start, vgpu)))
        except exceptions.GpuError as e:
            raise exceptions.InvalidRequest('MIG layout %s on %s: %s' % (
                layout.describe(), model.name, e)) from None


def gpu_for_layout(gpu, layout):
    """A fresh, empty ``Gpu`` like ``gpu`` but set up for ``layout``.

    The simulator swaps it in when it carves an idle GPU; the enabled
    vGPU types are exactly the layout's, so ``Gpu``'s own fit rules
    refuse anything else.
    """
    if layout is None or layout.kind == PASSTHROUGH:
        mig, types = False, None
    elif layout.kind == TIME_SLICED:
        mig, types = False, (layout.vgpu_type,)
    else:
        mig = True
        types = tuple(sorted({v for _g, _s, v in layout.instances if v}))
    return host_mod.Gpu(gpu.index, gpu.model, address=gpu.address,
                        numa_node=gpu.numa_node,
                        pcie_switch=gpu.pcie_switch,
                        nvlink_peers=gpu.nvlink_peers, mig_enabled=mig,
                        vgpu_types=types or None)


@dataclasses.dataclass(frozen=True)
class DemandClass:
    """One kind of request, its share of arrivals and what serves it.

    ``options`` maps a GPU model name to the options (see the module
    docstring) that serve one unit of this class on that model, best
    first. ``units`` is how many units one request takes (whole GPUs of
    a multi-GPU request).
    """

    name: str
    weight: float
    options: dict
    units: int = 1

    def on(self, model):
        return self.options.get(model.name, ())


def classes_from_demand(demand, models):
    """Demand classes for the scheduler's ``fragmentation.Demand``.

    A vGPU request names its type: time-sliced types are served by that
    type, MIG-backed ones by a GPU instance of their profile carrying
    it; a MIG request by a bare instance; a whole-GPU request for ``n``
    GPUs by ``n`` passthrough GPUs. Requests the planner cannot carve
    for (shares, "any vGPU type") are left out: their names are
    returned so that the caller can say so.
    """
    classes, skipped = [], []
    for item in demand.items:
        req = item.request
        if req is None:
            continue
        options = {}
        for model in models:
            if req.models is not None and not (
                    model.name in req.models
                    or any(a in req.models for a in model.aliases)):
                continue
            found = _request_options(model, req)
            if found:
                options[model.name] = found
        name = _request_name(req)
        if not options:
            skipped.append(name)
            continue
        classes.append(DemandClass(name, item.weight * req.count, options,
                                   units=req.count))
    return _merge(classes), skipped


def _request_name(req):
    if req.kind == host_mod.WHOLE:
        return '%dx whole' % req.count
    return '%s %s' % (req.kind, req.profile or req.milli or 'any')


def _request_options(model, req):
    if req.kind == host_mod.WHOLE:
        return (WHOLE,)
    if req.kind == host_mod.MIG:
        if model.mig and req.profile in model.mig.profiles:
            return (('mig', req.profile, None),)
        return ()
    if req.kind == host_mod.VGPU and req.profile:
        profile = model.vgpu_profiles.get(req.profile)
        if profile is None:
            return ()
        if profile.mig_backed:
            return (('mig', profile.mig_profile, profile.name),)
        return (('vgpu', profile.name),)
    return ()


def _merge(classes):
    """One class per name (the same request counted twice adds up)."""
    merged = {}
    for cls in classes:
        old = merged.get(cls.name)
        merged[cls.name] = cls if old is None else dataclasses.replace(
            old, weight=old.weight + cls.weight)
    return list(merged.values())


def need_options(model, need_mib, types=None):
    """Options for a request asking by need: the smallest fitting profile.

    The smallest framebuffer at least ``need_mib`` among the model's
    time-sliced vGPU types and MIG-backed types (``types``, where given,
    restricts the type names, e.g. to one board's), best first: the
    time-sliced type, then the MIG-backed type on the GPU instance with
    the fewest compute slices. A need of the whole framebuffer or more
    is passthrough.
    """
    if need_mib >= model.framebuffer_mib:
        return (WHOLE,)
    fitting = [p for p in model.vgpu_profiles.values()
               if p.framebuffer_mib >= need_mib
               and (types is None or p.name in types)
               and not p.name.endswith('ME')]
    if not fitting:
        return (WHOLE,)
    size = min(p.framebuffer_mib for p in fitting)
    found = []
    for p in sorted(fitting, key=lambda p: p.name):
        if p.framebuffer_mib != size:
            continue
        if p.mig_backed:
            gi = model.mig.profiles[p.mig_profile]
            found.append((1, gi.compute_slices,
                          ('mig', p.mig_profile, p.name)))
        else:
            found.append((0, 0, ('vgpu', p.name)))
    found.sort(key=lambda f: f[:2])
    best_mig = [f for f in found if f[0] == 1][:1]
    return tuple(f[2] for f in found if f[0] == 0) + tuple(
        f[2] for f in best_mig)


# -- supply -------------------------------------------------------------


def layout_units(model, layout):
    """``{option: units}`` an empty GPU of ``model`` with ``layout`` has."""
    if layout is None:
        return {}
    if layout.kind == TIME_SLICED:
        profile = model.vgpu_profiles.get(layout.vgpu_type)
        return ({('vgpu', layout.vgpu_type): profile.max_instances}
                if profile else {})
    return layout.options()


def free_units(gpu, layout):
    """``{option: units}`` still free on ``gpu`` (public ``Gpu`` API only)."""
    if layout is None:
        return {}
    if layout.kind == PASSTHROUGH:
        return {WHOLE: 1} if gpu.fits_whole() else {}
    if layout.kind == TIME_SLICED:
        profile = gpu.model.vgpu_profiles.get(layout.vgpu_type)
        room = gpu.vgpu_room(profile) if profile else 0
        return {('vgpu', layout.vgpu_type): room} if room > 0 else {}
    taken = gpu.mig_instances
    counts = {}
    for gi, start, vgpu in layout.instances:
        if start not in taken:
            key = ('mig', gi, vgpu)
            counts[key] = counts.get(key, 0) + 1
    return counts


def class_units(classes, model, units):
    """Per class, the requests ``units`` (``{option: n}``) can take."""
    out = [0.0] * len(classes)
    for k, cls in enumerate(classes):
        total = 0
        for option in cls.on(model):
            total += units.get(option, 0)
        out[k] = total / cls.units
    return out


# -- the planner --------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class LayoutDecision:
    """The planner's choice for one GPU, and why (one line)."""

    gpu: int
    layout: object  # Layout, or None (left unconfigured)
    previous: object
    reason: str

    @property
    def changed(self):
        return self.layout != self.previous


class LayoutPlanner:
    """Chooses layouts for the idle GPUs of hosts; remembers when.

    One planner per agent (or per simulated cluster); ``held_since``
    records when each ``(host, gpu)`` got its layout, for the rate limit.
    """

    def __init__(self, hysteresis=DEFAULT_HYSTERESIS,
                 min_hold=DEFAULT_MIN_HOLD, max_changes=DEFAULT_MAX_CHANGES):
        if hysteresis < 0 or min_hold < 0 or max_changes < 0:
            raise exceptions.InvalidRequest(
                'hysteresis, min_hold and max_changes must not be '
                'negative')
        self.hysteresis = hysteresis
        self.min_hold = min_hold
        self.max_changes = max_changes
        self.held_since = {}
        self._candidates = {}

    def plan(self, host, layouts, classes, now, elsewhere=None,
             kinds=None):
        """One ``LayoutDecision`` per GPU of ``host``.

        ``layouts`` maps a GPU index to its current ``Layout`` (absent or
        None: not set up). ``elsewhere`` optionally gives, per class
        name, free units other hosts already offer (the cluster view);
        without it the host aims for the demand's mix on its own.
        ``kinds`` optionally maps a GPU index to the layout kinds it may
        be given (the agent cannot switch MIG mode, so a GPU in MIG mode
        takes MIG layouts only); a GPU absent from it takes any.
        """
        kinds = kinds or {}
        classes = [c for c in classes if c.weight > 0]
        supply = [0.0] * len(classes)
        if elsewhere:
            for k, cls in enumerate(classes):
                supply[k] += elsewhere.get(cls.name, 0)
        decisions = {}
        idle = []
        for gpu in host.gpus:
            layout = layouts.get(gpu.index)
            if layout is not None:
                _add(supply, class_units(classes, gpu.model,
                                         free_units(gpu, layout)))
            if not gpu.is_free:
                decisions[gpu.index] = LayoutDecision(
                    gpu.index, layout, layout,
                    'in use: kept %s' % _describe(layout))
            elif gpu.mixed_size:
                # Each guest's VF gets its type at start (core.mixed_size
                # decides what fits): no one layout to carve to.
                decisions[gpu.index] = LayoutDecision(
                    gpu.index, layout, layout,
                    'mixed-size vGPU mode: kept %s' % _describe(layout))
            else:
                idle.append(gpu)
        if not classes:
            for gpu in idle:
                layout = layouts.get(gpu.index)
                decisions[gpu.index] = LayoutDecision(
                    gpu.index, layout, layout,
                    'no demand to carve for: kept %s' % _describe(layout))
            return [decisions[g.index] for g in host.gpus]
        # Unconfigured idle GPUs first: carving them costs nothing.
        for gpu in idle:
            if layouts.get(gpu.index) is not None:
                continue
            layout, after = self._best(gpu.model, classes, supply,
                                       kinds.get(gpu.index))
            if layout is None:
                decisions[gpu.index] = LayoutDecision(
                    gpu.index, None, None,
                    'idle: no demand class can use a %s' % gpu.model.name)
                continue
            starved = _starved(classes, supply)
            supply = after
            self.held_since[(host.name, gpu.index)] = now
            decisions[gpu.index] = LayoutDecision(
                gpu.index, layout, None,
                'idle, not set up: carved %s (scarcest: %s)'
                % (layout.describe(), starved))
        changes = 0
        for gpu in idle:
            current = layouts.get(gpu.index)
            if current is None:
                continue
            decisions[gpu.index], supply, changed = self._recarve(
                host, gpu, current, classes, supply, now,
                changes < self.max_changes, kinds.get(gpu.index))
            changes += changed
        return [decisions[g.index] for g in host.gpus]

    def carve_for(self, host, layouts, wanted, classes, now):
        """Carve one idle GPU so that a request of ``wanted`` fits now.

        For a request that found no carved device: it is real demand, not
        a forecast, so the hold time does not apply (the re-carve still
        counts). The GPU chosen is an unconfigured one if any, else the
        idle one whose layout the demand misses least; its new layout is
        the best one (leximin) among those that serve ``wanted``. Returns
        a ``LayoutDecision`` or None when no idle GPU can serve it.
        """
        classes = [c for c in classes if c.weight > 0]
        if wanted.name not in {c.name for c in classes}:
            classes.append(dataclasses.replace(wanted, weight=1e-9))
        supply = [0.0] * len(classes)
        idle = []
        for gpu in host.gpus:
            layout = layouts.get(gpu.index)
            if layout is not None:
                _add(supply, class_units(classes, gpu.model,
                                         free_units(gpu, layout)))
            if gpu.is_free and not gpu.mixed_size and wanted.on(
                    gpu.model) and not any(
                    option in layout_units(gpu.model, layout)
                    for option in wanted.on(gpu.model)):
                idle.append(gpu)
        want = [k for k, c in enumerate(classes) if c.name == wanted.name][0]
        best = best_key = None
        for gpu in idle:
            current = layouts.get(gpu.index)
            mine = class_units(classes, gpu.model,
                               layout_units(gpu.model, current))
            base = [s - m for s, m in zip(supply, mine)]
            for layout in self._layouts(gpu.model, classes, base):
                units = class_units(classes, gpu.model,
                                    layout_units(gpu.model, layout))
                if units[want] <= 0:
                    continue
                after = list(base)
                _add(after, units)
                key = (current is None,
                       [r for r, _n in _ratios(after, classes)])
                if best_key is None or key > best_key:
                    best, best_key = (gpu, layout, current), key
        if best is None:
            return None
        gpu, layout, current = best
        self.held_since[(host.name, gpu.index)] = now
        return LayoutDecision(
            gpu.index, layout, current,
            'a %s request found no device: carved %s (was %s)'
            % (wanted.name, layout.describe(), _describe(current)))

    def _recarve(self, host, gpu, current, classes, supply, now, allowed,
                 kinds=None):
        key = (host.name, gpu.index)
        mine = class_units(classes, gpu.model,
                           layout_units(gpu.model, current))
        without = [s - m for s, m in zip(supply, mine)]
        layout, after = self._best(gpu.model, classes, without, kinds)
        if layout is None or layout == current:
            return (LayoutDecision(gpu.index, current, current,
                                   'idle: %s is still the best fit'
                                   % current.describe()), supply, False)
        held = now - self.held_since.setdefault(key, now)
        better, why = self._better(after, supply, classes)
        if not better:
            return (LayoutDecision(
                gpu.index, current, current,
                'idle: kept %s (%s)' % (current.describe(), why)),
                supply, False)
        if held < self.min_hold:
            return (LayoutDecision(gpu.index, current, current,
                                   'idle: kept %s, held %.0f s of the %.0f s '
                                   'minimum (would carve %s)'
                                   % (current.describe(), held, self.min_hold,
                                      layout.describe())), supply, False)
        if not allowed:
            return (LayoutDecision(
                gpu.index, current, current,
                'idle: kept %s, %d re-carves per plan already made (would '
                'carve %s)' % (current.describe(), self.max_changes,
                               layout.describe())), supply, False)
        self.held_since[key] = now
        return (LayoutDecision(gpu.index, layout, current,
                               're-carved %s -> %s (%s)'
                               % (current.describe(), layout.describe(), why)),
                after, True)

    def _better(self, new, old, classes):
        """Leximin with hysteresis: (is ``new`` clearly better, why)."""
        new_r = _ratios(new, classes)
        old_r = _ratios(old, classes)
        for (n, name), (o, _name) in zip(new_r, old_r):
            if math.isclose(n, o, rel_tol=1e-9, abs_tol=1e-9):
                continue
            if n > o * (1 + self.hysteresis) and n - o >= 1e-6:
                return True, ('scarcest class %s: %.3g -> %.3g free per '
                              'unit of demand' % (name, o, n))
            return False, ('gain for %s below the %.0f%% hysteresis'
                           % (name, self.hysteresis * 100)
                           if n > o else 'no class gains')
        return False, 'no class gains'

    def _best(self, model, classes, supply, kinds=None):
        """The layout of an idle ``model`` GPU best for ``supply``.

        Only layouts of ``kinds`` count, when given.
        """
        best = best_key = best_after = None
        for layout in self._layouts(model, classes, supply):
            if kinds is not None and layout.kind not in kinds:
                continue
            after = list(supply)
            _add(after, class_units(classes, model,
                                    layout_units(model, layout)))
            key = [r for r, _n in _ratios(after, classes)]
            if best_key is None or key > best_key:
                best, best_key, best_after = layout, key, after
        return best, best_after

    def _layouts(self, model, classes, supply):
        """Candidate layouts: each option alone, and a MIG mix."""
        seen = set()
        for cls in classes:
            for option in cls.on(model):
                if option in seen:
                    continue
                seen.add(option)
                if option == WHOLE:
                    yield Layout(PASSTHROUGH)
                elif option[0] == 'vgpu':
                    yield Layout(TIME_SLICED, option[1])
                elif model.mig_capable:
                    homogeneous = _homogeneous(model, option)
                    if homogeneous:
                        yield homogeneous
        if model.mig_capable:
            mixed = _mig_mix(model, classes, supply)
            if mixed is not None:
                yield mixed


def layout_for_option(model, option):
    """The homogeneous layout of ``model`` that serves ``option``."""
    if option == WHOLE:
        return Layout(PASSTHROUGH)
    if option[0] == 'vgpu':
        return Layout(TIME_SLICED, option[1])
    layout = _fill_mig(model, [option]) if model.mig_capable else None
    if layout is None:
        raise exceptions.InvalidRequest('%s cannot serve %r'
                                        % (model.name, option))
    return layout


def _add(into, values):
    for k, v in enumerate(values):
        into[k] += v


def _ratios(supply, classes):
    """``(free units per unit of weight, class name)``, ascending."""
    return sorted((s / c.weight, c.name) for s, c in zip(supply, classes))


def _starved(classes, supply):
    ratio, name = _ratios(supply, classes)[0]
    return '%s (%.3g free per unit of demand)' % (name, ratio)


def _describe(layout):
    return layout.describe() if layout is not None else 'no layout'


_HOMOGENEOUS = {}
_PLACED = {}


def _homogeneous(model, option):
    key = (model.name, option)
    if key not in _HOMOGENEOUS:
        _HOMOGENEOUS[key] = _fill_mig(model, [option])
    return _HOMOGENEOUS[key]


def _place(model, scratch, option):
    """Memoised ``_start_for``: the same question recurs every plan."""
    key = (model.name, tuple(sorted(scratch.mig_instances.values())),
           option)
    if key not in _PLACED:
        _PLACED[key] = _start_for(model, scratch, option)
    start = _PLACED[key]
    if start is not None:
        scratch.take(host_mod.Slot(0, host_mod.MIG,
                                   (option[1], start, option[2])))
    return start


def _start_for(model, scratch, option):
    """Add one GPU instance for ``option`` to ``scratch``; start or None.

    Among the free start slices, the one that leaves the most room for
    every other profile: small instances go to the end, as NVIDIA
    advises, keeping slice 0 for the large ones.
    """
    _tag, gi_name, vgpu = option
    gi = model.mig.profiles.get(gi_name)
    if gi is None:
        return None
    starts = scratch.mig_starts(gi)
    if not starts:
        return None
    others = list(model.mig.profiles.values())
    best = best_room = None
    for start in starts:
        slot = host_mod.Slot(0, host_mod.MIG, (gi_name, start, vgpu))
        scratch.take(slot)
        room = sum(len(scratch.mig_starts(p)) for p in others)
        scratch.give_back(slot)
        if best_room is None or room > best_room:
            best, best_room = start, room
    return best


def _fill_mig(model, options):
    """A MIG layout of as many instances of ``options`` (in turn) as fit."""
    scratch = host_mod.Gpu(0, model, mig_enabled=True)
    made = []
    progress = True
    while progress:
        progress = False
        for option in options:
            start = _place(model, scratch, option)
            if start is not None:
                made.append((option[1], start, option[2]))
                progress = True
    return Layout(MIG, instances=tuple(made)) if made else None


def _mig_mix(model, classes, supply):
    """A mixed MIG layout: each instance for the then-scarcest class."""
    mig_classes = [(k, [o for o in c.on(model) if o[0] == 'mig'])
                   for k, c in enumerate(classes)]
    mig_classes = [(k, opts) for k, opts in mig_classes if opts]
    if not mig_classes:
        return None
    scratch = host_mod.Gpu(0, model, mig_enabled=True)
    after = list(supply)
    made = []
    while True:
        order = sorted(mig_classes,
                       key=lambda item: after[item[0]] / classes[item[0]]
                       .weight)
        for k, opts in order:
            start = _place(model, scratch, opts[0])
            if start is not None:
                made.append((opts[0][1], start, opts[0][2]))
                after[k] += 1.0 / classes[k].units
                break
        else:
            break
    return Layout(MIG, instances=tuple(made)) if made else None
