"""A picture of the demo's GPUs: who uses which VF, vGPU or MIG slice.

One figure per cloud run: a row per host, a box per GPU, the box divided
into the units the host hands out (its VFs, the vGPU instances of a PF,
the eight memory slices of a MIG GPU, or the whole GPU), each unit
coloured by the server using it and labelled with its name; idle units
are grey.

Which unit a server holds is worked out by ``host_units``, a pure
function of the demo's DemoRun and the hosts' layouts (no Nova, no
matplotlib): the drawing only paints what it returns. matplotlib is
optional and imported only to draw.
"""

import dataclasses
import logging
import os
import re

from nova_gpu.core import catalog as catalog_mod

# How a host shows its GPUs to Nova (nova_gpu.tests.harness.cloud.HOST_PATHS).
PF_MDEV = 'pf_mdev'
VF_MDEV = 'vf_mdev'
VFIO = 'vfio'
PASSTHROUGH = 'passthrough'

PATH_WORDS = {
    PF_MDEV: 'mdev on the PF',
    VF_MDEV: 'SR-IOV, mdev on VFs',
    VFIO: 'vendor-VFIO VFs',
    PASSTHROUGH: 'whole GPUs (PCI passthrough)',
}

# The first VF of an NVIDIA SR-IOV GPU is function 4 of the PF's slot
# (0000:41:00.4 on an A100): a VF's number is its devfn past that one.
FIRST_VF_FUNCTION = 4

INSTALL_HINT = ('--plot: matplotlib is not installed (pip install '
                'matplotlib); no plot drawn')

IDLE_COLOUR = '#d9d9d9'


@dataclasses.dataclass(frozen=True)
class HostLayout:
    """What a host hands out per GPU: ``units`` of them.

    VFs on the SR-IOV paths, vGPU instances on the PF (``pf_mdev``), the
    GPU's memory slices in MIG mode, 1 for passthrough.
    """

    name: str
    model: str
    path: str
    gpus: int
    units: int
    vgpu_type: str = None
    mig: bool = False

    @property
    def unit_word(self):
        if self.mig:
            return 'MIG slice'
        if self.path in (VF_MDEV, VFIO):
            return 'VF'
        if self.path == PF_MDEV:
            return 'vGPU'
        return 'whole GPU'

    @property
    def title(self):
        head = '%s: %d x %s, %s' % (self.name, self.gpus, self.model,
                                    PATH_WORDS.get(self.path, self.path))
        if self.vgpu_type is None:
            return head
        return '%s, %s%s (%d %ss per GPU)' % (
            head, self.vgpu_type, ' on MIG' if self.mig else '', self.units,
            self.unit_word)


def layout_of(spec, catalog=None):
    """HostLayout of a demo host (``nova_gpu.tests.harness.cloud.GpuHost``).

    Read by attribute, so that this module needs no Nova test harness.
    """
    catalog = catalog or catalog_mod.load_catalog()
    model = catalog.model(spec.model)
    if spec.path == PASSTHROUGH:
        units = 1
    elif spec.mig:
        units = model.mig.memory_slices
    elif spec.path in (VF_MDEV, VFIO):
        units = spec.vf_count()
    else:
        units = model.vgpu_profile(spec.vgpu_type).max_instances
    # A mixed-size GPU's VFs take any size when a guest starts.
    vgpu_type = ('mixed sizes' if getattr(spec, 'mixed_size', False)
                 else spec.vgpu_type)
    return HostLayout(spec.name, spec.model, spec.path, spec.gpus, units,
                      vgpu_type, bool(spec.mig))


@dataclasses.dataclass(frozen=True)
class Unit:
    """Units ``start`` .. ``start + width - 1`` of a GPU; idle when
    ``server`` is None. ``label``: the VF, slice or device, in words.
    """

    start: int
    width: int
    server: str = None
    label: str = ''


@dataclasses.dataclass
class GpuUnits:
    index: int
    address: str  # the PF; None for an idle GPU no server showed
    units: list  # Unit, by start, idle ones included


@dataclasses.dataclass
class HostUnits:
    layout: HostLayout
    gpus: list  # GpuUnits, by index


class LayoutError(ValueError):
    """The outcome does not fit the host's layout."""


def host_units(outcome, layouts, catalog=None):
    """Per host, per GPU, which server holds which unit (HostUnits each).

    ``outcome``: the demo's DemoRun (``servers``: name, result, host and,
    per device, ``gpus`` (the PF), ``functions`` (VF, mdev parent or PF)
    and ``devices`` (the device in words, with its MIG slice); ``hosts``:
    per host the ``layout`` line of the allocation table).
    """
    catalog = catalog or catalog_mod.load_catalog()
    uses = {h.name: h for h in getattr(outcome, 'hosts', ())}
    result = []
    for layout in layouts:
        devices = [(server.name, gpu, function, device)
                   for server in outcome.servers
                   if server.result == 'ACTIVE' and server.host == layout.name
                   for gpu, function, device in zip(
                       server.gpus, server.functions, server.devices)]
        addresses = _gpu_addresses(layout, sorted({d[1] for d in devices}),
                                   uses.get(layout.name))
        gpus = []
        for index, address in enumerate(addresses):
            held = [d for d in devices if d[1] == address]
            gpus.append(GpuUnits(index, address, _units(
                layout, address, held, catalog)))
        result.append(HostUnits(layout, gpus))
    return result


def _gpu_addresses(layout, used, use):
    """The PF address of each GPU index; None where no server showed it.

    Servers name their GPUs by PCI address only. GPU indices are in PCI
    order, so the used addresses, sorted, go to the indices the
    allocation table's per-GPU counts show busy; without those counts
    (or when they disagree) the used GPUs are drawn first.
    """
    if len(used) > layout.gpus:
        raise LayoutError('%s: servers use %d GPUs, the host has %d'
                          % (layout.name, len(used), layout.gpus))
    busy = _busy_indices(use, layout.gpus)
    addresses = [None] * layout.gpus
    if busy is not None and len(busy) == len(used):
        for index, address in zip(busy, used):
            addresses[index] = address
        return addresses
    addresses[:len(used)] = used
    return addresses


def _busy_indices(use, gpus):
    """Indices the allocation table's ``per-GPU use`` counts show busy."""
    if use is None:
        return None
    counts = getattr(use, 'layout', '').split('(')[0].split()
    if len(counts) != gpus or not all(c.isdigit() for c in counts):
        return None
    return [i for i, c in enumerate(counts) if int(c) > 0]


_MIG = re.compile(r' (?P<profile>\d+g\.\d+gb)@(?P<start>\d+)$')


def _units(layout, address, held, catalog):
    """A GPU's units: those the servers hold, the rest idle."""
    taken = {}
    pending = []
    for name, _gpu, function, device in held:
        if layout.path == PASSTHROUGH:
            taken[0] = Unit(0, layout.units, name, 'whole GPU')
            continue
        mig = _MIG.search(device)
        if layout.mig and mig:
            profile = catalog.model(layout.model).mig_profile(
                mig.group('profile'))
            start = int(mig.group('start'))
            taken[start] = Unit(start, profile.memory_slices, name,
                                '%s %s' % (profile.name, _short(function)))
            continue
        number = _vf_number(address, function)
        if (number is not None and 0 <= number < layout.units
                and number not in taken):
            taken[number] = Unit(number, 1, name, _short(function))
        else:
            # An mdev on the PF, or a VF off the usual numbering: the
            # first free unit.
            pending.append((name, function))
    free = (u for u in range(layout.units)
            if not any(t.start <= u < t.start + t.width
                       for t in taken.values()))
    for name, function in pending:
        unit = next(free, None)
        if unit is None:
            raise LayoutError('%s GPU %s: more devices than its %d units'
                              % (layout.name, address, layout.units))
        taken[unit] = Unit(unit, 1, name, 'vGPU' if function == address
                           else _short(function))
    units = sorted(taken.values(), key=lambda u: u.start)
    for unit in range(layout.units):
        if not any(t.start <= unit < t.start + t.width for t in units):
            units.append(Unit(unit, 1, None, _idle_label(layout, unit)))
    return sorted(units, key=lambda u: u.start)


def _idle_label(layout, unit):
    if layout.mig:
        return 'slice %d' % unit
    if layout.units == 1:
        return 'idle'
    return '%s %d' % (layout.unit_word, unit)


def _devfn(address):
    """(bus, devfn) of a PCI address, or None."""
    found = re.match(r'^(?:[0-9a-f]{4}:)?([0-9a-f]{2}):([0-9a-f]{2})\.'
                     r'([0-7])$', address or '', re.I)
    if not found:
        return None
    bus, slot, function = (int(x, 16) for x in found.groups())
    return bus, slot * 8 + function


def _vf_number(pf, vf):
    """The VF's number on its PF, by NVIDIA's numbering; None if unknown."""
    a, b = _devfn(pf), _devfn(vf)
    if a is None or b is None or a[0] != b[0] or pf == vf:
        return None
    return b[1] - a[1] - FIRST_VF_FUNCTION


def _short(address):
    """A PCI address without its domain: 41:00.4."""
    return re.sub(r'^[0-9a-f]{4}:', '', address or '', flags=re.I)


def file_name(policy):
    """nova-gpu-demo-<policy>.png, the policy as a file name."""
    slug = re.sub(r'[^a-z0-9]+', '-', policy.lower()).strip('-')
    return 'nova-gpu-demo-%s.png' % slug


def colours(names):
    """A distinct colour per server name, in the order given."""
    from matplotlib import colormaps
    # tab20 pairs a dark and a light shade of each hue: the dark ones
    # first, so that neighbours in boot order differ in hue; its greys
    # (14, 15) would read as idle.
    order = [i for i in list(range(0, 20, 2)) + list(range(1, 20, 2))
             if i not in (14, 15)]
    palette = [colormaps['tab20'].colors[i] for i in order] + [
        colormaps[name].colors[i] for name in ('tab20b', 'tab20c')
        for i in range(20) if not (name == 'tab20c' and i >= 16)]
    return {name: palette[i % len(palette)] for i, name in enumerate(names)}


def draw(outcome, layouts, path, catalog=None):
    """Write the PNG of ``outcome``'s GPUs to ``path``; return the units.

    Raises ImportError when matplotlib is missing.
    """
    from matplotlib import figure as figure_mod
    hosts = host_units(outcome, layouts, catalog)
    names = [s.name for s in outcome.servers if s.result == 'ACTIVE']
    palette = colours(names)
    width = max([h.layout.gpus for h in hosts] + [1])
    fig = figure_mod.Figure(figsize=(2.1 * width, 1.55 * len(hosts) + 0.6),
                            dpi=100, layout='constrained')
    booted = len(names)
    fig.suptitle('GPU use with %s: %d of %d servers ACTIVE'
                 % (outcome.policy, booted, len(outcome.servers)),
                 fontsize=13, fontweight='bold')
    axes = fig.subplots(max(len(hosts), 1), 1, squeeze=False)[:, 0]
    for ax, host in zip(axes, hosts):
        _draw_host(ax, host, width, palette)
    fig.savefig(path)
    return hosts


def _draw_host(ax, host, width, palette):
    from matplotlib import patches
    layout = host.layout
    ax.set_xlim(0, width)
    ax.set_ylim(0, 1)
    ax.axis('off')
    ax.set_title(layout.title, loc='left', fontsize=10)
    pad, top, bottom = 0.06, 0.95, 0.22
    for gpu in host.gpus:
        left = gpu.index + pad
        span = 1 - 2 * pad
        step = span / layout.units
        for unit in gpu.units:
            x = left + unit.start * step
            w = unit.width * step
            colour = palette.get(unit.server, IDLE_COLOUR)
            ax.add_patch(patches.Rectangle(
                (x, bottom), w, top - bottom, facecolor=colour,
                edgecolor='white', linewidth=1.5))
            text = (unit.label if unit.server is None
                    else '%s\n%s' % (unit.server, unit.label))
            vertical = w < 0.3
            ax.text(x + w / 2, (top + bottom) / 2, text, ha='center',
                    va='center', fontsize=6.5 if vertical else 7.5,
                    rotation=90 if vertical else 0,
                    color=_text_colour(unit, colour), clip_on=True)
        ax.add_patch(patches.Rectangle(
            (left, bottom), span, top - bottom, fill=False,
            edgecolor='#333333', linewidth=1.2))
        ax.text(gpu.index + 0.5, 0.1, 'GPU %d%s' % (
            gpu.index, ' %s' % _short(gpu.address) if gpu.address else ''),
            ha='center', va='center', fontsize=8)


def _text_colour(unit, colour):
    """Grey on idle units, white on dark colours, else black."""
    if unit.server is None:
        return '#555555'
    red, green, blue = colour[:3]
    return 'white' if 0.299 * red + 0.587 * green + 0.114 * blue < 0.5 \
        else 'black'


def report(outcome, directory, specs):
    """Draw ``outcome`` into ``directory``; the line to tell the user."""
    # The demo logs at DEBUG; matplotlib's set-up and font search are
    # not its story.
    logging.getLogger('matplotlib').setLevel(logging.WARNING)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return INSTALL_HINT
    catalog = catalog_mod.load_catalog()
    path = os.path.join(directory, file_name(outcome.policy))
    try:
        os.makedirs(directory, exist_ok=True)
        draw(outcome, [layout_of(s, catalog) for s in specs], path, catalog)
    except (OSError, LayoutError) as exc:
        # The tables are the demo's result; a picture that cannot be
        # drawn is worth a line, not the run.
        return '--plot: no plot of %s drawn: %s' % (outcome.policy, exc)
    return 'GPU use with %s drawn in %s' % (outcome.policy, path)
