"""Carry a reclaimer Decision out through the compute API.

Steps run in the order ``Reclaimer.steps`` gives (live migrations, the
owners' notices, then after the grace period the evictions), one at a
time; the first failure stops the decision. Before telling an owner and
again before evicting, the server is read afresh and must still be a
server of a preemptible flavor in a state that can be evicted: the
planner's view may be minutes old, and an on-demand server is never
touched whatever the plan says (a resize to an on-demand flavor during
the grace period saves the server).

An eviction is done when the server holds no GPU any more (its Placement
allocations are gone): shelve-offload (shelve, then offload unless Nova's
``shelved_offload_time`` = 0 already did) or delete. A live migration
is done when the server is ACTIVE on its destination, by the core's rule
(``core.defrag.CallbackMover``, which defragmentation uses too). Waiting
polls with tenacity and is cut short by ``stop`` (the service stopping).
"""

import dataclasses
import datetime
import threading
import time

from oslo_log import log as logging
import tenacity

from nova_gpu.core import defrag
from nova_gpu.core import exceptions
from nova_gpu import owner_notice
from nova_gpu.reclaim import notices as notification
from nova_gpu.reclaim import planner_view as inventory
from nova_gpu.reclaim import reclaimer

LOG = logging.getLogger(__name__)
METADATA_KEY = 'nova_gpu_reclaim'
SHELVED = 'SHELVED'
OFFLOADED = 'SHELVED_OFFLOADED'
# Poll interval of a live migration when ``poll_s`` is 0 (tests).
_MIN_POLL_S = 0.01


class StepFailed(exceptions.GpuError):
    """A step could not be carried out; the decision stops there."""


@dataclasses.dataclass
class EvictionResult:
    """What carrying out one reclaim decision did."""

    evicted: list = dataclasses.field(default_factory=list)
    migrated: list = dataclasses.field(default_factory=list)
    notified: list = dataclasses.field(default_factory=list)
    failed: str = None  # why the decision stopped, or None

    @property
    def ok(self):
        return self.failed is None


def _utc(ts):
    return datetime.datetime.fromtimestamp(
        ts, datetime.timezone.utc).strftime('%Y-%m-%dT%H:%M:%SZ')


class Executor:
    """See the module docstring. ``is_spot(extra_specs)``: the flavor
    grammar's rule; ``notifier``: a ``notification.Notifier`` or None.
    """

    def __init__(self, compute, is_spot, notifier=None, timeout_s=300.0,
                 poll_s=2.0, clock=None, stop=None):
        self.compute = compute
        self.is_spot = is_spot
        self.notifier = notifier
        self.timeout_s = timeout_s
        self.poll_s = poll_s
        self.clock = clock or time.time
        self.stop = stop or threading.Event()

    def carry_out(self, decision, info=None):
        """Run ``decision``'s steps; an EvictionResult. ``info``: server id ->
        ServerInfo of the plan (owner, host) for the notifications.
        """
        info = info or {}
        outcome = EvictionResult()
        start = self.clock()
        try:
            for step in decision.steps:
                wait = start + step.at_s - self.clock()
                if wait > 0 and self.stop.wait(wait):
                    raise StepFailed('stopped before %s of server %s'
                                     % (step.action, step.server))
                self._step(decision, step, start, info, outcome)
        except StepFailed as e:
            outcome.failed = str(e)
            LOG.warning('Reclaim stopped: %s', e)
        return outcome

    # -- one step ---------------------------------------------------------

    def _step(self, decision, step, start, info, outcome):
        if step.action == reclaimer.LIVE_MIGRATE:
            self._migrate(step, outcome)
        elif step.action == reclaimer.NOTIFY:
            self._notify(decision, step, start, info, outcome)
        elif step.action in reclaimer.ACTIONS:
            self._evict(step, info, outcome)
        else:
            raise StepFailed('unknown step %r' % (step.action,))

    def _fresh_spot(self, server_id, what):
        server = self.compute.server(server_id)
        if server is None:
            return None
        if not self.is_spot(server.extra_specs):
            raise StepFailed('server %s is not of a preemptible flavor now: '
                             'not %s' % (server_id, what))
        return server

    def _notify(self, decision, step, start, info, outcome):
        server = self._fresh_spot(step.server, 'notified')
        if server is None:
            return  # gone already: its GPU is free
        action = [s.action for s in decision.steps
                  if s.server == step.server and s.action in
                  reclaimer.ACTIONS]
        action = action[0] if action else ''
        at = start + max([s.at_s for s in decision.steps
                          if s.server == step.server] or [0.0])
        text = ('%s at %s: GPU capacity reclaimed for on-demand servers '
                '(gpu:preemptible flavor)' % (action, _utc(at)))
        # A key that cannot be set is logged: the notification still
        # tells the owner, and the eviction goes on.
        owner_notice.tell(
            self.compute, self.notifier, step.server, METADATA_KEY, text,
            notification.NoticePayload(
                step.server, action, _utc(at), server.project_id,
                server.user_id, server.host, decision.trigger, step.why))
        LOG.info('Told the owner of spot server %s: %s', step.server, text)
        outcome.notified.append(step.server)

    def _evict(self, step, info, outcome):
        server = self._fresh_spot(step.server, 'evicted')
        if server is None:
            outcome.evicted.append(step.server)
            return
        if server.status not in inventory.EVICTABLE_STATES + (
                SHELVED, OFFLOADED):
            raise StepFailed('server %s is %s: not evicted'
                             % (step.server, server.status))
        LOG.info('Evicting spot server %s (%s): %s', step.server,
                 step.action, step.why)
        try:
            if step.action == reclaimer.DELETE:
                self.compute.delete(step.server)
            elif server.status not in (SHELVED, OFFLOADED):
                self.compute.shelve(step.server)
        except Exception as e:
            raise StepFailed('%s of server %s failed: %s'
                             % (step.action, step.server, e)) from e
        if step.action == reclaimer.SHELVE_OFFLOAD:
            self._offload(step.server)
        self._wait(step.server, lambda s: s is None or not s.providers,
                   'freed of its GPU')
        outcome.evicted.append(step.server)
        if self.notifier is not None:
            self.notifier.send(notification.EvictedPayload(
                step.server, step.action, server.project_id, server.user_id,
                server.host))

    def _offload(self, server_id):
        server = self._wait(
            server_id, lambda s: s is None or s.status in (SHELVED,
                                                           OFFLOADED),
            'shelved')
        if server is not None and server.status == SHELVED:
            try:
                self.compute.shelve_offload(server_id)
            except Exception as e:
                raise StepFailed('shelve-offload of server %s failed: %s'
                                 % (server_id, e)) from e
            self._wait(server_id,
                       lambda s: s is None or s.status == OFFLOADED,
                       'offloaded')

    def _migrate(self, step, outcome):
        server = self.compute.server(step.server)
        if server is None or server.status != 'ACTIVE':
            raise StepFailed('server %s is not ACTIVE: not live-migrated'
                             % step.server)
        # The core's live-migrate-then-wait (the one defragmentation
        # uses), over this executor's compute client and stop event.
        mover = defrag.CallbackMover(
            self.compute.live_migrate, self._state,
            timeout=self.timeout_s, interval=self.poll_s or _MIN_POLL_S,
            sleep=self._sleep_or_stop)
        try:
            mover.live_migrate(step.server, step.destination)
        except Exception as e:
            raise StepFailed('live migration of server %s failed: %s'
                             % (step.server, e)) from e
        try:
            mover.wait(step.server, step.destination)
        except defrag.MigrationFailed as e:
            raise StepFailed('server %s did not arrive on %s: %s'
                             % (step.server, step.destination, e)) from e
        outcome.migrated.append(step.server)

    def _state(self, server_id):
        if self.stop.is_set():
            raise StepFailed('stopped before server %s was moved'
                             % server_id)
        server = self.compute.server(server_id)
        if server is None:
            return None
        return defrag.ServerState(server.status, server.host)

    def _sleep_or_stop(self, seconds):
        if self.stop.wait(seconds):
            raise StepFailed('stopped while waiting for a live migration')

    def _wait(self, server_id, done, what):
        """The server once ``done(server)`` (None when gone)."""
        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_result(lambda s: s is not _DONE_MARK),
            stop=tenacity.stop_after_delay(self.timeout_s),
            wait=tenacity.wait_fixed(self.poll_s),
            sleep=self._sleep, reraise=True)
        found = {}

        def attempt():
            if self.stop.is_set():
                raise StepFailed('stopped before server %s was %s'
                                 % (server_id, what))
            server = self.compute.server(server_id)
            if done(server):
                found['server'] = server
                return _DONE_MARK
            return server
        try:
            retrying(attempt)
        except tenacity.RetryError:
            raise StepFailed('server %s was not %s within %.0f s'
                             % (server_id, what, self.timeout_s)) from None
        return found['server']

    def _sleep(self, seconds):
        self.stop.wait(seconds)


_DONE_MARK = object()
