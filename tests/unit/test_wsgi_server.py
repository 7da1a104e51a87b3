"""nova_gpu.wsgi_server: one way to serve a WSGI app in the background."""

import socket
import threading
from unittest import mock
import urllib.request

import testtools

from nova_gpu import wsgi_server


def app(environ, start_response):
    body = ('hello %s' % environ['PATH_INFO']).encode()
    start_response('200 OK', [('Content-Type', 'text/plain'),
                              ('Content-Length', str(len(body)))])
    return [body]


def get(port, path='/x'):
    with urllib.request.urlopen('http://127.0.0.1:%d%s' % (port, path),
                                timeout=10) as r:
        return r.read().decode()


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
        spawned = []
        sock = mock.Mock()
        sock.getsockname.return_value = ('127.0.0.1', 4321)
        with mock.patch.object(wsgi_server, 'eventlet_patched',
                               return_value=True), \
                mock.patch('eventlet.listen', return_value=sock) as listen, \
                mock.patch('eventlet.spawn',
                           side_effect=lambda *a, **k: spawned.append(a)
                           or mock.Mock()):
            server = wsgi_server.WsgiServer(app, '::1', 0)
        self.assertTrue(server.green)
        self.assertEqual(4321, server.port)
        self.assertEqual(socket.AF_INET6, listen.call_args[1]['family'])
        import eventlet.wsgi
        self.assertEqual((eventlet.wsgi.server, sock, app), spawned[0])
        server.stop()
        sock.close.assert_called_once_with()
