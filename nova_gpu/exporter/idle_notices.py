"""Owners told of their idle GPU devices ([gpu_exporter] idle_notify).

nova-gpu-exporter sees every host's report and the agents' idle
verdicts (``devices[].idle``, ``core.idle``). With ``idle_notify`` on,
``IdleNotices`` (a report observer of ``cloud.CloudState``) decides
after each report, by the core's rule (``core.idle.notices``), which
owners to tell, once per idle episode, as the reclaimer tells owners
(``nova_gpu.owner_notice``):

* the server's metadata key ``nova_gpu_idle`` says which devices are
  idle since when, and a smaller profile their peak fits; it is updated
  when fewer are idle, and removed when none is any more (busy again,
  released, the server moved or went away);
* a versioned notification ``gpu.idle.notice`` (``IdlePayload``,
  publisher ``nova-gpu-exporter``) on ``[gpu_exporter] report_topic``
  when an episode starts.

Report ingest never waits on the cloud: the observer only queues the
notice (``send_queue.SendQueue``: bounded, the oldest dropped when
full, failures counted and logged); one thread makes the Nova calls,
each bounded by ``idle_notice_timeout``. A notice that fails is decided
again at the host's next report. What owners were told is written
(``atomic_file``) to ``idle_notice_file`` after each notice and read
back at start, so that a restarted exporter neither tells them again
nor forgets a key to remove.
"""

import dataclasses
import datetime
import threading
import time

from oslo_log import log as logging

from nova_gpu import atomic_file
from nova_gpu import cloud_api
from nova_gpu.core import idle as idle_mod
from nova_gpu.core import notification
from nova_gpu.exporter import collector
from nova_gpu import owner_notice
from nova_gpu import send_queue

LOG = logging.getLogger(__name__)
METADATA_KEY = 'nova_gpu_idle'
PUBLISHER = 'nova-gpu-exporter'
IDLE_EVENT = 'gpu.idle.notice'
# Nova's limit on a metadata value.
MAX_TEXT = 255
QUEUE_CAPACITY = 1024
# Seconds after which a queued notice not done yet (dropped from a full
# queue) may be queued again.
PENDING_TTL = 600.0
VERSION = 1


@dataclasses.dataclass(frozen=True)
class IdlePayload(notification.Payload):
    """A server's GPU devices have stayed idle (``core.idle``)."""

    NAME = 'GpuIdlePayload'

    instance_uuid: str
    host: str
    since: str              # ISO 8601, UTC: the earliest idle device's
    devices: list = ()      # {device, model, profile, since, seconds,
    #                          peak_compute, peak_memory_mib, suggestion}
    project_id: str = None
    user_id: str = None


def _utc(ts):
    return datetime.datetime.fromtimestamp(
        ts, datetime.timezone.utc).strftime('%Y-%m-%dT%H:%M:%SZ')


def text_of(rows):
    """The metadata value: which devices, idle since when, smaller fit."""
    parts = []
    for r in rows:
        part = '%s %s' % (r.get('model'), r.get('profile'))
        if r.get('suggestion'):
            part += ' (fits %s)' % r['suggestion']
        parts.append(part)
    since = min(r['since'] for r in rows)
    text = 'GPU idle since %s: %s' % (_utc(since), '; '.join(parts))
    return text if len(text) <= MAX_TEXT else text[:MAX_TEXT - 3] + '...'


def payload_of(notice, server):
    rows = notice.devices
    keep = ('device', 'model', 'profile', 'since', 'seconds',
            'peak_compute', 'peak_memory_mib', 'suggestion')
    return IdlePayload(
        notice.server_id, notice.host, _utc(min(r['since'] for r in rows)),
        [{k: r.get(k) for k in keep} for r in rows],
        getattr(server, 'project_id', None),
        getattr(server, 'user_id', None))


class IdleNotices:
    """Decides, queues and sends the idle notices (module docstring).

    ``nova``: returns the compute client (``cloud_api.Nova``: ``server``,
    ``set_metadata``, ``delete_metadata``); called when first needed
    and again after a failure. ``notifier``: an ``owner_notice.
    Notifier`` of ``IdlePayload``. ``path``: the file of what was told
    (None: memory only).
    """

    def __init__(self, nova, notifier, path=None, clock=time.time,
                 capacity=QUEUE_CAPACITY):
        self._nova_factory = nova
        self._nova = None
        self.notifier = notifier
        self.path = path
        self.clock = clock
        self._lock = threading.Lock()
        self.told = self._load()
        self._pending = {}        # server -> when its notice was queued
        self.queue = send_queue.SendQueue(capacity,
                                          label='GPU idle notices')
        self.counts = dict.fromkeys((idle_mod.TELL, idle_mod.UPDATE,
                                     idle_mod.CLEAR, 'metadata_failed',
                                     'write_failed'), 0)

    def _load(self):
        if not self.path:
            return {}
        try:
            data = atomic_file.read_json(self.path)
        except atomic_file.Unreadable as e:
            raise ValueError('[gpu_exporter] idle_notice_file: %s (move it '
                             'aside to start again)' % e) from e
        if data is None:
            return {}
        told = data.get('told') if isinstance(data, dict) else None
        if not isinstance(told, dict) or data.get('version') != VERSION:
            raise ValueError('[gpu_exporter] idle_notice_file %s: not a '
                             'version %d file of told idle notices'
                             % (self.path, VERSION))
        return told

    # -- the listener's thread: decide and queue, never wait -------------

    def observe(self, entry):
        """Decide on one host report (a ``cloud.HostEntry``) and queue
        the notices; never raises, never waits on the cloud.
        """
        try:
            rows = collector.idle_devices({entry.name: entry})
            now = self.clock()
            with self._lock:
                found = idle_mod.notices(self.told, entry.name, rows)
                found = [n for n in found if now - self._pending.get(
                    n.server_id, -PENDING_TTL) >= PENDING_TTL]
                for n in found:
                    self._pending[n.server_id] = now
            for n in found:
                self.queue.submit(self, n.action, n)
        except Exception:
            LOG.exception('idle notices of host %s not decided',
                          getattr(entry, 'name', '?'))

    # -- the queue's thread: the cloud calls ------------------------------

    def info(self, ctxt, action, notice):
        """Carry out one notice (``send_queue`` calls it); raises when
        it failed (counted there; decided again at the next report).
        """
        try:
            self._carry_out(notice)
        except Exception:
            self._nova = None   # connect again next time
            raise
        finally:
            with self._lock:
                self._pending.pop(notice.server_id, None)

    def _client(self):
        if self._nova is None:
            self._nova = self._nova_factory()
        return self._nova

    def _carry_out(self, notice):
        nova = self._client()
        if notice.action == idle_mod.CLEAR:
            owner_notice.clear(nova, notice.server_id, METADATA_KEY)
        elif notice.action == idle_mod.UPDATE:
            owner_notice.set_key(nova, notice.server_id, METADATA_KEY,
                                 text_of(notice.devices))
        else:
            server = nova.server(notice.server_id)
            if server is None:
                return   # gone: nothing to tell, nothing kept
            error = owner_notice.tell(
                nova, self.notifier, notice.server_id, METADATA_KEY,
                text_of(notice.devices), payload_of(notice, server))
            if error is not None:
                self.counts['metadata_failed'] += 1
        LOG.info('Idle GPU notice (%s) for server %s on %s',
                 notice.action, notice.server_id, notice.host)
        with self._lock:
            self.counts[notice.action] += 1
            told = notice.told()
            if told is None:
                self.told.pop(notice.server_id, None)
            else:
                self.told[notice.server_id] = told
            data = {'version': VERSION, 'told': dict(self.told)}
        self._write(data)

    def _write(self, data):
        if not self.path:
            return
        try:
            atomic_file.write_json(self.path, data, mode=0o600)
        except OSError as e:
            # Kept in memory; after a restart an owner may be told again.
            self.counts['write_failed'] += 1
            LOG.error('idle notices not written to %s: %s', self.path, e)

    def stats(self):
        """The queue's counters plus what was done, for /metrics."""
        with self._lock:
            return dict(self.queue.stats(), **self.counts,
                        told=len(self.told))

    def stop(self, timeout=10.0):
        self.queue.stop(timeout)


def make(conf, transport):
    """The ``IdleNotices`` of ``[gpu_exporter]``, or None when off."""
    o = conf.gpu_exporter
    if not o.idle_notify:
        return None
    if not o.idle_notice_file:
        LOG.warning('[gpu_exporter] idle_notice_file is not set: what '
                    'owners were told of idle GPUs is kept in memory, and '
                    'a restarted exporter tells them again')
    notifier = owner_notice.Notifier(
        owner_notice.messaging_notifier(transport, PUBLISHER,
                                        o.report_topic),
        {IdlePayload: IDLE_EVENT})
    return IdleNotices(
        lambda: cloud_api.Nova(cloud_api.connect(
            o.cloud, timeout=o.idle_notice_timeout).compute),
        notifier, o.idle_notice_file)
