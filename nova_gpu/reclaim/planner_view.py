"""The cloud as the planner sees it: hosts from reports, servers from Nova.

Where the GPU state comes from, and why: the agents' reports (the report
topic, listened to in the reclaimer's own pool) give every GPU host's
GPUs, topology, what is allocated on each GPU and the Placement providers
that stand for each GPU; they are the scheduler's own input, so the
planner sees the cloud exactly as the GPU filter will when the refused
request is retried. nova-gpu-exporter's /v1 API is built from the same
reports but drops what planning needs (the allocated slots as the core's
``Host``, the providers' MIG slices) and would add a service the
reclaimer depends on. Which server holds which GPU is not in the reports
(they see mdevs and PCI functions, not instances): it comes from
Placement, the server's allocations, whose provider names the reports
map to GPUs.

``build`` puts both together into the core's hosts and ``moves.Server``
list. A server is spot only when its flavor says
``gpu:preemptible=true`` and its state lets it be shelved or deleted; a
server the reports cannot place (its provider unknown, or the report
older than the allocation) is left out of planning and its GPUs stay
taken, so it is never evicted on a guess.
"""

import collections
import dataclasses
import threading
import time

from oslo_log import log as logging

from nova_gpu.core import exceptions
from nova_gpu.core import host as host_mod
from nova_gpu.core import inventory
from nova_gpu.core import moves
from nova_gpu.core import report as report_mod

LOG = logging.getLogger(__name__)

# States a server can be shelved (or deleted) from without first waiting
# for Nova: the eviction candidates.
EVICTABLE_STATES = ('ACTIVE', 'SHUTOFF', 'PAUSED', 'SUSPENDED')


@dataclasses.dataclass(frozen=True)
class ServerInfo:
    """A server as the compute API and Placement show it."""

    id: str
    name: str = ''
    host: str = None
    status: str = 'ACTIVE'
    project_id: str = None
    user_id: str = None
    extra_specs: dict = dataclasses.field(default_factory=dict)
    # GPU provider name -> {resource class: amount} of its allocations
    providers: dict = dataclasses.field(default_factory=dict)


class _Held(collections.namedtuple(
        '_Held', 'generation boot_id received raw')):
    """A report the store holds, and when it was received."""

    __slots__ = ()


class ReportStore:
    """Newest valid report of every host, by the core's rule
    (``core.report.replaces``, the one the schedulers' view and the
    exporter apply: a higher generation, a new agent run or, lower, once
    the held report is older than ``reset_after``, replaces it).
    """

    def __init__(self, catalog,
                 reset_after=report_mod.GENERATION_RESET_AFTER,
                 clock=time.time):
        self.catalog = catalog
        self.reset_after = reset_after
        self.clock = clock
        self._lock = threading.Lock()
        # Signalled at every report kept (``wait_newer``).
        self._kept = threading.Condition(self._lock)
        self._held = {}  # host -> _Held

    def ingest(self, data):
        """Keep ``data`` if it replaces the report held
        (``core.report.replaces``); True when kept. Raises ReportError
        when it is invalid.
        """
        parsed = report_mod.parse(data, self.catalog)
        now = self.clock()
        with self._lock:
            held = self._held.get(parsed.host.name)
            if held is not None and not report_mod.replaces(
                    held, held.received, parsed, now,
                    self.reset_after).replaces:
                return False
            self._held[parsed.host.name] = _Held(
                parsed.generation, parsed.boot_id, now, data)
            self._kept.notify_all()
            return True

    def version(self, host):
        """``(boot_id, generation)`` of the report held for ``host``, or
        None.
        """
        with self._lock:
            return self._version(host)

    def wait_newer(self, host, version, timeout):
        """Wait until a report of ``host`` other than ``version`` (see
        ``version``) is held: the agent reported a change. True if one
        came within ``timeout`` seconds.
        """
        with self._kept:
            return self._kept.wait_for(
                lambda: self._version(host) not in (None, version),
                timeout)

    def _version(self, host):
        held = self._held.get(host)
        return None if held is None else (held.boot_id, held.generation)

    def fresh(self, stale_after):
        """{host: raw report} of the reports newer than ``stale_after`` s."""
        now = self.clock()
        with self._lock:
            return {name: held.raw for name, held in self._held.items()
                    if now - held.received <= stale_after}


@dataclasses.dataclass
class Inventory:
    hosts: dict          # name -> core Host (allocations as reported)
    servers: list        # moves.Server, on those hosts
    info: dict           # server id -> ServerInfo
    skipped: dict        # server id -> why it is not planned with


def build(reports, servers, catalog, is_spot):
    """The Inventory of ``reports`` ({host: raw}) and ``servers``
    (ServerInfo). ``is_spot(extra_specs)``: the flavor grammar's rule.
    """
    hosts, providers = {}, {}
    for name, raw in sorted(reports.items()):
        parsed = report_mod.parse(raw, catalog)
        hosts[parsed.host.name] = parsed.host
        for p in parsed.providers:
            providers[p.name] = (parsed.host.name, p)
    planned, info, skipped, freed, lagging = [], {}, {}, [], []

    def plan(server, placement):
        spot = (server.status in EVICTABLE_STATES
                and is_spot(server.extra_specs))
        planned.append(moves.Server(server.id, placement, spot=spot))
        info[server.id] = server

    try:
        for server in servers:
            if not server.providers:
                continue  # no GPU: nothing to plan with
            placement, why = _placement(server, providers)
            if placement is not None:
                try:
                    # The report must hold what Placement says the server
                    # has, and no slot twice: each is freed until all are
                    # (then given back below).
                    hosts[placement.host].free(placement)
                    freed.append(placement)
                except exceptions.GpuError as e:
                    lagging.append((server, placement, str(e)))
                    continue
            if placement is None:
                skipped[server.id] = why
                LOG.debug('Server %s left out of planning: %s', server.id,
                          why)
                continue
            plan(server, placement)
    finally:
        for placement in reversed(freed):
            hosts[placement.host].allocate(placement)
    for server, placement, why in lagging:
        # Placement holds the server's devices, its host's report does not
        # yet (the agent reports after the device change; the schedulers
        # count their own fresh placements meanwhile): where the report
        # has the room, the server is planned where Placement has it, so
        # that its GPU is not taken for free. A boot refused right after
        # others were placed was "served" by evicting nothing (devstack).
        try:
            hosts[placement.host].allocate(placement)
        except exceptions.GpuError as e:
            skipped[server.id] = 'its report disagrees: %s; %s' % (why, e)
            LOG.debug('Server %s left out of planning: %s', server.id,
                      skipped[server.id])
            continue
        LOG.debug('Server %s planned where Placement has it: its host\'s '
                  'report does not hold it yet (%s)', server.id, why)
        plan(server, placement)
    return Inventory(hosts, planned, info, skipped)


def _placement(server, providers):
    slots, where = [], set()
    for name, resources in sorted(server.providers.items()):
        found = providers.get(name)
        if found is None:
            return None, 'provider %s is in no fresh GPU report' % name
        host, provider = found
        slot = inventory.slot_of(provider.kind, provider.gpu,
                                 provider.vgpu_type, provider.mig)
        if slot is None:
            return None, 'provider %s has no vGPU type' % name
        where.add(host)
        slots.extend([slot] * sum(resources.values()))
    if len(where) != 1:
        return None, 'its GPU providers are on several hosts'
    return host_mod.Assignment(where.pop(), tuple(slots)), None
