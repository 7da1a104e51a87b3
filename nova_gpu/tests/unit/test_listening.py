"""The listener factory every nova-gpu listener uses, and its endpoints."""

import ast
import os

import fixtures
from oslo_config import cfg
from oslo_log import log as logging
import oslo_messaging as messaging
import testtools

from nova_gpu import listening
from nova_gpu.tests.unit import test_layering


class Boom(listening.Endpoint):
    filter_rule = listening.event_filter(('a.b', 'c'))
    log = logging.getLogger('test.boom')

    def __init__(self):
        self.seen = []

    def handle(self, event_type, payload):
        if payload == 'bad':
            raise ValueError('bad payload')
        self.seen.append((event_type, payload))


class EndpointTest(testtools.TestCase):

    def test_never_raises_and_names_the_publisher(self):
        log = self.useFixture(fixtures.FakeLogger(name='test.boom'))
        endpoint = Boom()
        handled = messaging.NotificationResult.HANDLED
        self.assertEqual(handled, endpoint.info({}, 'p', 'a.b', 'ok', {}))
        self.assertEqual(handled, endpoint.info({}, 'x' * 300, 'c', 'bad',
                                                {}))
        self.assertEqual([('a.b', 'ok')], endpoint.seen)
        self.assertIn('Dropping c from ' + 'x' * 97 + '...: bad payload',
                      log.output)

    def test_filter_is_exact(self):
        rule = Boom.filter_rule
        self.assertTrue(rule.match({}, 'p', 'a.b', {}, {}))
        self.assertTrue(rule.match({}, 'p', 'c', {}, {}))
        for other in ('aXb', 'a.b.c', 'xc', 'c.d'):
            self.assertFalse(rule.match({}, 'p', other, {}, {}), other)

    def test_shown(self):
        self.assertEqual('abc', listening.shown('abc'))
        self.assertEqual("{'a': 1}", listening.shown({'a': 1}))
        self.assertEqual(100, len(listening.shown('y' * 500)))


# oslo.messaging calls only nova_gpu.listening makes.
_FACTORY_ONLY = ('get_notification_listener', 'get_notification_transport')


def _direct_calls(name, path):
    """``module.function`` calls of ``_FACTORY_ONLY`` in one module."""
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in _FACTORY_ONLY:
            yield '%s:%d %s' % (name, node.lineno, node.attr)
        elif isinstance(node, ast.ImportFrom) and any(
                a.name in _FACTORY_ONLY for a in node.names):
            yield '%s:%d imports %s' % (name, node.lineno, ', '.join(
                a.name for a in node.names))


def factory_bypasses(found_modules=None):
    """Every listener or transport made outside ``nova_gpu.listening``
    (tests excepted: they may build one to test it).
    """
    return sorted(
        call for name, path in found_modules or test_layering.modules()
        if name != 'nova_gpu.listening'
        and not name.startswith('nova_gpu.tests.')
        for call in _direct_calls(name, path))


class FactoryTest(testtools.TestCase):

    def test_every_listener_comes_from_the_factory(self):
        self.assertEqual([], factory_bypasses())

    def test_a_bypass_is_found(self):
        tmp = self.useFixture(fixtures.TempDir()).path
        path = os.path.join(tmp, 'probe.py')
        with open(path, 'w') as f:
            f.write('import oslo_messaging as m\n'
                    'from oslo_messaging import get_notification_listener\n'
                    'def lazy(conf):\n'
                    '    return m.get_notification_transport(conf)\n')
        self.assertEqual([
            'nova_gpu.exporter.probe:2 imports get_notification_listener',
            'nova_gpu.exporter.probe:4 get_notification_transport'],
            factory_bypasses([('nova_gpu.exporter.probe', path),
                              ('nova_gpu.tests.unit.probe', path)]))


class _Raising:
    filter_rule = listening.event_filter(('a.b',))

    def __init__(self):
        self.seen = []

    def info(self, ctxt, publisher_id, event_type, payload, metadata):
        if payload == 'bad':
            raise ValueError('bad payload')
        self.seen.append(payload)
        return messaging.NotificationResult.REQUEUE


class ListenerTest(testtools.TestCase):

    def setUp(self):
        super().setUp()
        self.conf = cfg.ConfigOpts()
        self.conf([])
        self.transport = messaging.get_notification_transport(
            self.conf, url='fake:/')
        self.addCleanup(self.transport.cleanup)

    def test_guarded_endpoint_never_raises(self):
        log = self.useFixture(fixtures.FakeLogger(name='test.guard'))
        inner = _Raising()
        endpoint = listening.guarded(inner, logging.getLogger('test.guard'))
        self.assertIs(inner.filter_rule, endpoint.filter_rule)
        self.assertFalse(hasattr(endpoint, 'error'))
        handled = messaging.NotificationResult.HANDLED
        self.assertEqual(handled, endpoint.info({}, 'p', 'a.b', 'bad', {}))
        self.assertIn('Dropping a.b from p: bad payload', log.output)
        # What the endpoint answers otherwise is kept.
        self.assertEqual(messaging.NotificationResult.REQUEUE,
                         endpoint.info({}, 'p', 'a.b', 'ok', {}))
        self.assertEqual(['ok'], inner.seen)

    def test_start_stop_once_with_a_pool_and_a_drain(self):
        listener = listening.Listener(
            self.conf, [('t1', None), ('t2', 'ex')], [_Raising()],
            pool='p1', drain=True, transport=self.transport)
        self.assertFalse(listener.running)
        self.assertIs(listener, listener.start())
        servers = list(listener.servers)
        self.assertEqual(2, len(servers))
        self.assertIs(listener, listener.start())
        self.assertEqual(servers, listener.servers)
        self.assertEqual(['t1', 't2'], [t.topic for t in listener.targets])
        self.assertEqual([None, 'ex'],
                         [t.exchange for t in listener.targets])
        self.assertEqual('threading', servers[0].executor_type)
        listener.stop()
        listener.wait()
        self.assertFalse(listener.running)

    def test_owns_only_the_transport_it_made(self):
        made = []
        real = listening.transport

        def transport(conf, url=None):
            made.append(real(conf, url='fake:/'))
            return made[-1]
        self.useFixture(fixtures.MockPatchObject(listening, 'transport',
                                                 transport))
        listener = listening.Listener(self.conf, [('t', None)], []).start()
        self.assertEqual(1, len(made))
        cleanup = self.useFixture(fixtures.MockPatchObject(
            made[0], 'cleanup')).mock
        listener.stop()
        cleanup.assert_called_once_with()
        given = listening.Listener(self.conf, [('t', None)], [],
                                   transport=self.transport).start()
        self.useFixture(fixtures.MockPatchObject(
            self.transport, 'cleanup'))
        given.stop()
        self.transport.cleanup.assert_not_called()
