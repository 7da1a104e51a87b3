"""Serve a WSGI application on a port, in the background, eventlet or not.

nova-gpu serves small HTTP endpoints beside its real work: the agent's
metrics (``nova_gpu.agent.exporter``), nova-gpu-exporter's metrics and
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

A package-root module: adapters may import it (tests/unit/test_layering.py).
"""

import socket
import socketserver
import threading
from wsgiref import simple_server

# How long ``stop`` waits for the stdlib server's thread to end.
JOIN_TIMEOUT = 5


def eventlet_patched():
    """Whether eventlet has monkey patched this process's sockets."""
    try:
        from eventlet import patcher
    except ImportError:
        return False
    return patcher.is_monkey_patched('socket')


def _family(address):
    return socket.AF_INET6 if ':' in address else socket.AF_INET


class _ThreadingServer(socketserver.ThreadingMixIn, simple_server.WSGIServer):
    # A client that never finishes its request must not hold up the
    # process's exit.
    daemon_threads = True


class _QuietHandler(simple_server.WSGIRequestHandler):
    def log_message(self, *args):
        pass  # one line per scrape is noise


class WsgiServer:
    """Serves ``app`` on ``address:port`` (port 0: any free one) until
    ``stop()``; ``port`` is the port bound. ``name`` names the thread.
    """

    def __init__(self, app, address, port=0, name='nova-gpu-http'):
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
                debug=False))
            return

        class _Server(_ThreadingServer):
            address_family = _family(address)
        self._httpd = simple_server.make_server(
            address, port, app, server_class=_Server,
            handler_class=_QuietHandler)
        self.port = self._httpd.server_port
        self._thread = threading.Thread(target=self._httpd.serve_forever,
                                        name=name, daemon=True)
        self._thread.start()

    @property
    def green(self):
        """Whether eventlet's server serves (the process is patched)."""
        return self._green is not None

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
