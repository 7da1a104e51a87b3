"""The scheduler's view of every compute host's GPUs.

How the view learns GPU state and topology: each compute host's
nova-gpu-agent publishes a GPU report (``core.report``: models, NUMA nodes,
PCIe switches, NVLink peers, the Placement provider name of each GPU and the
devices in use) as an oslo.messaging notification; ``listener`` hands it to
``GpuView.ingest``. Provider names are resolved to Placement UUIDs when the
report arrives, never while a request is being scheduled. A scheduling
request makes no network call: it reads the view, memoised per host state
and request.

Why a stale view cannot double-allocate: the view only *orders and prunes*
the allocation candidates Placement returned for this request, and every
one of those already fits Placement's inventory and usage at query time.
Nova then claims candidate 0 through Placement, which refuses the claim if
another scheduler got there first (generation conflict / capacity) and
Nova moves on. A stale view can make a worse choice, never an
over-commitment. Between reports the view counts the placements this
scheduler chose as pending claims, so that a multi-create spreads its
instances the way the policy wants without waiting for the agent.
"""

import collections
import dataclasses
import itertools
import threading
import time
import weakref

from oslo_config import cfg
from oslo_log import log as logging

from nova_gpu.core import engine as engine_mod
from nova_gpu.core import exceptions
from nova_gpu.core import fragmentation
from nova_gpu.core import host as host_mod
from nova_gpu.core import report as report_mod
from nova_gpu.core import request as request_mod
from nova_gpu.scheduler import flavor

CONF = cfg.CONF
LOG = logging.getLogger(__name__)

# Distinct observed requests the demand keeps (the most frequent).
DEMAND_ITEMS = 16
# Rankings memoised, shared by hosts in the same state; at most this many.
MAX_RANKINGS = 50000
# A whole GPU is always part of the demand, at this share: an empty GPU is
# worth keeping empty for whoever needs all of one.
WHOLE_GPU_SHARE = 0.5


@dataclasses.dataclass(frozen=True)
class Ranked:
    """One feasible GPU set on a host, with its cost."""

    gpus: tuple
    choice: engine_mod.Choice
    request: request_mod.GpuRequest
    free_milli: int  # free capacity of these GPUs before the placement
    # Sort key: device size (when asked by need), cost, alternative order,
    # then best fit and the lowest GPU indices so that ties are stable.
    key: tuple


class Ranking:
    """Feasible GPU sets of one host for one request, best first.

    ``by_gpus`` maps a sorted GPU index tuple to its best Ranked, or to
    None when that set cannot serve the request; sets the engine did not
    list are evaluated when a Placement candidate uses them, and memoised.
    """

    __slots__ = ('items', 'by_gpus', 'why', 'orders')

    def __init__(self, items, why=None):
        self.items = items
        self.orders = {}  # candidates' provider sets -> (order, best)
        self.by_gpus = {}
        for item in items:
            self.by_gpus.setdefault(item.gpus, item)
        self.why = why


class HostEntry:
    """One compute node as the scheduler sees it."""

    __slots__ = ('nodename', 'host', 'providers', 'provider_info',
                 'gpu_classes', 'uuids', 'uuid_names', 'generation',
                 'boot_id', 'version', 'pending', 'models', 'last',
                 'received', 'rp_sets', 'topology_key', 'state_key',
                 'failures')

    def __init__(self, nodename, host, providers, generation, received,
                 provider_info=None, boot_id=None):
        self.nodename = nodename
        self.host = host
        self.providers = providers  # provider name -> GPU index
        # provider name -> core.report.Provider (kind, class, MIG slot)
        self.provider_info = dict(provider_info or {})
        # Resource classes a report listed for this host's GPU providers:
        # an allocation of one of them is a GPU allocation.
        self.gpu_classes = frozenset(
            p.resource_class for p in self.provider_info.values())
        self.uuids = {}  # provider UUID -> GPU index
        self.uuid_names = {}  # provider UUID -> provider name
        self.rp_sets = {}  # candidate's provider UUIDs -> GPU indices
        self.generation = generation
        self.boot_id = boot_id
        self.version = 0
        self.pending = []  # (expiry, placement) chosen since the report
        # Problems met ranking this report (logged once each per report).
        self.failures = set()
        # What a ranking depends on besides the request: equal keys on two
        # hosts give equal rankings, so hosts in the same state share one.
        self.topology_key = (
            tuple((g.numa_node, g.pcie_switch, tuple(sorted(g.nvlink_peers)))
                  for g in host.gpus),
            tuple((c.id, c.cpu_milli, c.memory_mib)
                  for _, c in sorted(host.cells.items())))
        self.state_key = None
        self.models = frozenset(m for g in host.gpus
                                for m in (g.model.name,) + g.model.aliases)
        self.last = None
        self.received = received

    def mig_slot(self, rp_uuid):
        """(MIG profile, start) behind a MIG-backed VF provider, or None."""
        info = self.provider_info.get(self.uuid_names.get(rp_uuid))
        return info.mig if info is not None else None

    def changed(self):
        self.version += 1
        self.state_key = None

    def key(self, intern):
        """A small int naming this host's state (``intern`` assigns it)."""
        if self.state_key is None:
            host = self.host
            self.state_key = intern((
                self.topology_key, tuple([g.fit_key() for g in host.gpus]),
                host.cpu_milli, host.cpu_used, host.memory_mib,
                host.memory_used))
        return self.state_key


class Request:
    """One instance's scheduling pass, as the filter sees it."""

    __slots__ = ('spec', 'spec_ref', 'instance_uuid', 'token')

    def __init__(self, spec_obj, spec, token):
        self.spec = spec
        self.spec_ref = weakref.ref(spec_obj)
        self.instance_uuid = getattr(spec_obj, 'instance_uuid', None)
        self.token = token


class Decision:
    """What the filter chose on a host for a request (read by weighers)."""

    __slots__ = ('spec_ref', 'instance_uuid', 'num_instances', 'ranked')

    def __init__(self, request, num_instances, ranked):
        self.spec_ref = request.spec_ref
        self.instance_uuid = request.instance_uuid
        self.num_instances = num_instances
        self.ranked = ranked


class GpuView:
    """Every host's GPUs, from agent reports, plus claims not yet reported.

    Thread-safe: nova-scheduler may run several requests at once, and the
    engine briefly mutates a host while it scores a choice.
    """

    def __init__(self, catalog=None, resolver=None, clock=time.monotonic,
                 engine_weights=None):
        self.catalog = catalog or flavor.default_catalog()
        self.resolver = resolver
        self.clock = clock
        self.engine_weights = engine_weights
        self._hosts = {}
        self._rankings = {}
        self._states = {}
        self._tokens = {}
        self._token_ids = itertools.count()
        self._lock = threading.RLock()
        self._recent = collections.deque()
        self._counts = collections.Counter()
        self._rebuilt = self.clock()
        self._demand_seen = False
        self._typical = _typical_requests(self.catalog)
        self.engine = engine_mod.PlacementEngine(self._demand(),
                                                 engine_weights)
        self.demand_version = 0

    # -- reports ------------------------------------------------------------

    def ingest(self, report):
        """Replace a host's GPUs with a fresh report; return its entry.

        Raises ``core.report.ReportError`` (naming host and field) for a
        malformed report, before anything in the view changes. Returns the
        entry kept, which is the old one when the report is stale.

        Generations never freeze a host. A report whose generation is
        lower than the one held is an out-of-order delivery, ignored,
        unless (a) it carries another ``boot_id`` than the held one (the
        agent restarted, whatever its clock says) or (b) the held report
        arrived more than ``[gpu_scheduler] generation_reset_after``
        seconds ago (an agent whose clock ran ahead, e.g. a year, and was
        set back; a report that old would have been superseded by now if
        the agent were still counting up from it). Both are logged at
        WARNING. Generations that are not integers in 0..2**53-1 (``inf``,
        floats, strings) are refused by the parser.
        """
        parsed = report_mod.parse(report, self.catalog)
        providers = {p.name: p.gpu for p in parsed.providers}
        entry = HostEntry(parsed.nodename, parsed.host, providers,
                          parsed.generation, self.clock(),
                          provider_info=parsed.provider_map(),
                          boot_id=parsed.boot_id)
        with self._lock:
            old = self._hosts.get(entry.nodename)
            if old is not None and not self._newer(old, entry):
                return old
            known = False
            if old is not None:
                # Same providers keep their UUIDs; the report supersedes
                # every claim counted so far.
                entry.version = old.version + 1
                if old.providers == providers:
                    entry.uuids = old.uuids
                    entry.uuid_names = old.uuid_names
                    known = len(old.uuids) == len(providers)
            self._hosts[entry.nodename] = entry
        if not known:
            self.resolve(entry)
        return entry

    def _newer(self, old, entry):
        """Whether ``entry`` replaces ``old`` (see ``ingest``)."""
        if entry.generation >= old.generation:
            return True
        if entry.boot_id is not None and entry.boot_id != old.boot_id:
            LOG.warning('GPU report %d of %s is older than the one held '
                        '(%d) but comes from a new agent run (boot_id %s, '
                        'was %s): accepted', entry.generation,
                        entry.nodename, old.generation, entry.boot_id,
                        old.boot_id)
            return True
        age = self.clock() - old.received
        bound = CONF.gpu_scheduler.generation_reset_after
        if age > bound:
            LOG.warning('GPU report %d of %s is older than the one held '
                        '(%d), which arrived %.0f s ago (more than '
                        '[gpu_scheduler] generation_reset_after = %d s): '
                        'accepted; the agent\'s generations went back '
                        '(clock set back?)', entry.generation,
                        entry.nodename, old.generation, age, bound)
            return True
        LOG.debug('Ignoring GPU report %d of %s: have %d (out of order)',
                  entry.generation, entry.nodename, old.generation)
        return False

    def remove(self, nodename):
        with self._lock:
            self._hosts.pop(nodename, None)

    def get(self, nodename):
        return self._hosts.get(nodename)

    def __len__(self):
        return len(self._hosts)

    def resolve(self, entry):
        """Learn the Placement UUID of each GPU provider (off the hot path)."""
        if self.resolver is None or not entry.providers:
            return
        try:
            found = self.resolver(entry.nodename, sorted(entry.providers))
        except Exception as e:  # the next report retries
            LOG.warning('Cannot resolve the GPU providers of %s yet: %s',
                        entry.nodename, e)
            return
        self._set_uuids(entry, found)

    def _set_uuids(self, entry, uuids_by_name):
        names = {uuid: name for name, uuid in uuids_by_name.items()
                 if name in entry.providers}
        with self._lock:
            entry.uuid_names = names
            entry.uuids = {uuid: entry.providers[name]
                           for uuid, name in names.items()}
            entry.rp_sets.clear()

    def set_provider_uuids(self, nodename, uuids_by_name):
        """Record provider UUIDs learnt elsewhere (tests, tools)."""
        self._set_uuids(self._hosts[nodename], uuids_by_name)

    # -- demand -------------------------------------------------------------

    def note_request(self, spec):
        """Count a request into the demand the fragmentation measure uses."""
        if not spec.alternatives:
            return
        req = _plain(spec.alternatives[0])
        window = CONF.gpu_scheduler.demand_window
        with self._lock:
            self._recent.append(req)
            self._counts[req] += 1
            while len(self._recent) > window:
                old = self._recent.popleft()
                self._counts[old] -= 1
                if not self._counts[old]:
                    del self._counts[old]
            if (not self._demand_seen or self.clock() - self._rebuilt
                    >= CONF.gpu_scheduler.demand_refresh_interval):
                self._rebuild_demand()

    def _rebuild_demand(self):
        self._rebuilt = self.clock()
        self._demand_seen = bool(self._counts)
        self.engine = engine_mod.PlacementEngine(self._demand(),
                                                 self.engine_weights)
        self.demand_version += 1

    def _demand(self):
        # The most frequent requests: each one more costs every scoring.
        items = [fragmentation.DemandItem(req, n)
                 for req, n in self._counts.most_common(DEMAND_ITEMS)]
        seen = sum(self._counts.values()) or 1
        for req in self._typical:
            items.append(fragmentation.DemandItem(
                req, max(seen, 1) / len(self._typical)))
        total = sum(i.weight for i in items) or 1
        items.append(fragmentation.DemandItem(
            request_mod.GpuRequest(host_mod.WHOLE),
            total * WHOLE_GPU_SHARE / (1 - WHOLE_GPU_SHARE)))
        return fragmentation.Demand(items)

    # -- scoring ------------------------------------------------------------

    def token(self, spec):
        """A small int standing for ``spec`` in memo keys (cheap to hash)."""
        token = self._tokens.get(spec.key)
        if token is None:
            with self._lock:
                if len(self._tokens) > 10000:
                    self._tokens.clear()
                token = self._tokens[spec.key] = next(self._token_ids)
        return token

    def _intern_state(self, state):
        with self._lock:
            if len(self._states) > MAX_RANKINGS:
                # Entries keep their numbers; only new states get new ones.
                self._states.clear()
            return self._states.setdefault(state, next(self._token_ids))

    def request(self, spec_obj, spec):
        """Per-pass state shared by every host of one filter run."""
        return Request(spec_obj, spec, self.token(spec))

    def ranking(self, entry, spec, cells=None, token=None):
        """Feasible GPU sets on ``entry`` for ``spec``, best first.

        ``cells`` is ``((id, cpu_milli, cpu_used, memory_mib, memory_used),
        ...)`` from Nova's HostState, for NUMA affinity.
        """
        if entry.pending and entry.pending[0][0] <= self.clock():
            with self._lock:
                self._expire(entry)
        key = (entry.key(self._intern_state),
               self.token(spec) if token is None else token,
               self.demand_version, cells)
        found = self._rankings.get(key)
        if found is not None:
            return found
        with self._lock:
            if cells:
                _set_cells(entry.host, cells)
            found = self._rank(entry, spec)
            if len(self._rankings) >= MAX_RANKINGS:
                self._rankings.clear()
            self._rankings[key] = found
        return found

    def _rank(self, entry, spec):
        host = entry.host
        alts = [a for model in sorted(entry.models) + ['*']
                for a in spec.per_model.get(model, ())]
        if not alts:
            models = sorted({m for a in spec.alternatives
                             for m in a.models or ()})
            return Ranking((), 'has no GPU of model %s (it has %s)'
                           % (', '.join(models), ', '.join(sorted(
                               {g.model.name for g in host.gpus}))))
        # Smallest device first when asked by need; the cost decides among
        # equals (and is all that counts for a single alternative).
        order = {a: i for i, a in enumerate(spec.alternatives)}
        size = dict(zip(spec.alternatives, spec.sizes))
        items = []
        for alt in dict.fromkeys(alts):
            for choice in self.engine.rank(host, alt):
                gpus = choice.placement.gpus
                free = sum(host.gpus[i].free_milli for i in gpus)
                items.append(Ranked(
                    gpus, choice, alt, free,
                    (size.get(alt, 0), choice.cost, order[alt], free, gpus)))
        items.sort(key=_by_key)
        why = None
        if not items:
            why = self.engine.why_not(host, alts[0])
        return Ranking(tuple(items), why)

    def evaluate(self, entry, spec, ranking, gpus):
        """Ranked for GPU set ``gpus`` (sorted indices), None if it cannot
        serve ``spec``. For sets Placement offered that the engine did not
        list; memoised in ``ranking``.
        """
        try:
            return ranking.by_gpus[gpus]
        except KeyError:
            pass
        with self._lock:
            found = self._evaluate(entry, spec, ranking, gpus)
            ranking.by_gpus[gpus] = found
        return found

    def _evaluate(self, entry, spec, ranking, gpus):
        host = entry.host
        if not gpus or any(not 0 <= i < len(host.gpus) for i in gpus):
            return None
        size = dict(zip(spec.alternatives, spec.sizes))
        for order, alt in enumerate(spec.alternatives):
            choice = self.engine.evaluate(host, alt, gpus)
            if choice is None:
                continue
            free = sum(host.gpus[i].free_milli for i in gpus)
            return Ranked(gpus, choice, alt, free,
                          (size.get(alt, 0), choice.cost, order, free, gpus))
        return None

    # -- decisions and claims ----------------------------------------------

    def decide(self, entry, request, num_instances, ranked):
        entry.last = Decision(request, num_instances, ranked)

    def decision(self, nodename, spec_obj):
        entry = self._hosts.get(nodename)
        last = entry and entry.last
        if last is None or last.spec_ref() is not spec_obj:
            return None
        return last.ranked

    def catch_claim(self, entry, request, num_instances):
        """Count the previous instance of a multi-create, if it landed here.

        Nova claims candidate 0 of the chosen host and then bumps that
        HostState's ``num_instances`` before filtering the next instance of
        the same request; candidate 0 is the set this view put first.
        """
        last = entry.last
        if (last is None or last.ranked is None
                or last.spec_ref is not request.spec_ref
                or last.instance_uuid == request.instance_uuid
                or num_instances <= last.num_instances):
            return
        entry.last = None
        self.claim(entry, last.ranked.choice.placement)

    def claim(self, entry, placement):
        """Count ``placement`` until the host's next report or the TTL."""
        # Rankings are shared by hosts in the same state: the placement
        # may name another of them.
        placement = host_mod.Placement(entry.host.name, placement.slots,
                                       placement.numa_node,
                                       placement.cpu_milli,
                                       placement.memory_mib)
        with self._lock:
            try:
                entry.host.allocate(placement)
            except exceptions.GpuError as e:
                LOG.debug('Not counting claim on %s: %s', entry.nodename, e)
                return
            ttl = CONF.gpu_scheduler.pending_claim_ttl
            entry.pending.append((self.clock() + ttl, placement))
            entry.changed()

    def _expire(self, entry):
        if not entry.pending or entry.pending[0][0] > self.clock():
            return
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


def _by_key(ranked):
    return ranked.key


def _plain(req):
    """The device part of a request, for the demand distribution."""
    return dataclasses.replace(req, cpu_milli=0, memory_mib=0,
                               numa_affinity='none')


def _set_cells(host, cells):
    for cid, cpu, cpu_used, mem, mem_used in cells:
        cell = host.cells.get(cid)
        if cell is None:
            cell = host.cells[cid] = host_mod.NumaCell(cid, cpu, mem)
        cell.cpu_milli, cell.memory_mib = cpu, mem
        cell.cpu_used, cell.memory_used = cpu_used, mem_used


def _typical_requests(catalog):
    result = []
    for line in CONF.gpu_scheduler.typical_requests:
        specs = dict(part.strip().split('=', 1) for part in line.split(';')
                     if '=' in part)
        spec = flavor.parse(specs, catalog)
        if spec is None or not spec.alternatives:
            raise exceptions.InvalidRequest(
                '[gpu_scheduler] typical_requests: %r asks for no GPU'
                % line)
        result.append(_plain(spec.alternatives[0]))
    return result


class PlacementResolver:
    """Provider name -> UUID through the Placement API (report ingestion)."""

    def __init__(self, client=None):
        self._client = client

    def _get(self, url):
        if self._client is None:
            from nova.scheduler.client import report
            self._client = report.report_client_singleton()
        resp = self._client.get(url, version='1.14')
        if not resp:
            raise exceptions.GpuError('GET %s: %s' % (url, resp.status_code))
        return resp.json()['resource_providers']

    def __call__(self, nodename, names):
        roots = self._get('/resource_providers?name=%s' % nodename)
        if not roots:
            raise exceptions.GpuError('no resource provider named %s'
                                      % nodename)
        tree = self._get('/resource_providers?in_tree=%s'
                         % roots[0]['uuid'])
        wanted = set(names)
        return {rp['name']: rp['uuid'] for rp in tree
                if rp['name'] in wanted}


_VIEW = None
_VIEW_LOCK = threading.Lock()


def get_view():
    """The process-wide view, created once.

    Reports reach it through the listener the nova-scheduler service
    starts and stops (``listener.bind_to_scheduler_service``), never
    from here: a view outlives no service by starting threads.
    """
    global _VIEW
    with _VIEW_LOCK:
        if _VIEW is None:
            _VIEW = GpuView(resolver=PlacementResolver())
        return _VIEW


def set_view(view):
    """Install ``view`` as the process-wide one (tests, demo); returns it."""
    global _VIEW
    with _VIEW_LOCK:
        _VIEW = view
    return view
