"""The endpoint base the reclaimer's and the exporter's listeners share."""

import fixtures
from oslo_log import log as logging
import oslo_messaging as messaging
import testtools

from nova_gpu import listening


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
