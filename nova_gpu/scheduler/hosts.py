"""The compute hosts as the scheduler knows them: one job, their state.

Reports come in (``Hosts.ingest``), Placement provider UUIDs are mapped to
GPU indices (``HostEntry.gpus_of``), and the placements this scheduler
chose are counted as pending claims until the host's next report
(``Hosts.claim``). Nothing here ranks or decides.

Why a stale host cannot double-allocate: the scheduler only *orders and
prunes* the allocation candidates Placement returned for a request, and
every one of them already fits Placement's inventory and usage at query
time. Nova then claims candidate 0 through Placement, which refuses the
claim if another scheduler got there first, and Nova moves on. A stale
host can make a worse choice, never an over-commitment. Between reports
the claims this scheduler chose are counted, so that a multi-create
spreads its instances the way the policy wants without waiting for the
agent.

One Placement client: provider names come in the report (the core's
naming rules, ``core.report.mdev_provider_name`` / ``pci_provider_name``)
and are resolved to UUIDs here, once per change of a host's providers,
through Nova's own report client (``PlacementResolver``); see
doc/source/architecture.rst for why the scheduler, not the agent, does it.

What one publisher can cost is bounded. A report is refused before its
GPUs are read when it is no newer than the one held (``ingest``) or
larger than any real host (``core.report``'s ``MAX_TOTAL_*``). A host
that Nova has not matched to a compute node (Placement has no root
provider of that name, and Nova has not asked the filter about it) is
held for at most ``UNMATCHED_TTL`` seconds after its last report, and at
most ``MAX_UNMATCHED`` of them, oldest evicted first (``Hosts.evicted``
counts them): host names a publisher invents cannot fill the view.
"""

import collections
import functools
import itertools
import operator
import sys
import threading
import weakref

import cachetools
from oslo_config import cfg
from oslo_log import log as logging

from nova_gpu import cloud_api
from nova_gpu.core import exceptions
from nova_gpu.core import host as host_mod
from nova_gpu.core import report as report_mod

CONF = cfg.CONF
LOG = logging.getLogger(__name__)

# Candidate provider sets mapped to GPU indices, per host, at most.
MAX_PROVIDER_SETS = 512
# Contained errors remembered (logged once each) for hosts without a report.
MAX_UNREPORTED_FAILURES = 1000
# Per-host failures remembered per report (each logged once).
MAX_FAILURES = 100
# Distinct GPU index tuples sorted (``_sorted_gpus``), at most.
MAX_SORTED = 8192
# Distinct shared topologies, model sets and class sets (server types).
MAX_SHARED = 4096
# Hosts held that Nova has not matched to a compute node, at most, and
# how long one is held after its last report. A real host is matched at
# its first report (``PlacementResolver`` finds its compute node) or when
# Nova first asks the filter about it; unmatched real hosts are those
# whose nova-compute has not registered yet, which report every
# ``[gpu_agent] reconcile_interval`` (60 s) and so stay. A rollout brings
# up fewer at once; an unmatched host costs about 6 KiB (8 GPUs).
MAX_UNMATCHED = 1000
UNMATCHED_TTL = 900.0
# Evictions logged at WARNING: the first, then one in this many.
EVICTIONS_LOGGED_EVERY = 1000
# Provider kinds that hold exactly one device (inventory total 1): a VF
# with its one mdev, a whole GPU as one PCI device. A claim fills them.
UNIT_KINDS = frozenset((report_mod.VF_MDEV, report_mod.PCI_DEVICE))


@functools.lru_cache(maxsize=MAX_SHARED)
def _shared(value):
    """One copy of an immutable value that many hosts hold alike.

    10,000 hosts of one server type have the same topology, models and
    provider classes: they share one object each (the first one seen,
    which the cache returns for every equal value) instead of holding
    10,000 equal ones.
    """
    return value


_ALLOCATIONS = operator.itemgetter('allocations')

# The GPU set of a candidate that allocates on a provider of a GPU its
# host's agent left out of the report (NVML cannot read it: fallen off the
# bus, a driver fault): no GPU can serve it, and the candidate is dropped
# (``ranking.order``, which knows it by identity: this object is the one
# ``_map`` puts in every such place). Candidates whose GPUs are merely
# unknown (None: a report behind Placement) are kept, after the others.
LOST = (-1,)


@functools.lru_cache(maxsize=MAX_SORTED)
def _sorted_gpus(gpus):
    """``tuple(sorted(gpus))``, memoised: the GPU sets candidates name
    are few (permutations of a few indices), and a C-level cache lookup
    costs less than sorting into a new tuple, for every candidate of a
    cold pass.
    """
    return tuple(sorted(gpus))


def candidates_key(candidates):
    """The provider UUIDs of each allocation candidate, as a hashable key
    (built at C speed: it is built for every host of every request).
    """
    return tuple(map(tuple, map(_ALLOCATIONS, candidates)))


# Attribute of a shared core Host holding its state's number (``key``).
_STATE_ATTR = '_nova_gpu_state_key'


class HostEntry:
    """One compute node as the scheduler sees it."""

    __slots__ = ('nodename', 'host', 'own_host', 'providers', 'migs',
                 'gpu_classes', 'uuids', 'mig_uuids', 'generation',
                 'boot_id', 'version', 'pending', 'models', 'received',
                 'rp_sets', 'topology_key', 'state_key', 'failures',
                 'last_ranking', 'drivers', 'unit_names', 'unit_uuids',
                 'last_order', 'left_out', 'lost_names', 'lost_uuids',
                 'matched', 'nic_names', 'nic_uuids')

    def __init__(self, nodename, host, providers, generation, received,
                 provider_info=None, boot_id=None, drivers=None,
                 left_out=()):
        self.nodename = nodename
        # GPUs the agent left out of the report (core.report.LeftOutGpu:
        # NVML cannot read them), and the names, then UUIDs, of the
        # providers Nova may have made for them: candidates using one
        # are dropped (``LOST``).
        self.left_out = tuple(left_out)
        self.lost_names = frozenset(
            name for gpu in left_out for name in gpu.providers) or None
        self.lost_uuids = None
        # Names, then UUIDs (UUID -> NIC PF address), of the providers of
        # the RDMA NICs' VFs (core.rdma): which NIC a candidate's VFs
        # come from (``nic_vfs``).
        tree = host.pcie
        self.nic_names = frozenset(
            n.provider for n in tree.nics if n.provider) if tree else None
        self.nic_uuids = None
        # core.drivers.DriverInfo the report carried (GpuDriverFilter).
        self.drivers = drivers
        # The host as reported, shared with every host reported in the same
        # state (``Hosts.ingest``) until a claim gives this entry its own
        # copy (``own_host``).
        self.host = host
        self.own_host = False
        self.providers = providers  # provider name -> GPU index
        info = (provider_info or {}).values()
        # provider name -> (MIG profile, start) of MIG-backed providers
        self.migs = {p.name: p.mig for p in info if p.mig} or None
        # Names, then UUIDs, of providers holding one device (UNIT_KINDS):
        # a multi-create's earlier claim on one fills it (``claimed``).
        self.unit_names = frozenset(
            p.name for p in info if p.kind in UNIT_KINDS) or None
        self.unit_uuids = None
        # Resource classes a report listed for this host's GPU providers:
        # an allocation of one of them is a GPU allocation.
        self.gpu_classes = _shared(frozenset(p.resource_class for p in info))
        self.uuids = {}  # provider UUID -> GPU index
        self.mig_uuids = None  # provider UUID -> MIG slot (``migs``)
        self.rp_sets = None  # candidates_key -> GPU indices of each
        self.generation = generation
        self.boot_id = boot_id
        self.version = 0
        self.pending = []  # (expiry, placement) chosen since the report
        # Problems met ranking this report (logged once each per report).
        self.failures = None
        # What a ranking depends on besides the request: equal keys on two
        # hosts give equal rankings, so hosts in the same state share one.
        self.topology_key = _shared((
            tuple((g.numa_node, g.pcie_switch, tuple(sorted(g.nvlink_peers)))
                  for g in host.gpus),
            tuple((c.id, c.cpu_milli, c.memory_mib)
                  for _, c in sorted(host.cells.items())),
            # NVSwitch partitions, the PCIe tree and its NICs' free VFs:
            # they decide which GPU sets serve too.
            host.partitions, host.pcie and host.pcie.state()))
        self.state_key = None
        # (memo key, Ranking) of the last ranking asked: a host unchanged
        # since the last request finds it without a shared-cache lookup.
        self.last_ranking = None
        # (Ranking, candidates_key, (order, best)) of the last candidate
        # order asked: the same candidates on the same ranking as last
        # time are found without hashing either.
        self.last_order = None
        self.models = _shared(frozenset(
            m for g in host.gpus for m in (g.model.name,) + g.model.aliases))
        self.received = received
        # Nova knows this host as a compute node (``Hosts.match``): it is
        # held for as long as it is (``Hosts`` evicts unmatched ones).
        self.matched = False

    def mig_slot(self, rp_uuid):
        """(MIG profile, start) behind a MIG-backed VF provider, or None."""
        return self.mig_uuids.get(rp_uuid) if self.mig_uuids else None

    def changed(self):
        self.version += 1
        self.state_key = None
        self.host.__dict__.pop(_STATE_ATTR, None)

    def key(self, intern):
        """A small int naming this host's state (``intern`` assigns it).

        A shared reported state never changes (claims copy it first), so
        its number is kept on the shared Host for every host in it.
        """
        if self.state_key is None:
            host = self.host
            shared = not self.own_host
            key = getattr(host, _STATE_ATTR, None) if shared else None
            if key is None:
                key = intern((
                    self.topology_key,
                    tuple([g.fit_key() for g in host.gpus]),
                    host.cpu_milli, host.cpu_used, host.memory_mib,
                    host.memory_used))
                if shared:
                    setattr(host, _STATE_ATTR, key)
            self.state_key = key
        return self.state_key

    def claimed(self, candidate):
        """Providers of ``candidate`` that a claim of it fills (one
        device each), as a frozenset (empty when none or unknown).
        """
        units = self.unit_uuids
        if not units:
            return frozenset()
        return units.intersection(candidate['allocations'])

    def nic_vfs(self, candidate):
        """{NIC PF address: VFs} a candidate allocates on the RDMA NICs'
        providers (empty when none, or their UUIDs are not known yet).
        """
        nics = self.nic_uuids
        if not nics:
            return {}
        found = {}
        for rp_uuid, allocation in candidate['allocations'].items():
            address = nics.get(rp_uuid)
            if address is not None:
                found[address] = found.get(address, 0) + sum(
                    allocation['resources'].values())
        return found

    def first_failure(self, who, why):
        """True the first time ``(who, why)`` happens on this report."""
        if self.failures is None:
            self.failures = cachetools.LRUCache(MAX_FAILURES)
        return _first(self.failures, (who, why))

    def gpu_sets(self, candidates, resource_class, key=None):
        """``gpus_of`` of each candidate, as a tuple.

        Memoised per candidate list (the common case: Placement offers a
        host the same candidates request after request), by its provider
        UUIDs (``candidates_key``, which the caller may pass when it has
        built it already). ``resource_class`` may be given as
        ``request_classes(resource_class)``.
        """
        if key is None:
            key = candidates_key(candidates)
        sets = self.rp_sets
        if sets is None:
            sets = self.rp_sets = {}
        else:
            found = sets.get(key)
            if found is not None:
                return found
        found = self._map(key, candidates, resource_class)
        # A plain dict that stops learning when full (not a cachetools
        # cache): it is read for every host of every request, and a
        # C-level dict.get keeps that off Nova's per-host cost; the
        # candidate lists Placement offers one host are few and stable.
        if len(sets) < MAX_PROVIDER_SETS:
            sets[key] = found
        return found

    def _map(self, key, candidates, resource_class):
        """``gpu_sets`` without the memo: a host's first request after a
        report (a cold pass) runs this for every host.
        """
        # Every provider looked up at once, at C speed (``key`` is in
        # candidate order, each candidate's providers in a row).
        get = self.uuids.get
        flat = list(map(get, itertools.chain.from_iterable(key)))
        sizes = set(map(len, key))
        size = sizes.pop() if len(sizes) == 1 else 0
        unnamed = flat.count(None)
        if size and not unnamed:
            return tuple(map(_sorted_gpus, zip(*[iter(flat)] * size)))
        if size > 1 and unnamed == len(key):
            found = self._map_beside_root(key, candidates, resource_class,
                                          flat, size)
            if found is not None:
                return found
        # Providers that are not GPUs (the compute node's CPUs and memory
        # in every candidate, as Placement answers): dropped, unless one
        # allocates a GPU class (a GPU provider this host cannot name).
        classes = None
        lost = self.lost_uuids
        found = []
        start = 0
        for rps, candidate in zip(key, candidates):
            gpus = flat[start:start + len(rps)]
            start += len(rps)
            if None in gpus:
                if lost is not None and not lost.isdisjoint(rps):
                    found.append(LOST)
                    continue
                if classes is None:
                    classes = self._gpu_classes(resource_class)
                gpus = _named_gpus(rps, gpus, candidate['allocations'],
                                   classes)
                if gpus is None:
                    found.append(None)
                    continue
            found.append(_sorted_gpus(tuple(gpus)))
        return tuple(found)

    def _map_beside_root(self, key, candidates, resource_class, flat,
                         size):
        """``_map`` of candidates that each hold one provider this host
        cannot name, the same one in all (Placement's answer: the compute
        node's CPUs, memory and disk next to the GPU providers), at C
        speed; None when that is not the shape or when that provider
        allocates a GPU class in one of them (``_map`` decides then).
        """
        # One UUID, as many times as there are candidates: once in each
        # (a candidate's providers are the keys of a dict).
        root = set(itertools.compress(itertools.chain.from_iterable(key),
                                      map(operator.is_, flat,
                                          itertools.repeat(None))))
        if len(root) != 1:
            return None
        classes = self._gpu_classes(resource_class)
        if not all(map(classes.isdisjoint, map(_RESOURCES, map(
                operator.itemgetter(root.pop()),
                map(_ALLOCATIONS, candidates))))):
            return None
        named = itertools.compress(flat, map(operator.is_not, flat,
                                             itertools.repeat(None)))
        return tuple(map(_sorted_gpus, zip(*[named] * (size - 1))))

    def _gpu_classes(self, resource_class):
        """The resource classes that make an allocation a GPU one: those
        of ``request_classes(resource_class)`` (or that frozenset) and
        those this host's report listed.
        """
        if not isinstance(resource_class, frozenset):
            resource_class = request_classes(resource_class)
        return _union(self.gpu_classes, resource_class)

    def gpus_of(self, candidate, resource_class):
        """Sorted GPU indices a candidate allocates on, or None if unknown.

        Any provider a report listed counts (PF or VF VGPU providers, PCI
        in Placement pools and devices); an allocation of a GPU resource
        class (VGPU, PGPU, or a class a report listed for a GPU provider
        of this host) on a provider this host cannot name makes the set
        unknown.
        """
        allocations = candidate['allocations']
        uuids = self.uuids
        gpus = [uuids.get(rp_uuid) for rp_uuid in allocations]
        if None in gpus:
            gpus = self._known_gpus(allocations, resource_class)
        return tuple(sorted(gpus)) if gpus is not None else None

    def _known_gpus(self, allocations, resource_class):
        """GPU indices of a candidate with providers that are not GPUs
        (the root's VCPU, say), or None if one is a GPU provider this
        host cannot name.
        """
        rps = tuple(allocations)
        return _named_gpus(rps, list(map(self.uuids.get, rps)), allocations,
                           self._gpu_classes(resource_class))


def request_classes(resource_class):
    """Every resource class a GPU request for ``resource_class``
    allocates, as a frozenset (``HostEntry.gpu_sets`` takes it in place
    of ``resource_class``: once per request rather than once per host).
    """
    return frozenset((resource_class, 'VGPU', 'PGPU',
                      CONF.gpu_scheduler.vgpu_resource_class,
                      CONF.gpu_scheduler.whole_gpu_resource_class))


@functools.lru_cache(maxsize=MAX_SHARED)
def _union(reported, requested):
    """``reported | requested``, shared: hosts of one server type report
    the same classes (``_shared``).
    """
    return reported | requested


_RESOURCES = operator.itemgetter('resources')


def _named_gpus(rps, gpus, allocations, classes):
    """``gpus`` (the GPU index of each provider in ``rps``, None where the
    host cannot name it) less the Nones, or None if one of those
    allocates a GPU class (in ``classes``).
    """
    # At C speed: it runs for every candidate of a cold pass, whose
    # compute node Placement names in each.
    unnamed = map(operator.is_, gpus, itertools.repeat(None))
    if not all(map(classes.isdisjoint, map(_RESOURCES, map(
            allocations.__getitem__, itertools.compress(rps, unnamed))))):
        return None
    return list(itertools.compress(gpus, map(
        operator.is_not, gpus, itertools.repeat(None))))


_UNREPORTED = cachetools.LRUCache(MAX_UNREPORTED_FAILURES)


def first_failure(entry, nodename, who, why):
    """True the first time ``(who, why)`` happens on this host's report
    (or, without a report, on this host: bounded).
    """
    if entry is not None:
        return entry.first_failure(who, why)
    return _first(_UNREPORTED, (nodename, who, why))


def _first(cache, key):
    if key in cache:
        return False
    cache[key] = True
    return True


class Hosts:
    """Every host's GPUs, from agent reports, plus claims not yet reported.

    Thread-safe: nova-scheduler may run several requests at once.
    """

    def __init__(self, catalog, resolver=None, clock=None, lock=None):
        self.catalog = catalog
        self.resolver = resolver
        self.clock = clock
        self._hosts = {}
        # nodename -> HostEntry, read-only for callers: the view looks
        # every host up there on every request.
        self.by_name = self._hosts
        self._lock = lock or threading.RLock()
        # Hosts reported in the same state share one core Host (content
        # -> Host); kept only while an entry holds it.
        self._same = weakref.WeakValueDictionary()
        # Unmatched hosts (nodename -> when last reported), oldest first.
        self._unmatched = collections.OrderedDict()
        # Unmatched hosts evicted so far (too many, or too old).
        self.evicted = 0

    def get(self, nodename):
        return self._hosts.get(nodename)

    def remove(self, nodename):
        with self._lock:
            self._hosts.pop(nodename, None)
            self._unmatched.pop(nodename, None)

    @property
    def unmatched(self):
        """How many hosts held are not matched to a Nova compute node."""
        return len(self._unmatched)

    def match(self, entry):
        """Nova knows ``entry``'s host as a compute node: hold it."""
        with self._lock:
            entry.matched = True
            current = self._hosts.get(entry.nodename)
            if current is not None:
                current.matched = True
            self._unmatched.pop(entry.nodename, None)

    def _hold_unmatched(self, entry):
        """Count ``entry`` among the unmatched hosts (under the lock)."""
        self._unmatched[entry.nodename] = entry.received
        self._unmatched.move_to_end(entry.nodename)

    def _evict(self, now):
        """Drop unmatched hosts beyond ``MAX_UNMATCHED`` and those not
        reported for ``UNMATCHED_TTL`` seconds, oldest first (under the
        lock).
        """
        unmatched = self._unmatched
        while unmatched:
            nodename, seen = next(iter(unmatched.items()))
            if (len(unmatched) <= MAX_UNMATCHED
                    and now - seen <= UNMATCHED_TTL):
                return
            del unmatched[nodename]
            self._hosts.pop(nodename, None)
            self.evicted += 1
            log = (LOG.warning
                   if self.evicted % EVICTIONS_LOGGED_EVERY == 1
                   else LOG.debug)
            log('Forgetting the GPU report of %s: no Nova compute node of '
                'that name is known, and it is the oldest such host (at '
                'most %d are held, each for %d s after its last report); '
                '%d forgotten so far', nodename, MAX_UNMATCHED,
                UNMATCHED_TTL, self.evicted)

    def __len__(self):
        return len(self._hosts)

    # -- reports ------------------------------------------------------------

    def ingest(self, report):
        """Replace a host's GPUs with a fresh report; return its entry.

        Raises ``core.report.ReportError`` (naming host and field) for a
        malformed report, before anything changes. Returns the entry kept,
        which is the old one when the report is stale: that is known from
        the report's header (``core.report.parse_header``), before its
        GPUs are read.

        Which report is kept is the core's rule
        (``core.report.replaces``), the one the exporter and the reclaimer
        apply too: a higher generation replaces the held report; one
        that is not higher only when it carries another ``boot_id`` (the
        agent restarted), or, lower, when the held report arrived more
        than ``[gpu_scheduler] generation_reset_after`` seconds ago (the
        agent's generations went back, e.g. its clock ran a year ahead and
        was set right). Both are logged at WARNING. The held report
        resent (same generation and run: the claims counted since are
        kept) and a late delivery are ignored. Generations that are not
        integers in 0..2**53-1 (``inf``, floats, strings) are refused by
        the parser.
        """
        header = report_mod.parse_header(report)
        held = self._hosts.get(header.nodename)
        if held is not None and not self._newer(held, header, log=False):
            return held
        parsed = report_mod.parse(report, self.catalog)
        providers = {sys.intern(p.name): p.gpu for p in parsed.providers}
        host = parsed.host
        content = host.content()
        with self._lock:
            host = self._same.setdefault(content, host)
        entry = HostEntry(parsed.nodename, host, providers,
                          parsed.generation, self.clock(),
                          provider_info=parsed.provider_map(),
                          boot_id=parsed.boot_id,
                          drivers=getattr(parsed, 'drivers', None),
                          left_out=parsed.left_out)
        with self._lock:
            old = self._hosts.get(entry.nodename)
            if old is not None and not self._newer(old, entry):
                # Another report of this host came in while this one was
                # read.
                return old
            known = False
            if old is not None:
                # Same providers keep their UUIDs; the report supersedes
                # every claim counted so far.
                entry.version = old.version + 1
                if (old.providers == providers
                        and old.lost_names == entry.lost_names
                        and old.nic_names == entry.nic_names):
                    entry.uuids = old.uuids
                    entry.mig_uuids = old.mig_uuids
                    entry.unit_uuids = old.unit_uuids
                    entry.lost_uuids = old.lost_uuids
                    entry.nic_uuids = old.nic_uuids
                    # NIC providers Placement did not have yet (their
                    # compute not yet started) are asked again.
                    known = (len(old.uuids) == len(providers)
                             and len(old.nic_uuids or ())
                             == len(entry.nic_names or ()))
                entry.matched = old.matched
            self._hosts[entry.nodename] = entry
            if not entry.matched:
                self._hold_unmatched(entry)
            self._evict(entry.received)
        if not known:
            self.resolve(entry)
        return entry

    def _newer(self, old, entry, log=True):
        """Whether ``entry`` (a HostEntry or a report's
        ``core.report.Header``) replaces ``old``: ``core.report.replaces``.

        ``log``: say why (a header's answer is not logged: the report may
        still be refused once read).
        """
        bound = CONF.gpu_scheduler.generation_reset_after
        verdict = report_mod.replaces(old, old.received, entry,
                                      self.clock(), bound)
        if log and verdict.went_back:
            LOG.warning('GPU report %d of %s is not newer than the one '
                        'held (%d) but %s: accepted%s', entry.generation,
                        entry.nodename, old.generation, verdict.reason,
                        ' ([gpu_scheduler] generation_reset_after = %d s)'
                        % bound if verdict.name == report_mod.RESET
                        else '')
        elif log and not verdict.replaces:
            LOG.debug('Ignoring GPU report %d of %s: %s', entry.generation,
                      entry.nodename, verdict.reason)
        return verdict.replaces

    # -- provider UUIDs -----------------------------------------------------

    def resolve(self, entry):
        """Learn the Placement UUID of each GPU provider (off the hot path)."""
        if self.resolver is None or not (entry.providers
                                         or entry.lost_names):
            return
        try:
            found = self.resolver(entry.nodename, sorted(entry.providers)
                                  + sorted(entry.lost_names or ())
                                  + sorted(entry.nic_names or ()))
        except Exception as e:  # the next report retries
            LOG.warning('Cannot resolve the GPU providers of %s yet: %s',
                        entry.nodename, e)
            return
        self._set_uuids(entry, found)
        # Placement has the compute node (the resolver found its root).
        if not entry.matched:
            self.match(entry)

    def _set_uuids(self, entry, uuids_by_name):
        providers = entry.providers
        uuids = {sys.intern(uuid): providers[name]
                 for name, uuid in uuids_by_name.items()
                 if name in providers}
        migs = entry.migs
        mig_uuids = migs and {uuid: migs[name]
                              for name, uuid in uuids_by_name.items()
                              if name in migs}
        units = entry.unit_names
        unit_uuids = units and frozenset(
            uuid for name, uuid in uuids_by_name.items() if name in units)
        lost = entry.lost_names
        lost_uuids = lost and frozenset(
            uuid for name, uuid in uuids_by_name.items() if name in lost)
        tree = entry.host.pcie
        nic_uuids = entry.nic_names and {
            uuid: tree.nic_of_provider(name).address
            for name, uuid in uuids_by_name.items()
            if name in entry.nic_names}
        with self._lock:
            entry.uuids = uuids
            entry.mig_uuids = mig_uuids or None
            entry.unit_uuids = unit_uuids or None
            entry.lost_uuids = lost_uuids or None
            entry.nic_uuids = nic_uuids or None
            entry.rp_sets = None
            entry.last_order = None

    def set_provider_uuids(self, nodename, uuids_by_name):
        """Record provider UUIDs learnt elsewhere (tests, tools)."""
        self._set_uuids(self._hosts[nodename], uuids_by_name)

    # -- claims -------------------------------------------------------------

    def claim(self, entry, placement):
        """Count ``placement`` until the host's next report or the TTL."""
        # Rankings are shared by hosts in the same state: the placement
        # may name another of them.
        placement = host_mod.Assignment(entry.nodename, placement.slots,
                                        placement.numa_node,
                                        placement.cpu_milli,
                                        placement.memory_mib)
        with self._lock:
            if not entry.own_host:
                # Copy on write: other hosts share the reported state.
                entry.host = entry.host.copy(entry.nodename)
                entry.own_host = True
            try:
                entry.host.allocate(placement)
            except exceptions.GpuError as e:
                LOG.debug('Not counting claim on %s: %s', entry.nodename, e)
                return
            ttl = CONF.gpu_scheduler.pending_claim_ttl
            entry.pending.append((self.clock() + ttl, placement))
            entry.changed()

    def expire(self, entry):
        """Forget the claims of ``entry`` whose TTL has passed."""
        pending = entry.pending
        if not pending or pending[0][0] > self.clock():
            return
        with self._lock:
            now = self.clock()
            keep = []
            for expiry, placement in entry.pending:
                if expiry > now:
                    keep.append((expiry, placement))
                    continue
                try:
                    entry.host.free(placement)
                except exceptions.GpuError:
                    pass
            entry.pending = keep
            entry.changed()


class UnknownNode(exceptions.GpuError):
    """Placement has no compute node (root provider) of that name."""


class PlacementResolver:
    """Provider name -> UUID through Nova's Placement report client
    (``cloud_api.Placement.nova_report_client``; ``client``: another).

    Raises ``UnknownNode`` when Placement has no compute node of the
    name; returning means it has one (``Hosts.match``). A failed call
    raises ``cloud_api.ApiError`` (``Hosts.resolve`` contains it).
    """

    def __init__(self, client=None):
        self._client = client
        self._placement = None

    def __call__(self, nodename, names):
        if self._placement is None:
            self._placement = cloud_api.Placement.nova_report_client(
                self._client)
        roots = self._placement.providers(name=nodename)
        if not roots:
            raise UnknownNode('no resource provider named %s' % nodename)
        tree = self._placement.providers(in_tree=roots[0]['uuid'])
        wanted = set(names)
        return {rp['name']: rp['uuid'] for rp in tree
                if rp['name'] in wanted}
