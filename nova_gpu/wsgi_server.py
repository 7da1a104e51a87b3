"""Serve a WSGI application on a port, in the background, eventlet or not.

nova-gpu serves small HTTP endpoints beside its real work: the agent's
metrics (``nova_gpu.agent.host_metrics``), nova-gpu-exporter's metrics and
JSON API (``nova_gpu.exporter.api``) and the demo's APIs
(``nova_gpu.demo.serve``). They all run it the same way, here:

* in a process eventlet has monkey patched (one that also runs Nova's
  services: the functional tests, the demo), eventlet's own WSGI server in
  a green thread. A standard library server thread there would block in
  the selector the ``selectors`` module picked before eventlet patched it,
  and a blocked OS thread under eventlet stops every green thread of the
  process (the functional worker hung after the demo test that way);
* anywhere else (the agent, nova-gpu-exporter), the standard library's
  threaded WSGI server in a daemon thread.

A metrics port must never stop the service behind it: idle connections
used to hold a thread and a file descriptor each for ever, so about a
thousand of them took the agent's last descriptors (its cycle could no
longer write its outbox or provider config) and a single HTTP/0.9 request
line held a worker. So, in the stdlib server:

* every connection has ``read_timeout`` seconds to send its whole request
  (idle, HTTP/0.9 and slowloris clients are closed then), and each read or
  write on it as long;
* at most ``max_connections`` are served or waiting for their request,
  each with a thread; beyond that, a connection that has sent bytes takes
  the place of the oldest one that has sent none (closed at once), and
  one that has not waits, without a thread, in a lobby of ``LOBBY``
  connections for up to ``LOBBY_WAIT`` seconds: its first bytes let it
  in the same way; the lobby's oldest is closed when it is full. A client
  sends its request as soon as it connects, a flood does not: the flood
  cannot keep a scrape out, and the process holds at most
  ``max_connections + LOBBY`` descriptors for the port, well under any
  limit.

What was closed is counted (``WsgiServer.stats``) and logged at WARNING
at most once per ``WARN_INTERVAL``. eventlet's server gets the same
timeout and bound (its ``socket_timeout`` and ``max_size``: beyond the
bound, connections wait in the listen backlog, holding no descriptor of
the process).

A package-root module: adapters may import it
(nova_gpu/tests/unit/test_layering.py).
"""

import collections
import select
import socket
import socketserver
import sys
import threading
import time
from wsgiref import simple_server

from oslo_log import log as logging

LOG = logging.getLogger(__name__)
# How long ``stop`` waits for the stdlib server's thread to end.
JOIN_TIMEOUT = 5
# Seconds a client has to send its request, and for each read or write.
READ_TIMEOUT = 5
# Most connections open at a time (each holds a descriptor and a thread).
MAX_CONNECTIONS = 64
# Connections beyond max_connections that may wait for their first bytes,
# and for how long (s).
LOBBY = 32
LOBBY_WAIT = 1.0
# Connections the kernel holds before they are accepted: a burst of them
# is accepted and sorted out here, not left to SYN retries.
BACKLOG = 128
# How often (s) the stdlib server closes connections past their time and
# looks at the lobby, when no connection comes.
POLL_INTERVAL = 0.2
SCAN_INTERVAL = 0.05
# Least seconds between two WARNINGs about connections closed.
WARN_INTERVAL = 60


def eventlet_patched():
    """Whether eventlet has monkey patched this process's sockets.

    Asked of ``sys.modules``: a process that never imported eventlet was
    not patched, and asking must not import it (nova-gpu's services run
    without eventlet; Nova 34's native threading mode forbids importing
    it).
    """
    patcher = sys.modules.get('eventlet.patcher')
    return patcher is not None and patcher.is_monkey_patched('socket')


def _family(address):
    return socket.AF_INET6 if ':' in address else socket.AF_INET


class _ThreadingServer(socketserver.ThreadingMixIn, simple_server.WSGIServer):
    """The stdlib threaded WSGI server, bounded (see the module doc)."""

    # A client that never finishes its request must not hold up the
    # process's exit.
    daemon_threads = True
    request_queue_size = BACKLOG
    max_connections = MAX_CONNECTIONS
    read_timeout = READ_TIMEOUT

    def server_activate(self):
        super().server_activate()
        # Guards _open, touched by the handler threads too; the lobby is
        # the accepting thread's alone.
        self._lock = threading.Lock()
        # socket -> [accepted at (monotonic), whether its request is read]
        self._open = {}
        self._lobby = collections.OrderedDict()  # socket -> (address, at)
        self.counts = dict.fromkeys(
            ('accepted', 'refused', 'evicted', 'timed_out'), 0)
        self._warned_at = None
        self._scanned = 0.0

    # -- in the accepting thread (serve_forever) ----------------------------

    def process_request(self, request, client_address):
        if self._room() or (_peek(request) == _DATA and self._evict()):
            self._serve(request, client_address)
            return
        if len(self._lobby) >= LOBBY:
            oldest, _held = self._lobby.popitem(last=False)
            self._refuse(oldest)
        self._lobby[request] = (client_address, time.monotonic())

    def service_actions(self):
        # After each connection accepted and every POLL_INTERVAL, at most
        # every SCAN_INTERVAL (a flood must not make the accepting thread
        # poll every connection at each one it accepts): close the
        # connections that did not send their request in time (slowloris:
        # every read within the timeout, the request never complete),
        # let in those of the lobby that may come in.
        now = time.monotonic()
        if now - self._scanned < SCAN_INTERVAL:
            return
        self._scanned = now
        with self._lock:
            late = [sock for sock, (since, read) in self._open.items()
                    if not read and now - since > self.read_timeout]
            for sock in late:
                del self._open[sock]
            self.counts['timed_out'] += len(late)
        for sock in late:
            _abort(sock)
        for sock, (address, since) in list(self._lobby.items()):
            state = _peek(sock)
            if state == _CLOSED or (state == _NONE and
                                    now - since > LOBBY_WAIT):
                del self._lobby[sock]
                self._refuse(sock)
            elif self._room() or (state == _DATA and self._evict()):
                del self._lobby[sock]
                self._serve(sock, address)

    def _room(self):
        with self._lock:
            return len(self._open) < self.max_connections

    def _evict(self):
        """Close the oldest connection that has sent nothing; whether one
        was.
        """
        with self._lock:
            waiting = sorted((since, id(sock), sock) for sock, (since, read)
                             in self._open.items() if not read)
        for _since, _id, sock in waiting:
            if _peek(sock) != _NONE:
                continue  # its handler is about to read its request
            with self._lock:
                if self._open.pop(sock, None) is None:
                    continue
                self.counts['evicted'] += 1
            _abort(sock)
            self._warn()
            return True
        return False

    def _serve(self, request, client_address):
        with self._lock:
            self._open[request] = [time.monotonic(), False]
            self.counts['accepted'] += 1
        super().process_request(request, client_address)

    def _refuse(self, sock):
        with self._lock:
            self.counts['refused'] += 1
        self.shutdown_request(sock)
        self._warn()

    def server_close(self):
        super().server_close()
        for sock in list(self._lobby):
            self.shutdown_request(sock)
        self._lobby.clear()

    # -- in the handler threads --------------------------------------------

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self._lock:
                self._open.pop(request, None)

    def request_read(self, request):
        """``request``'s whole request is in: it is being answered."""
        with self._lock:
            held = self._open.get(request)
            if held is not None:
                held[1] = True

    def handle_error(self, request, client_address):
        # A client that timed out or went away: nothing to print (the
        # stdlib prints a traceback on stderr).
        LOG.debug('HTTP connection from %s closed', client_address,
                  exc_info=True)

    def stats(self):
        with self._lock:
            return dict(self.counts, open=len(self._open),
                        lobby=len(self._lobby),
                        max_connections=self.max_connections)

    def _warn(self):
        now = time.monotonic()
        if self._warned_at is not None and \
                now - self._warned_at < WARN_INTERVAL:
            return
        self._warned_at = now
        LOG.warning('HTTP port %(port)d: %(max_connections)d connections '
                    'open, the most allowed; since start %(refused)d '
                    'closed unserved beyond that bound, %(evicted)d idle '
                    'ones closed for a request, %(timed_out)d timed out '
                    'without a whole request',
                    dict(self.stats(), port=self.server_port))


# What a connection's receive buffer holds (``_peek``).
_DATA, _NONE, _CLOSED = 'data', 'none', 'closed'


def _peek(sock):
    """Whether ``sock`` has bytes to read, none yet, or its peer closed.

    Never waits: poll first (a socket with a timeout, as a handler's is,
    would wait that long in ``recv`` for bytes to come).
    """
    try:
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        if not poller.poll(0):
            return _NONE
        return _DATA if sock.recv(1, socket.MSG_PEEK) else _CLOSED
    except OSError:
        return _CLOSED


def _abort(sock):
    """End the connection: its handler's blocked read returns at once
    (``close`` alone would not wake it), and the handler closes it.
    """
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # already gone


class _QuietHandler(simple_server.WSGIRequestHandler):
    # Per read and write of the connection (StreamRequestHandler sets it
    # on the socket): a client that stops reading the answer times out.
    timeout = READ_TIMEOUT

    def setup(self):
        self.timeout = self.server.read_timeout
        super().setup()

    def parse_request(self):
        parsed = super().parse_request()
        if parsed:
            self.server.request_read(self.request)
        return parsed

    def log_message(self, *args):
        pass  # one line per scrape is noise


class WsgiServer:
    """Serves ``app`` on ``address:port`` (port 0: any free one) until
    ``stop()``; ``port`` is the port bound. ``name`` names the thread.

    ``read_timeout``: seconds a client has to send its request (and for
    each read or write); ``max_connections``: most open at a time (see
    the module doc).
    """

    def __init__(self, app, address, port=0, name='nova-gpu-http',
                 read_timeout=READ_TIMEOUT, max_connections=MAX_CONNECTIONS):
        self._green = None
        self._httpd = self._thread = None
        if eventlet_patched():
            # See the module doc: a stdlib server thread would block every
            # green thread here.
            import eventlet
            import eventlet.wsgi
            sock = eventlet.listen((address, port), family=_family(address))
            self.port = sock.getsockname()[1]
            self._green = (sock, eventlet.spawn(
                eventlet.wsgi.server, sock, app, log_output=False,
                debug=False, socket_timeout=read_timeout,
                max_size=max_connections))
            return

        class _Server(_ThreadingServer):
            address_family = _family(address)
        _Server.read_timeout = read_timeout
        _Server.max_connections = max_connections
        self._httpd = simple_server.make_server(
            address, port, app, server_class=_Server,
            handler_class=_QuietHandler)
        self.port = self._httpd.server_port
        self._thread = threading.Thread(target=self._httpd.serve_forever,
                                        args=(POLL_INTERVAL,), name=name,
                                        daemon=True)
        self._thread.start()

    @property
    def green(self):
        """Whether eventlet's server serves (the process is patched)."""
        return self._green is not None

    def stats(self):
        """The stdlib server's connection counters (accepted, refused,
        evicted, timed_out since start; open now; max_connections);
        None for eventlet's server, which keeps none.
        """
        httpd = self._httpd
        return httpd.stats() if httpd is not None else None

    def stop(self):
        """Stop serving and close the port (idempotent)."""
        if self._green is not None:
            sock, thread = self._green
            self._green = None
            thread.kill()
            sock.close()
            return
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        httpd.shutdown()
        httpd.server_close()
        self._thread.join(JOIN_TIMEOUT)
