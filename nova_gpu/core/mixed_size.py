"""NVIDIA's mixed-size (heterogeneous) time-sliced vGPU mode: the fit rule.

By default a GPU runs time-sliced vGPUs of one frame-buffer size
(equal-size mode, ``host.Gpu``). From vGPU software 17 (driver R550) an
operator may switch a supported GPU to mixed-size mode, where vGPUs of
different sizes share it (NVML ``nvmlDeviceSetVgpuHeterogeneousMode``;
each type then has a placement size, "the number of slots occupied by
the vGPU type", and placement IDs where it may start,
``nvmlDeviceGetVgpuTypeSupportedPlacements``). In that mode NVIDIA lowers
the maximum of some types (e.g. L40S-8C: 6 in equal-size mode, 4 in
mixed-size mode); the catalog lists those maxima (``mixed_size_maxima``).

The model here (see doc/source/carving.rst, "Mixed-size vGPU"):

* the GPU is a grid of ``slots`` placement slots, where ``slots`` is the
  largest mixed-size maximum of the model's time-sliced types;
* a type occupies ``slots // maximum`` consecutive slots (its placement
  size) and starts only at a multiple of its placement size. The
  alignment is NVIDIA's placement-ID rule as its guide draws it; the
  per-type ID lists were not checked against a real GPU (unverified).
  Every listed maximum reproduces NVIDIA's mixed-size maxima;
* a vGPU fits where its placement slots are all free: free frame buffer
  at the wrong offset does not count.
"""

from nova_gpu.core import exceptions

MILLI = 1000


def maximum(model, profile):
    """The most vGPUs of ``profile`` on one GPU in mixed-size mode.

    The equal-size maximum where NVIDIA does not lower it.
    """
    return model.mixed_size_maxima.get(profile.name, profile.max_instances)


def supported(model):
    """``model`` can run in mixed-size mode (its catalog entry says so)."""
    return model.mixed_size_maxima is not None


def grid(model):
    """Placement slots of one GPU of ``model`` in mixed-size mode."""
    return max((maximum(model, p) for p in model.vgpu_profiles.values()
                if not p.mig_backed), default=0)


def check_model(model):
    """Problems with ``model``'s mixed-size data, as ``(type, why)`` pairs."""
    problems = []
    if not supported(model):
        return problems
    slots = grid(model)
    for name, most in sorted(model.mixed_size_maxima.items()):
        profile = model.vgpu_profiles.get(name)
        if profile is None or profile.mig_backed:
            problems.append((name, 'not a time-sliced vGPU type of %s'
                             % model.name))
        elif most > profile.max_instances:
            problems.append((name, 'mixed-size maximum %d above the '
                             'equal-size maximum %d'
                             % (most, profile.max_instances)))
    for profile in model.vgpu_profiles.values():
        if not profile.mig_backed and slots % maximum(model, profile):
            problems.append((profile.name, 'a maximum of %d does not divide '
                             'the %d placement slots'
                             % (maximum(model, profile), slots)))
    return problems


def size(model, profile):
    """Placement size (slots) of one vGPU of ``profile``."""
    _check(model, profile)
    return grid(model) // maximum(model, profile)


def placement_ids(model, profile):
    """Every placement ID (start slot) of ``profile`` on an empty GPU."""
    width = size(model, profile)
    return tuple(range(0, grid(model), width))


def _check(model, profile):
    if not supported(model):
        raise exceptions.InvalidRequest(
            '%s does not support mixed-size vGPU mode' % model.name)
    if (profile.name not in model.vgpu_profiles or profile.mig_backed):
        raise exceptions.InvalidRequest(
            '%s is not a time-sliced vGPU type of %s'
            % (profile.name, model.name))


class Placements:
    """The vGPUs on one GPU in mixed-size mode, by placement ID."""

    def __init__(self, model):
        if not supported(model):
            raise exceptions.InvalidRequest(
                '%s does not support mixed-size vGPU mode' % model.name)
        self.model = model
        self.slots = grid(model)
        self.taken = {}  # placement ID -> vGPU type name
        self.mask = 0

    def _width(self, name):
        return size(self.model, self.model.vgpu_profiles[name])

    def _block(self, start, width):
        return ((1 << width) - 1) << start

    @property
    def used_slots(self):
        return bin(self.mask).count('1')

    @property
    def used_mib(self):
        return sum(self.model.vgpu_profiles[n].framebuffer_mib
                   for n in self.taken.values())

    def free_ids(self, profile):
        """Placement IDs where one more vGPU of ``profile`` fits now."""
        width = size(self.model, profile)
        count = sum(1 for n in self.taken.values() if n == profile.name)
        if count >= maximum(self.model, profile):
            return ()
        return tuple(s for s in placement_ids(self.model, profile)
                     if not self.mask & self._block(s, width))

    def fits(self, profile):
        return bool(self.free_ids(profile))

    def choose(self, profile):
        """The placement ID for one more vGPU of ``profile``, or None.

        The one that spoils the fewest free placements of larger types
        (then the lowest), so that large vGPUs keep room.
        """
        ids = self.free_ids(profile)
        if not ids:
            return None
        width = size(self.model, profile)
        larger = sorted({size(self.model, p)
                         for p in self.model.vgpu_profiles.values()
                         if not p.mig_backed} - {width})
        larger = [w for w in larger if w > width]

        def spoiled(start):
            block = self._block(start, width)
            lost = 0
            for w in larger:
                for s in range(0, self.slots, w):
                    big = self._block(s, w)
                    if big & block and not big & self.mask:
                        lost += w
            return lost
        return min(ids, key=lambda s: (spoiled(s), s))

    def place(self, profile, start=None):
        """Create a vGPU of ``profile`` at ``start`` (None: ``choose``)."""
        if start is None:
            start = self.choose(profile)
            if start is None:
                raise exceptions.InvalidRequest(
                    'no free placement for %s on this %s'
                    % (profile.name, self.model.name))
        elif start not in self.free_ids(profile):
            raise exceptions.InvalidRequest(
                'placement ID %r is not free for %s on %s (free: %s)'
                % (start, profile.name, self.model.name,
                   list(self.free_ids(profile))))
        self.taken[start] = profile.name
        self.mask |= self._block(start, size(self.model, profile))
        return start

    def remove(self, start):
        name = self.taken.pop(start)
        self.mask &= ~self._block(start, self._width(name))

    def fragment_slots(self, profiles):
        """Free slots no vGPU of any of ``profiles`` can use now."""
        usable = 0
        for profile in profiles:
            width = size(self.model, profile)
            if sum(1 for n in self.taken.values()
                   if n == profile.name) >= maximum(self.model, profile):
                continue
            for s in self.free_ids(profile):
                usable |= self._block(s, width)
        free = ~self.mask & ((1 << self.slots) - 1)
        return bin(free & ~usable).count('1')


# (id(model), counts) -> (model, Placements): the fit checks ask the same
# few fills for every GPU of a cloud; the model is kept to check the id.
_PACKED = {}
_PACKED_MAX = 4096


def packed(model, counts):
    """A ``Placements`` holding ``counts`` (``(type, n)`` pairs); not to
    be changed (it is shared).

    A report gives how many vGPUs of each type a GPU holds, not their
    placement IDs, so they are taken as packed largest first, each at
    ``Placements.choose``'s ID. With placement sizes dividing each other
    (every modelled model) that packing leaves the most room; that the
    driver packs the vGPUs Nova creates the same way is unverified.
    Raises ``InvalidRequest`` where ``counts`` cannot be held at all.
    """
    key = (id(model), counts)
    hit = _PACKED.get(key)
    if hit is not None and hit[0] is model:
        return hit[1]
    gpu = Placements(model)
    for name, n in sorted(counts, key=lambda c: (
            -size(model, _profile(model, c[0])), c[0])):
        for _ in range(n):
            gpu.place(model.vgpu_profiles[name])
    if len(_PACKED) >= _PACKED_MAX:
        _PACKED.clear()
    _PACKED[key] = (model, gpu)
    return gpu


def _profile(model, name):
    profile = model.vgpu_profiles.get(name)
    if profile is None:
        raise exceptions.InvalidRequest('%s is not a vGPU type of %s'
                                        % (name, model.name))
    return profile


def room(model, counts, profile):
    """How many more vGPUs of ``profile`` fit beside ``counts``.

    Its free placement IDs are disjoint blocks (each a multiple of its
    size), so each takes one more vGPU, up to the type's maximum.
    """
    already = sum(n for name, n in counts if name == profile.name)
    return min(len(packed(model, counts).free_ids(profile)),
               maximum(model, profile) - already)


def used_slots(model, counts):
    """Placement slots ``counts`` takes on one GPU."""
    return packed(model, counts).used_slots


def why_not(model, counts, profile):
    """A sentence saying why ``profile`` does not fit beside ``counts``."""
    gpu = packed(model, counts)
    held = ', '.join('%d %s' % (n, name) for name, n in counts) or 'nothing'
    already = sum(n for name, n in counts if name == profile.name)
    if already >= maximum(model, profile):
        return ('mixed-size %s holds %d %s, its mixed-size maximum'
                % (model.name, already, profile.name))
    return ('mixed-size %s has no free %d-slot placement for %s '
            '(holds %s: %d of %d slots)'
            % (model.name, size(model, profile), profile.name, held,
               gpu.used_slots, gpu.slots))
