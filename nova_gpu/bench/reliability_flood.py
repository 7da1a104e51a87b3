"""Reliability: the agent and its metrics port under a connection flood.

Part ``flood`` of ``nova_gpu.bench.reliability``. ``nova-gpu-agent``
runs in a process of its own with a descriptor limit of ``NOFILE``
(systemd's default soft limit is 1024; a lower one makes the same point
with fewer connections), on the agent's unit-test fakes (an HGX H100 board:
NVML at the ``pynvml`` boundary, sysfs as a directory tree, libvirt's
``test:///default`` driver), with its metrics port on, cycling: reconcile,
discover, write the provider config, publish the report through the
outbox (oslo.messaging's ``fake`` driver). Then a flooder holds ``FLOOD``
idle TCP connections to the metrics port, reopening each one the agent
closes, some of them sending an HTTP/0.9 request line and nothing more.
Measured, without and with the flood:

* agent cycles that failed or logged an error ("Too many open files"
  writing the outbox or the provider config): target 0;
* the median cycle time: unaffected (within ``NOISE`` of the one without
  the flood, plus ``SLACK_MS``);
* scrapes of ``/metrics`` answered, and the slowest: all, each within
  ``SCRAPE_BOUND`` s;
* the agent's open descriptors: under half its limit; connections the
  port closed to keep its bound (``WsgiServer.stats``): some;
* with the full part (not ``--quick``), how long an HTTP/0.9 request line
  alone holds a connection: at most the read timeout plus a second.

Runs in seconds; traffic only to 127.0.0.1.
"""

import json
import os
import selectors
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request

from nova_gpu.bench import reliability
from nova_gpu import wsgi_server

PART = 'flood'
NOFILE = 256
FLOOD = 1026
QUICK_FLOOD = 400
CYCLES = 10
QUICK_CYCLES = 4
NOISE = 1.5
SLACK_MS = 20.0
SCRAPE_BOUND = 2.0
# How long the flood lasts at least (s), scraped every 0.1 s.
SECONDS = 3.0
QUICK_SECONDS = 1.0
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


def _agent(work):
    """The agent of the child process, its metrics server and publisher."""
    from oslo_config import cfg

    from nova_gpu.agent import agent as agent_mod
    from nova_gpu.agent import host_metrics as exporter
    from nova_gpu.agent import privsep
    from nova_gpu.agent import publisher as publisher_mod
    import nova_gpu.conf  # noqa: F401 (registers the options)
    # The agent's unit-test fakes (run from the source tree, as the other
    # parts that fake hardware).
    from nova_gpu.tests.unit.agent import fakenvml
    from nova_gpu.tests.unit.agent import fakesys
    privsep.use_in_process()
    root = os.path.join(work, 'sys')
    fakenvml.hgx_h100_sysfs(fakesys.FakeSysfs(root))
    conf = cfg.CONF
    conf([], project='nova-gpu-bench')
    for name, value in (
            ('sysfs_root', root), ('state_dir', os.path.join(work, 'state')),
            ('use_nvml', True), ('libvirt_uri', 'test:///default'),
            ('provider_config_file', os.path.join(work, 'provider.yaml')),
            ('placement_cloud', None), ('metrics_listen', '127.0.0.1:0'),
            ('carve_enabled', False)):
        conf.set_override(name, value, 'gpu_agent')
    agent = agent_mod.Agent(conf, nvml_lib=_Answering(fakenvml.hgx_h100()))
    metrics = exporter.serve(conf, agent)
    publisher = publisher_mod.ReportPublisher(
        conf, 'gpu_reports_bench', os.path.join(work, 'outbox'),
        url='fake:/')
    return agent, metrics, publisher


class _Answering:
    """The fake NVML, answering "not supported" for what it lacks (the
    exporter's utilisation, power and temperature), as a GPU without
    those sensors does.
    """

    def __init__(self, lib):
        self._lib = lib

    def __getattr__(self, name):
        import pynvml
        try:
            return getattr(self._lib, name)
        except AttributeError:
            if not name.startswith('nvml'):
                return getattr(pynvml, name)

        def not_supported(*args):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        not_supported.__name__ = name
        return not_supported


class _Errors:
    """Counts ERROR records and those naming descriptor exhaustion."""

    def __init__(self):
        import logging
        self.count = 0
        handler = logging.Handler(level=logging.WARNING)
        handler.emit = self._emit
        logging.getLogger().addHandler(handler)

    def _emit(self, record):
        import logging
        if record.levelno >= logging.ERROR or \
                'Too many open files' in record.getMessage():
            self.count += 1


def _port_stats(metrics):
    """The metrics port's connection counters (``WsgiServer.stats``)."""
    stats = getattr(metrics._http, 'stats', None)
    return (stats() if stats else None) or {}


def child(work):
    """The agent's process: ``cycles N`` on stdin, one JSON line out."""
    import resource
    resource.setrlimit(resource.RLIMIT_NOFILE, (NOFILE, NOFILE))
    agent, metrics, publisher = _agent(work)
    errors = _Errors()
    print(json.dumps({'port': metrics.port}), flush=True)
    for line in sys.stdin:
        n = int(line.split()[1])
        times, failed = [], 0
        for _ in range(n):
            before = errors.count
            start = time.perf_counter()
            try:
                result = agent.cycle(publisher)
                metrics.observe(result)
                failed += bool(result['unsent_reports'])
            except Exception:
                failed += 1
            times.append((time.perf_counter() - start) * 1000)
            failed += errors.count > before
        print(json.dumps({'times': times, 'failed': failed,
                          'fds': len(os.listdir('/proc/self/fd')),
                          'stats': _port_stats(metrics)}), flush=True)


class Flooder:
    """Holds ``n`` idle connections to a port, reopening closed ones;
    every tenth sends an HTTP/0.9 request line and nothing more.
    """

    def __init__(self, port, n):
        self.port, self.n = port, n
        self.opened = 0
        self._stop = threading.Event()
        self._selector = selectors.DefaultSelector()
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name='bench-flooder')

    def start(self):
        self._thread.start()
        return self

    def _open(self):
        try:
            sock = socket.create_connection(('127.0.0.1', self.port), 2)
        except OSError:
            return False
        self.opened += 1
        if self.opened % 10 == 0:
            sock.sendall(b'GET /metrics\r\n')
        sock.setblocking(False)
        self._selector.register(sock, selectors.EVENT_READ)
        return True

    def _run(self):
        held = 0
        while not self._stop.is_set():
            while held < self.n and not self._stop.is_set():
                if not self._open():
                    break
                held += 1
            for key, _events in self._selector.select(0.05):
                try:
                    data = key.fileobj.recv(4096)
                except OSError:
                    data = b''
                if not data:    # closed by the agent: open another
                    self._selector.unregister(key.fileobj)
                    key.fileobj.close()
                    held -= 1

    def stop(self):
        self._stop.set()
        self._thread.join(5)
        for key in list(self._selector.get_map().values()):
            key.fileobj.close()
        self._selector.close()


def _scrape(port):
    start = time.perf_counter()
    try:
        with urllib.request.urlopen('http://127.0.0.1:%d/metrics' % port,
                                    timeout=SCRAPE_BOUND + 1) as r:
            ok = r.status == 200 and b'nova_gpu' in r.read()
    except OSError:
        ok = False
    return ok, time.perf_counter() - start


def _http09_held(port, limit):
    """Seconds an HTTP/0.9 request line alone holds its connection."""
    sock = socket.create_connection(('127.0.0.1', port), 2)
    with sock:
        sock.sendall(b'GET /metrics\r\n')
        start = time.monotonic()
        sock.settimeout(limit)
        try:
            while sock.recv(4096):
                pass
        except socket.timeout:
            return None
        except OSError:
            pass
        return time.monotonic() - start


class _Agent:
    """The agent's process, driven over its stdin and stdout."""

    def __init__(self, work):
        self.proc = subprocess.Popen(
            [sys.executable, '-c',
             'import sys; from nova_gpu.bench import reliability_flood as f;'
             ' f.child(sys.argv[1])', work],
            cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, text=True)
        self.port = json.loads(self.proc.stdout.readline())['port']

    def cycles(self, n):
        self.proc.stdin.write('cycles %d\n' % n)
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def close(self):
        self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _flooded(agent, n, cycles, seconds):
    """The agent's cycles, and scrapes for ``seconds`` at least, while
    ``n`` connections flood its metrics port.
    """
    flooder = Flooder(agent.port, n).start()
    try:
        deadline = time.monotonic() + 10
        while flooder.opened < n and time.monotonic() < deadline:
            time.sleep(0.05)
        scrapes, done = [], threading.Event()

        def scraping():
            while not done.is_set():
                scrapes.append(_scrape(agent.port))
                done.wait(0.1)
        start = time.monotonic()
        scraper = threading.Thread(target=scraping, daemon=True)
        scraper.start()
        result = agent.cycles(cycles)
        time.sleep(max(0.0, start + seconds - time.monotonic()))
        done.set()
        scraper.join(SCRAPE_BOUND + 2)
        return result, scrapes, flooder.opened
    finally:
        flooder.stop()


def run(quick=False, flood=None, cycles=None, http09=None):
    import tempfile
    n = flood or (QUICK_FLOOD if quick else FLOOD)
    n_cycles = cycles or (QUICK_CYCLES if quick else CYCLES)
    http09 = (not quick) if http09 is None else http09
    rows = []

    def figure(name, value, target, ok):
        rows.append(reliability.Figure(PART, name, value, target, ok))
    agent = _Agent(tempfile.mkdtemp(prefix='ngpu-flood-'))
    try:
        agent.cycles(1)  # warm: first discovery, first report
        calm = agent.cycles(n_cycles)
        calm_scrapes = [_scrape(agent.port) for _ in range(3)]
        flooded, scrapes, opened = _flooded(
            agent, n, n_cycles, QUICK_SECONDS if quick else SECONDS)
        held = (_http09_held(agent.port, wsgi_server.READ_TIMEOUT + 5)
                if http09 else None)
    finally:
        agent.close()
    figure('agent cycles failed, without / with a flood of %d connections'
           % n,
           '%d / %d' % (calm['failed'], flooded['failed']), '0 / 0',
           calm['failed'] == 0 and flooded['failed'] == 0)
    calm_ms = statistics.median(calm['times'])
    flood_ms = statistics.median(flooded['times'])
    bound = calm_ms * NOISE + SLACK_MS
    figure('agent cycle median, without / with the flood (ms)',
           '%.1f / %.1f' % (calm_ms, flood_ms), 'with < %.1f' % bound,
           flood_ms < bound)
    answered = [took for ok, took in scrapes if ok]
    slowest = max(answered) if answered else float('inf')
    figure('scrapes answered during the flood, slowest (s)',
           '%d of %d, %.2f' % (len(answered), len(scrapes), slowest),
           'all, < %g' % SCRAPE_BOUND,
           bool(scrapes) and len(answered) == len(scrapes) and
           slowest < SCRAPE_BOUND and all(ok for ok, _t in calm_scrapes))
    figure('agent descriptors open, without / with the flood (limit %d)'
           % NOFILE, '%d / %d' % (calm['fds'], flooded['fds']),
           '< %d' % (NOFILE // 2), flooded['fds'] < NOFILE // 2)
    stats = flooded['stats']
    closed = stats.get('evicted', 0) + stats.get('refused', 0)
    figure('flood connections opened / closed by the bound / timed out',
           '%d / %d / %d' % (opened, closed, stats.get('timed_out', 0)),
           'closed > 0', closed > 0)
    if http09:
        limit = wsgi_server.READ_TIMEOUT + 1
        figure('an HTTP/0.9 request line alone, held for (s)',
               'not closed' if held is None else '%.1f' % held,
               '<= %g' % limit, held is not None and held <= limit)
    return rows


if __name__ == '__main__':
    sys.exit(reliability.part_main(PART, run))
