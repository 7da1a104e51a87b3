"""Reliability: owners told of idle GPUs through restarts and outages.

Part ``idle`` of ``nova_gpu.bench.reliability``. Each round plays a
small cloud (4 hosts of 4 L4 GPUs, one L4-24C server per GPU) for
``STEPS`` agent cycles into nova-gpu-exporter's idle notices
(``exporter.idle_notices.IdleNotices``, ``[gpu_exporter] idle_notify``)
the way the exporter takes reports (``exporter.cloud.CloudState``, one
report per host per cycle), while

* servers become idle (the agent's verdict, a new ``since``) and busy
  again, migrate to a free GPU of another host (their idle run ends
  there), and are deleted and replaced;
* a host's reports are lost for a few cycles (agent or broker outage);
* Nova fails every call for a few cycles, or answers slowly;
* the exporter restarts, from its ``idle_notice_file``; half of the
  restarts are crashes that lose the notices still queued.

Nova is a fake with the calls the exporter makes (``server``,
``set_metadata``, ``delete_metadata``), keeping each server's metadata.
After the last step the cloud settles (Nova up, every host reporting),
and the part measures, against the episodes it played:

* episodes told more than once (a storm after a restart; target 0);
* servers idle at the end whose owner was not told, or whose key is
  missing (target 0);
* servers not idle at the end that still carry the key (target 0);
* the longest time the listener spends on the notices of one report
  while each Nova call takes ``SLOW_S`` (the exporter never waits on
  Nova; target under 50 ms).

In process, a few seconds.
"""

import os
import random
import shutil
import tempfile
import threading
import time

from nova_gpu.bench import reliability
from nova_gpu.core import catalog as catalog_mod
from nova_gpu.core import host as host_mod
from nova_gpu.core import report as report_mod
from nova_gpu.exporter import cloud
from nova_gpu.exporter import idle_notices
from nova_gpu import owner_notice

PART = 'idle'
ROUNDS, QUICK_ROUNDS = 10, 3
STEPS = 120
HOSTS, GPUS = 4, 4
PROFILE = 'L4-24C'
P_IDLE, P_BUSY, P_MOVE, P_DELETE = 0.05, 0.08, 0.01, 0.01
P_LOST, P_NOVA_DOWN, P_SLOW, P_RESTART = 0.03, 0.03, 0.05, 0.03
SLOW_S = 0.2
FLUSH_S = 10.0
SEED = 20261206
KEY = idle_notices.METADATA_KEY


class FakeNova:
    """The exporter's Nova calls over a dict of servers' metadata."""

    def __init__(self):
        self.metadata = {}        # live server -> metadata
        self.down = False
        self.slow = False
        self.lock = threading.Lock()

    def _call(self):
        if self.slow:
            time.sleep(SLOW_S)
        if self.down:
            raise ConnectionError('Nova is down')

    def server(self, server_id):
        self._call()
        with self.lock:
            if server_id not in self.metadata:
                return None
        return type('Server', (), {'project_id': 'p', 'user_id': 'u'})

    def set_metadata(self, server_id, metadata):
        self._call()
        with self.lock:
            if server_id not in self.metadata:
                raise LookupError('server %s not found' % server_id)
            self.metadata[server_id].update(metadata)

    def delete_metadata(self, server_id, keys):
        self._call()
        with self.lock:
            for key in keys:   # a key or server gone: done
                self.metadata.get(server_id, {}).pop(key, None)


class Sent:
    def __init__(self):
        self.episodes = {}        # (server, since) -> notifications

    def info(self, ctxt, event_type, payload):
        data = payload['nova_object.data']
        for dev in data['devices']:
            key = (data['instance_uuid'], dev['since'])
            self.episodes[key] = self.episodes.get(key, 0) + 1


class Cloud:
    """Servers on GPUs, their idle runs, and the hosts' reports."""

    def __init__(self, rng, catalog, nova):
        self.rng, self.nova = rng, nova
        self.model = catalog.model('L4')
        self.slots = {('h%d' % h, g): None for h in range(HOSTS)
                      for g in range(GPUS)}
        self.since = {}           # server -> idle since (None: busy)
        self.count = 0
        self.generation = 0
        for slot in self.slots:
            self._boot(slot)

    def _boot(self, slot):
        self.count += 1
        server = 'srv-%04d' % self.count
        self.slots[slot] = server
        self.since[server] = None
        with self.nova.lock:
            self.nova.metadata[server] = {}

    def step(self, now):
        rng = self.rng
        for slot, server in list(self.slots.items()):
            if server is None:
                continue
            draw = rng.random()
            if draw < P_DELETE:
                with self.nova.lock:
                    del self.nova.metadata[server]
                del self.since[server]
                self._boot(slot)
            elif draw < P_DELETE + P_MOVE:
                free = [s for s, v in self.slots.items()
                        if v is None and s[0] != slot[0]]
                if free:
                    self.slots[slot] = None
                    self.slots[rng.choice(free)] = server
                    self.since[server] = None   # a new window there
            elif self.since[server] is None and rng.random() < P_IDLE:
                self.since[server] = now
            elif self.since[server] is not None and rng.random() < P_BUSY:
                self.since[server] = None
        # keep a few GPUs free for migrations
        taken = [s for s, v in self.slots.items() if v is not None]
        if len(taken) == len(self.slots):
            slot = rng.choice(taken)
            with self.nova.lock:
                del self.nova.metadata[self.slots[slot]]
            del self.since[self.slots[slot]]
            self.slots[slot] = None

    def report(self, host, now):
        """The host's report, as its agent publishes it."""
        self.generation += 1
        gpus = [host_mod.Gpu(g, self.model, address='0000:%02x:00.0'
                             % (0x10 + g), vgpu_types=[PROFILE])
                for g in range(GPUS)]
        devices = {}
        for (h, g), server in self.slots.items():
            if h != host or server is None:
                continue
            dev = {'kind': host_mod.VGPU, 'detail': PROFILE,
                   'uuid': 'mdev-%s' % server, 'instance': server}
            since = self.since[server]
            if since is not None:
                dev['idle'] = {'since': since, 'seconds': now - since,
                               'peak_compute': 0.0, 'peak_memory_mib': 1.0,
                               'suggestion': 'L4-4C', 'samples': 30}
            devices[g] = [dev]
        return report_mod.host_to_dict(
            host_mod.Host(host, gpus), generation=self.generation,
            devices=devices)


def _notices(nova, sent, path):
    return idle_notices.IdleNotices(
        lambda: nova, owner_notice.Notifier(
            sent, {idle_notices.IdlePayload: idle_notices.IDLE_EVENT}),
        path)


def _round(rng, catalog, path):
    nova, sent = FakeNova(), Sent()
    world = Cloud(rng, catalog, nova)
    figures = dict(restarts=0, slowest_ms=0.0, episodes=set(), failed=0)
    live = {'notices': _notices(nova, sent, path)}

    def observe(entry):
        # What the exporter's listener thread spends on the notices (the
        # report's validation is the same with the option off).
        start = time.perf_counter()
        live['notices'].observe(entry)
        if nova.slow:
            figures['slowest_ms'] = max(
                figures['slowest_ms'], (time.perf_counter() - start) * 1000)
    state = cloud.CloudState(catalog)
    state.report_observers.append(observe)
    hosts = ['h%d' % h for h in range(HOSTS)]
    lost = {h: 0 for h in hosts}
    now = 1.7e9

    def ingest(host):
        report = world.report(host, now)
        for gpu in report['gpus']:
            for dev in gpu.get('devices') or ():
                if 'idle' in dev:
                    figures['episodes'].add((dev['instance'],
                                             dev['idle']['since']))
        state.ingest_report(report)

    for _step in range(STEPS):
        now += 60.0
        world.step(now)
        nova.down = rng.random() < P_NOVA_DOWN
        nova.slow = rng.random() < P_SLOW
        for host in hosts:
            if lost[host]:
                lost[host] -= 1
            elif rng.random() < P_LOST:
                lost[host] = rng.randint(1, 5)
            else:
                ingest(host)
        notices = live['notices']
        if rng.random() < P_RESTART:
            figures['restarts'] += 1
            if rng.random() < 0.5:   # a crash: what is queued is lost
                with notices.queue._lock:
                    notices.queue._queue.clear()
            notices.stop(FLUSH_S)
            figures['failed'] += notices.stats()['failed']
            live['notices'] = _notices(nova, sent, path)
        else:
            notices.queue.flush(FLUSH_S if not nova.slow else 0.0)
    # settle: Nova up and fast, every host reporting
    nova.down = nova.slow = False
    for _settle in range(3):
        now += 60.0
        for host in hosts:
            ingest(host)
            live['notices'].queue.flush(FLUSH_S)
    # (a failed notice is not pending: the settle reports decide it
    # again)
    notices = live['notices']
    notices.stop(FLUSH_S)
    idle_now = {s for s, since in world.since.items() if since is not None}
    told_twice = sum(1 for n in sent.episodes.values() if n > 1)
    untold = sum(1 for s in idle_now
                 if KEY not in nova.metadata.get(s, {})
                 or not any(k[0] == s and k[1] == world.since[s]
                            for k in sent.episodes))
    stale = sum(1 for s, meta in nova.metadata.items()
                if KEY in meta and s not in idle_now)
    figures['failed'] += notices.stats()['failed']
    return dict(figures, told_twice=told_twice, untold=untold, stale=stale,
                sent=sum(sent.episodes.values()))


def run(quick=False):
    catalog = catalog_mod.load_catalog()
    rng = random.Random(SEED)
    total = dict(restarts=0, slowest_ms=0.0, episodes=0, told_twice=0,
                 untold=0, stale=0, sent=0, failed=0)
    tmp = tempfile.mkdtemp(prefix='ngpu-idle-')
    try:
        for n in range(QUICK_ROUNDS if quick else ROUNDS):
            path = os.path.join(tmp, 'told-%d.json' % n)
            found = _round(rng, catalog, path)
            for key in total:
                if key == 'slowest_ms':
                    total[key] = max(total[key], found[key])
                elif key == 'episodes':
                    total[key] += len(found[key])
                else:
                    total[key] += found[key]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    fig = reliability.Figure
    return [
        fig(PART, 'idle episodes / notifications / exporter restarts',
            '%d / %d / %d' % (total['episodes'], total['sent'],
                              total['restarts']), '-', True),
        fig(PART, 'notices failed (Nova down), decided again',
            total['failed'], '-', True),
        fig(PART, 'episodes told more than once', total['told_twice'], '0',
            total['told_twice'] == 0),
        fig(PART, 'idle at the end, owner not told or key missing',
            total['untold'], '0', total['untold'] == 0),
        fig(PART, 'keys left on servers not idle', total['stale'], '0',
            total['stale'] == 0),
        fig(PART, 'longest decision per report, Nova slow (ms)',
            round(total['slowest_ms'], 1), '< 50',
            total['slowest_ms'] < 50),
    ]
