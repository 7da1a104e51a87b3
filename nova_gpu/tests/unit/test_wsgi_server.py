"""nova_gpu.wsgi_server: one way to serve a WSGI app in the background."""

import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
from unittest import mock
import urllib.request

import testtools

from nova_gpu import tests
from nova_gpu import wsgi_server

ROOT = tests.REPO_ROOT


def app(environ, start_response):
    body = ('hello %s' % environ['PATH_INFO']).encode()
    start_response('200 OK', [('Content-Type', 'text/plain'),
                              ('Content-Length', str(len(body)))])
    return [body]


def get(port, path='/x', timeout=10):
    with urllib.request.urlopen('http://127.0.0.1:%d%s' % (port, path),
                                timeout=timeout) as r:
        return r.read().decode()


def answer(sock):
    """Everything the server sends on ``sock`` until it closes it."""
    sock.settimeout(5)
    data = b''
    while True:
        chunk = sock.recv(4096)
        if not chunk:
            return data
        data += chunk


def closed_after(sock, limit):
    """Seconds until the server closes ``sock`` (None: not in ``limit``)."""
    start = time.monotonic()
    sock.settimeout(limit)
    try:
        while sock.recv(4096):
            pass
    except socket.timeout:
        return None
    except ConnectionResetError:
        pass
    return time.monotonic() - start


class WsgiServerTest(testtools.TestCase):

    def test_stdlib_thread_without_eventlet(self):
        with mock.patch.object(wsgi_server, 'eventlet_patched',
                               return_value=False):
            server = wsgi_server.WsgiServer(app, '127.0.0.1', 0,
                                            name='probe-http')
        self.addCleanup(server.stop)
        self.assertFalse(server.green)
        self.assertIn('probe-http', [t.name for t in threading.enumerate()])
        self.assertEqual('hello /x', get(server.port))
        server.stop()
        server.stop()  # idempotent
        self.assertNotIn('probe-http',
                         [t.name for t in threading.enumerate()])
        self.assertRaises(OSError, socket.create_connection,
                          ('127.0.0.1', server.port), 2)

    def test_eventlet_server_where_eventlet_patched(self):
        spawned, options = [], []
        sock = mock.Mock()
        sock.getsockname.return_value = ('127.0.0.1', 4321)
        with mock.patch.object(wsgi_server, 'eventlet_patched',
                               return_value=True), \
                mock.patch('eventlet.listen', return_value=sock) as listen, \
                mock.patch('eventlet.spawn',
                           side_effect=lambda *a, **k: spawned.append(a)
                           or options.append(k) or mock.Mock()):
            server = wsgi_server.WsgiServer(app, '::1', 0)
        self.assertTrue(server.green)
        self.assertEqual(4321, server.port)
        self.assertEqual(socket.AF_INET6, listen.call_args[1]['family'])
        import eventlet.wsgi
        self.assertEqual((eventlet.wsgi.server, sock, app), spawned[0])
        # The same timeout and bound as the stdlib server's.
        self.assertEqual(wsgi_server.READ_TIMEOUT,
                         options[0]['socket_timeout'])
        self.assertEqual(wsgi_server.MAX_CONNECTIONS, options[0]['max_size'])
        server.stop()
        sock.close.assert_called_once_with()


class HostileClientsTest(testtools.TestCase):
    """Idle, HTTP/0.9, slowloris and flooding clients cannot stop the
    service behind a port (issue 25, item 5).
    """

    def serve(self, app=app, **kwargs):
        with mock.patch.object(wsgi_server, 'eventlet_patched',
                               return_value=False):
            server = wsgi_server.WsgiServer(app, '127.0.0.1', 0, **kwargs)
        self.addCleanup(server.stop)
        return server

    def connect(self, server):
        sock = socket.create_connection(('127.0.0.1', server.port), 5)
        self.addCleanup(sock.close)
        return sock

    def test_http09_request_line_closed_after_the_timeout(self):
        server = self.serve(read_timeout=1)
        sock = self.connect(server)
        sock.sendall(b'GET /\r\n')   # no headers, then nothing
        took = closed_after(sock, 5)
        self.assertIsNotNone(took, 'an HTTP/0.9 request line held on')
        self.assertLess(took, 1 + 2 * wsgi_server.POLL_INTERVAL + 0.5)
        self.assertEqual('hello /x', get(server.port))

    def test_slowloris_closed_after_the_timeout(self):
        server = self.serve(read_timeout=1)
        sock = self.connect(server)
        sock.sendall(b'GET /x HTTP/1.1\r\nHost: x\r\n')
        start = time.monotonic()
        closed = False
        # A header byte every 0.2 s: each read comes within the timeout,
        # the request never ends.
        while time.monotonic() - start < 5:
            try:
                sock.sendall(b'X')
            except OSError:
                closed = True
                break
            sock.settimeout(0.2)
            try:
                if sock.recv(1) == b'':
                    closed = True
                    break
            except socket.timeout:
                pass
        took = time.monotonic() - start
        self.assertTrue(closed, 'a slowloris client held on for 5 s')
        self.assertLess(took, 1 + 2 * wsgi_server.POLL_INTERVAL + 0.5)
        self.assertGreaterEqual(server.stats()['timed_out'], 1)

    def test_idle_flood_leaves_room_for_a_scrape(self):
        server = self.serve(max_connections=8, read_timeout=30)
        for _ in range(40):
            self.connect(server)
        start = time.monotonic()
        self.assertEqual('hello /x', get(server.port, timeout=2))
        self.assertLess(time.monotonic() - start, 2)
        stats = server.stats()
        # Served or waiting for their request: within the bound; beyond
        # it they waited in the lobby (no thread), the idle ones closed
        # after LOBBY_WAIT or when the lobby was full.
        self.assertLessEqual(stats['open'], 8)
        self.assertLessEqual(stats['lobby'], wsgi_server.LOBBY)
        self.assertGreaterEqual(stats['evicted'], 1)

    def test_connections_beyond_the_bound_closed_while_all_answered(self):
        release = threading.Event()
        self.addCleanup(release.set)
        entered = threading.Semaphore(0)

        def slow(environ, start_response):
            entered.release()
            release.wait(10)
            return app(environ, start_response)
        server = self.serve(app=slow, max_connections=2, read_timeout=10)
        busy = [self.connect(server) for _ in range(2)]
        for sock in busy:
            sock.sendall(b'GET /x HTTP/1.0\r\n\r\n')
        for _ in busy:
            self.assertTrue(entered.acquire(timeout=5))
        extra = self.connect(server)
        took = closed_after(extra, 2)
        self.assertIsNotNone(took, 'a connection beyond the bound held on')
        self.assertEqual(1, server.stats()['refused'])
        release.set()
        for sock in busy:
            self.assertIn(b'hello /x', answer(sock))


# A server in a process of its own with few descriptors, as the agent's
# metrics port under systemd's default limit: a flood of idle connections
# must leave it descriptors for its own work (the outbox, the provider
# config) and a scrape answered.
CHILD = textwrap.dedent('''
    import os, resource, sys, tempfile
    resource.setrlimit(resource.RLIMIT_NOFILE, (128, 128))
    from nova_gpu import wsgi_server

    def app(environ, start_response):
        try:
            # What an agent cycle does beside the port: files opened.
            held = [tempfile.TemporaryFile() for _ in range(20)]
            for f in held:
                f.close()
            body = b'files ok'
        except OSError as e:
            body = str(e).encode()
        start_response('200 OK', [('Content-Length', str(len(body)))])
        return [body]
    server = wsgi_server.WsgiServer(app, '127.0.0.1', 0)
    print(server.port, flush=True)
    sys.stdin.read()
''')


class DescriptorLimitTest(testtools.TestCase):

    def test_idle_flood_leaves_descriptors_and_a_scrape(self):
        child = subprocess.Popen([sys.executable, '-c', CHILD], cwd=ROOT,
                                 stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True)
        self.addCleanup(child.wait, 10)
        self.addCleanup(child.stdin.close)
        port = int(child.stdout.readline())
        flood = []
        self.addCleanup(lambda: [s.close() for s in flood])
        for _ in range(300):
            try:
                flood.append(socket.create_connection(('127.0.0.1', port),
                                                      2))
            except OSError:
                break
        time.sleep(0.5)  # the server accepts what the kernel holds
        start = time.monotonic()
        answer = get(port, '/files', timeout=3)
        self.assertEqual('files ok', answer)
        self.assertLess(time.monotonic() - start, 2)
        opened = len(os.listdir('/proc/%d/fd' % child.pid))
        self.assertLess(opened, 128 - 20)


class ReliabilityFigureTest(testtools.TestCase):
    """The reliability figure (``reliability_flood``), small: every
    target met but the cycle time's, which two cycles on a shared test
    machine cannot tell from noise (the part itself judges it).
    """

    def test_flood_part(self):
        from nova_gpu.bench import reliability_flood
        rows = reliability_flood.run(quick=True, flood=200, cycles=2,
                                     http09=False)
        self.assertEqual([], [r for r in rows if not r.ok
                              and 'cycle median' not in r.name])
