"""Ranking: one sort key, and the order of a host's GPU sets and candidates.

For one host and one request, ``rank`` lists every feasible GPU set the
placement engine (``core.engine``) finds, best first, by ``sort_key``;
``evaluate`` scores a set the engine did not list (one Placement offered);
``order`` sorts a host's allocation candidates by the same key and says
which of the first ones are equally good (``tied``), among which each
request takes one at random (``core.engine.tie_break``, applied per
request by the view). The ranking rules themselves (cost, fragmentation,
topology, what is equally good) are the core's; this module only puts the
request's alternatives side by side and memoises, since hosts in the same
state and the same request get the same ranking.
"""

import dataclasses
import functools
import itertools

import cachetools

from nova_gpu.core import engine as engine_mod
from nova_gpu.core import request as request_mod
from nova_gpu.scheduler import hosts as hosts_mod

# Rankings memoised, shared by hosts in the same state; at most this many.
MAX_RANKINGS = 50000
# Distinct host states and requests named by small ints; at most this many.
MAX_NAMES = 100000
# Candidate orders memoised per ranking (one per distinct candidate list,
# in GPU indices, that Placement returned for hosts in that state).
MAX_ORDERS = 64

# Costs are compared to this many decimals (float noise is a tie).
COST_DIGITS = engine_mod.COST_DIGITS

# Sorts after every known sort key (candidates whose GPUs are unknown).
UNKNOWN = (float('inf'),)


def sort_key(spec, alternative, choice, free_milli, gpus):
    """The one order of GPU sets: device size (when asked by need), cost,
    the request's own alternative order, then best fit and the lowest GPU
    indices so that ties are stable (``tied``: keys equal but for the
    indices are equally good).
    """
    order = spec.alternatives.index(alternative)
    sizes = spec.sizes
    # Rounded: equal choices computed along different paths differ in the
    # last bits of a float, which must not decide between them.
    return (sizes[order] if order < len(sizes) else 0,
            round(choice.cost, COST_DIGITS), order, free_milli, gpus)


@dataclasses.dataclass(frozen=True)
class Ranked:
    """One feasible GPU set on a host, with its cost."""

    gpus: tuple
    choice: engine_mod.Choice
    request: request_mod.GpuRequest
    free_milli: int  # free capacity of these GPUs before the placement
    key: tuple  # sort_key


class Ranking:
    """Feasible GPU sets of one host for one request, best first.

    ``by_gpus`` maps a sorted GPU index tuple to its best Ranked, or to
    None when that set cannot serve the request; sets the engine did not
    list are evaluated when a Placement candidate uses them, and memoised.
    ``orders`` memoises candidate orders (``order``).
    """

    __slots__ = ('items', 'by_gpus', 'why', 'orders', 'cells',
                 'evaluators')

    def __init__(self, items, why=None, cells=None):
        self.items = items
        self.cells = cells  # Nova's NUMA cell usage it was ranked with
        self.evaluators = None  # alternative -> engine evaluator
        self.orders = {}  # candidates' GPU sets -> (order, best)
        self.by_gpus = {}
        for item in items:
            self.by_gpus.setdefault(item.gpus, item)
        self.why = why


def _ranked(host, spec, alternative, choice):
    gpus = choice.placement.gpus
    free = sum(host.gpus[i].free_milli for i in gpus)
    return Ranked(gpus, choice, alternative, free,
                  sort_key(spec, alternative, choice, free, gpus))


def rank(engine, entry, spec):
    """A new Ranking of ``entry``'s GPUs for ``spec`` (no memo)."""
    host = entry.host
    alts = [a for model in sorted(entry.models) + ['*']
            for a in spec.per_model.get(model, ())]
    if not alts:
        if not host.gpus:
            return Ranking((), 'no GPUs reported')
        models = sorted({m for a in spec.alternatives
                         for m in a.models or ()})
        return Ranking((), 'has no GPU of model %s (it has %s)'
                       % (', '.join(models), ', '.join(sorted(
                           {g.model.name for g in host.gpus}))))
    items = [_ranked(host, spec, alt, choice)
             for alt in dict.fromkeys(alts)
             for choice in engine.rank(host, alt)]
    items.sort(key=_by_key)
    why = None if items else engine.why_not(host, alts[0])
    return Ranking(tuple(items), why)


def evaluate(engine, entry, spec, gpus, ranking=None):
    """Ranked for the GPU set ``gpus`` (sorted indices), or None if it
    cannot serve ``spec``: the first alternative that fits, as ``rank``
    would score it. A set naming one GPU twice is None: every request
    asks one device per GPU (``core.request``), but a candidate may put
    two devices on two providers of one GPU (two VFs: Placement's
    ``group_policy=isolate`` separates providers, not GPUs).

    With the ``ranking`` of ``entry``'s state, the engine's per-host
    work is shared by every set evaluated on it (and by every host in
    that state), as long as the host it was done on
    cannot change: a shared reported state (``HostEntry.own_host`` false,
    copied on write), not a host with claims of its own.
    """
    host = entry.host
    if not gpus or any(not 0 <= i < len(host.gpus) for i in gpus):
        return None
    if len(gpus) > 1 and len(set(gpus)) != len(gpus):
        return None
    if entry.own_host:
        ranking = None
    elif ranking is not None and ranking.evaluators is None:
        ranking.evaluators = {}
    for alt in spec.alternatives:
        if ranking is None:
            choice = engine.evaluate(host, alt, gpus)
        else:
            evaluator = ranking.evaluators.get(alt)
            if evaluator is None:
                evaluator = ranking.evaluators[alt] = engine.evaluator(
                    host, alt)
            choice = evaluator(gpus, host)
        if choice is not None:
            return _ranked(host, spec, alt, choice)
    return None


def order(ranking, gpu_sets, evaluate_set):
    """Candidates kept, best first, the Ranked of the first, and of the
    first ones equally good.

    ``gpu_sets`` lists each candidate's GPU indices (None: unknown, kept
    after the others; ``hosts.LOST``: on a GPU its host's agent cannot
    read, dropped); ``evaluate_set(gpus)`` gives the Ranked of a set or
    None (the candidate is dropped). Returns ``(indices, best, ties)``,
    memoised in ``ranking`` per ``gpu_sets``; ``best`` is None when the
    first kept candidate's GPUs are unknown; ``ties`` holds the Ranked of
    the first ``len(ties)`` candidates, which are equally good
    (``leading_ties``): devices of one GPU set (VFs of one GPU), GPU sets
    in the same state. Among them the order is the stable one; which one
    a request takes is its own draw (``GpuView``).
    """
    signature = tuple(gpu_sets)
    known = ranking.orders.get(signature)
    if known is not None:
        return known
    keyed = []
    for i, gpus in enumerate(gpu_sets):
        if gpus is None:
            keyed.append((UNKNOWN, i, None))
            continue
        if gpus is hosts_mod.LOST:
            continue  # a GPU its host's agent cannot read
        ranked = evaluate_set(gpus)
        if ranked is not None:
            keyed.append((ranked.key, i, ranked))
    keyed.sort(key=_first_two)
    ties = leading_ties(r for _key, _i, r in keyed)
    known = (tuple(i for _key, i, _r in keyed),
             keyed[0][2] if keyed else None, ties)
    if len(ranking.orders) < MAX_ORDERS:
        ranking.orders[signature] = known
    return known


def tied(a, b):
    """Whether the Ranked ``a`` and ``b`` are equally good: the same sort
    key but for the GPU indices (the same device size, alternative and
    free capacity, and costs ``core.engine.equally_good``), so that only
    the stable order among ties would put one first.
    """
    ka, kb = a.key, b.key
    return (ka[0] == kb[0] and ka[2:4] == kb[2:4]
            and engine_mod.equally_good(a.choice, b.choice))


def leading_ties(rankeds):
    """The Ranked of the first items of ``rankeds`` (an iterable, best
    first; None: unknown GPUs) that are equally good as the first, as a
    tuple: empty when the first is unknown.
    """
    found = []
    for ranked in rankeds:
        if ranked is None or (found and not tied(found[0], ranked)):
            break
        found.append(ranked)
    return tuple(found)


def _by_key(ranked):
    return ranked.key


def _first_two(item):
    return item[0], item[1]


class Rankings:
    """Memoised rankings, shared by hosts in the same state.

    A ranking depends on the host's state (``HostEntry.key``), the
    request, the demand's version and the NUMA cell usage Nova reports;
    equal keys give equal rankings.
    """

    def __init__(self):
        self._cache = cachetools.LRUCache(MAX_RANKINGS)
        counter = itertools.count()
        # Small ints for host states and requests: cheap to hash and
        # compare in the memo keys of every host of every request.
        self.name = functools.lru_cache(maxsize=MAX_NAMES)(
            lambda value: next(counter))

    def get(self, key):
        return self._cache.get(key)

    def put(self, key, ranking):
        self._cache[key] = ranking
