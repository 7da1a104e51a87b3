"""The cloud's GPU state as nova-gpu-exporter sees it, and its figures.

``CloudState`` keeps the newest report of every host (by the core's rule,
``core.report.replaces``, the one the schedulers' view and the reclaimer
apply: a higher generation, a new agent run or, lower, once the held
report is older than ``reset_after``, replaces it) and counts the scheduler's
notifications. ``host_figures`` computes, with the core only, what an
operator wants to see of a host:

* free devices per model and profile: how many more of each vGPU type,
  MIG profile or whole GPU fit now, each counted alone (the answer to "how
  many more of flavor X fit"), GPU by GPU, taking slots in the order the
  placement rules offer them;
* expected fragmentation (``core.fragmentation.host_fragmentation``, the
  FGD measure), in GPUs and as a share of the host's GPU capacity, against
  the demand the host is set up to serve (``offered_demand``): each
  device its GPUs offer, equally likely (the vGPU types of its Placement
  providers, the MIG profiles a GPU in MIG mode serves (``host.Gpu.
  serves_mig``: those of its MIG-backed types), a whole GPU for a
  passthrough one, every profile of the model when the report says
  nothing). An empty host has none, whatever its models; each device
  that leaves free capacity some offered device cannot use adds some;
* stranded GPUs: free capacity that no typical request can use where it
  is, GPU by GPU (no profile fits on that GPU, or the host lacks the CPU
  or memory for any request).
"""

import dataclasses
import threading
import time

from nova_gpu.core import fragmentation
from nova_gpu.core import host as host_mod
from nova_gpu.core import notification
from nova_gpu.core import report as report_mod
from nova_gpu.core import request as request_mod

WHOLE = 'whole'


@dataclasses.dataclass
class HostEntry:
    name: str
    report: object       # core report.Report
    raw: dict            # the report as received
    received: float      # when (Unix time)


@dataclasses.dataclass
class HostFigures:
    gpus: dict               # model -> GPUs
    capacity_milli: int
    free_milli: int
    free_devices: dict       # (model, kind, profile) -> how many more fit
    # (model, kind, profile) -> how many more servers asking N of them fit
    # (index N - 1, N up to MAX_DEVICES)
    free_servers: dict
    fragmentation_milli: float
    stranded_milli: int


def profile_requests(model, gpu=None):
    """(kind, profile name, GpuRequest) of every device a model offers."""
    out = [(WHOLE, WHOLE, request_mod.GpuRequest(host_mod.WHOLE))]
    for name in model.vgpu_profiles:
        out.append((host_mod.VGPU, name,
                    request_mod.GpuRequest(host_mod.VGPU, name)))
    if model.mig:
        for name in model.mig.profiles:
            out.append((host_mod.MIG, name,
                        request_mod.GpuRequest(host_mod.MIG, name)))
    return out


def offered_requests(report):
    """{GPU index: requests for each device that GPU is set up to offer}."""
    by_gpu = {}
    for p in report.providers:
        by_gpu.setdefault(p.gpu, []).append(p)
    offers = {}
    for gpu in report.host.gpus:
        model = gpu.model
        providers = by_gpu.get(gpu.index, ())
        found = set()
        types = {p.vgpu_type for p in providers if p.vgpu_type}
        types |= set(gpu.vgpu_types or ()) | set(gpu.vgpus)
        for name in types:
            found.add(request_mod.GpuRequest(host_mod.VGPU, name))
        if gpu.mig_enabled and model.mig:
            # The sizes a guest may be given here (the core's rule).
            found.update(request_mod.GpuRequest(host_mod.MIG, name)
                         for name, profile in model.mig.profiles.items()
                         if gpu.serves_mig(profile))
        if any(p.kind == report_mod.PCI_DEVICE for p in providers):
            found.add(request_mod.GpuRequest(host_mod.WHOLE))
        if not providers and not gpu.vgpu_types and not gpu.mig_enabled:
            # the report says nothing of how it is set up: any device
            found.update(r for _k, _p, r in profile_requests(model)
                         if r.kind != host_mod.MIG)
        offers[gpu.index] = frozenset(found)
    return offers


class _Group:
    """The GPUs of a host that offer the same devices.

    It duck-types a ``Host`` for ``core.fragmentation``.
    """

    def __init__(self, host, gpus):
        self.gpus = gpus
        self.cpu_free = host.cpu_free
        self.memory_free = host.memory_free


def demand_of(requests):
    """Each of ``requests`` equally likely."""
    return fragmentation.Demand([fragmentation.DemandItem(r, 1.0) for r in
                                 sorted(requests, key=lambda r: r.key())])


# The most devices one server may ask ([gpu_scheduler] max_gpu_count's
# maximum).
MAX_DEVICES = 8


def servers_fitting(rooms, count):
    """How many servers of ``count`` devices, each on its own GPU, fit.

    ``rooms``: how many more devices fit on each GPU of one host. k
    servers fit when the GPUs can give k servers ``count`` devices without
    any GPU giving one server two: ``sum(min(room, k)) >= count * k``.
    """
    best, k = 0, 1
    total = sum(rooms)
    while count * k <= total:
        if sum(min(room, k) for room in rooms) >= count * k:
            best = k
        k += 1
    return best


def gpu_room(gpu, req):
    """How many more devices of ``req`` fit on ``gpu`` now (alone)."""
    taken = []
    try:
        while len(taken) < host_mod.MILLI:
            slots = fragmentation.unit_slots(gpu, req)
            if not slots:
                break
            gpu.take(slots[0])
            taken.append(slots[0])
    finally:
        for slot in reversed(taken):
            gpu.give_back(slot)
    return len(taken)


def host_figures(host, offers, demand_of=demand_of):
    """The ``HostFigures`` of a core ``Host``.

    ``offers``: ``offered_requests`` of its report. Fragmentation is
    measured within each group of GPUs offering the same devices, against
    those devices, and summed: a GPU is no fragment of a request it was
    never set up to serve (an L4 of an A100's MIG profile).
    """
    gpus, free_devices, groups, rooms = {}, {}, {}, {}
    stranded = 0
    for gpu in host.gpus:
        name = gpu.model.name
        gpus[name] = gpus.get(name, 0) + 1
        requests = offers.get(gpu.index, frozenset())
        for kind, profile, req in profile_requests(gpu.model):
            key = (name, kind, profile)
            # What the GPU is set up to serve (its path: the types Nova
            # was given, MIG sizes, a whole GPU only where it is a PCI
            # device), not what its hardware could hold.
            room = gpu_room(gpu, req) if req in requests else 0
            free_devices[key] = free_devices.get(key, 0) + room
            rooms.setdefault(key, []).append(room)
        groups.setdefault(requests, []).append(gpu)
        free = gpu.free_milli
        if free and not any(
                fragmentation.unit_fits(gpu, r)
                and fragmentation.host_fits(host, r, free_gpus=1)
                for r in requests):
            stranded += free
    frag = 0.0
    for requests, members in groups.items():
        if requests:
            frag += fragmentation.host_fragmentation(
                _Group(host, members), demand_of(requests))
        else:  # offers nothing: all its free capacity is lost
            frag += sum(g.free_milli for g in members)
    return HostFigures(
        gpus=gpus, capacity_milli=len(host.gpus) * host_mod.MILLI,
        free_milli=sum(g.free_milli for g in host.gpus),
        free_devices=free_devices,
        free_servers={key: tuple(servers_fitting(r, n) for n in range(
            1, MAX_DEVICES + 1)) for key, r in rooms.items()},
        fragmentation_milli=frag, stranded_milli=stranded)


class CloudState:
    """Hosts' newest reports and the scheduler's notification counters."""

    def __init__(self, catalog, clock=time.time,
                 reset_after=report_mod.GENERATION_RESET_AFTER):
        self.catalog = catalog
        self.clock = clock
        self.reset_after = reset_after
        self._lock = threading.Lock()
        self._hosts = {}
        self._figures = {}     # host -> (generation, models, HostFigures)
        self._demands = {}     # offered requests -> Demand
        # Called with each HostEntry taken, outside the lock (the usage
        # ledger, ``exporter.usage``).
        self.report_observers = []
        self.counters = {'reports': 0, 'reports_rejected': 0,
                         'requests': 0, 'requests_unplaced': 0,
                         'placements': 0,
                         'refusals': dict.fromkeys(
                             notification.REFUSAL_REASONS, 0),
                         'device_changes': {}}

    # -- input ----------------------------------------------------------

    def ingest_report(self, data):
        """Validate and keep a host report; returns the HostEntry kept, or
        None when the report was ignored (``core.report.replaces``: a late
        delivery, or the held report resent). Raises ReportError.
        """
        try:
            parsed = report_mod.parse(data, self.catalog)
        except Exception:
            with self._lock:
                self.counters['reports_rejected'] += 1
            raise
        now = self.clock()
        with self._lock:
            self.counters['reports'] += 1
            held = self._hosts.get(parsed.host.name)
            if held is not None and not report_mod.replaces(
                    held.report, held.received, parsed, now,
                    self.reset_after).replaces:
                return None
            entry = HostEntry(parsed.host.name, parsed, data, now)
            self._hosts[entry.name] = entry
        for observe in self.report_observers:
            observe(entry)
        return entry

    def ingest_refusal(self, payload):
        with self._lock:
            c = self.counters
            c['requests'] += 1
            if not payload.hosts_passed:
                c['requests_unplaced'] += 1
            for reason, count in payload.refusals.items():
                c['refusals'][reason] = c['refusals'].get(reason, 0) + count

    def ingest_placement(self, payload):
        with self._lock:
            self.counters['placements'] += 1

    def ingest_device(self, payload):
        with self._lock:
            key = (payload.action, payload.kind)
            changes = self.counters['device_changes']
            changes[key] = changes.get(key, 0) + 1

    # -- output ---------------------------------------------------------

    def _demand(self, requests):
        found = self._demands.get(requests)
        if found is None:
            found = self._demands[requests] = demand_of(requests)
        return found

    def hosts(self):
        with self._lock:
            return dict(self._hosts)

    def snapshot_counters(self):
        with self._lock:
            c = dict(self.counters)
            c['refusals'] = dict(c['refusals'])
            c['device_changes'] = dict(c['device_changes'])
            return c

    def figures(self):
        """{host: (HostEntry, HostFigures)}; computed once per report."""
        hosts = self.hosts()
        result = {}
        for name, entry in hosts.items():
            key = (entry.report.generation, entry.received)
            cached = self._figures.get(name)
            if cached is None or cached[0] != key:
                # host_figures takes and gives back slots: work on a copy
                host = report_mod.parse(entry.raw, self.catalog).host
                cached = (key, host_figures(
                    host, offered_requests(entry.report), self._demand))
                self._figures[name] = cached
            result[name] = (entry, cached[1])
        for name in set(self._figures) - set(hosts):
            self._figures.pop(name, None)
        return result
