"""The agent's report send is bounded: a hung broker holds the send
thread, not the agent's cycle (issue 25, item 1).
"""

import threading
import time

import fixtures
from oslo_config import cfg
import testtools

from nova_gpu.agent import publisher

HANG = 5.0
TIMEOUT = 0.3


class HungBrokerTest(testtools.TestCase):

    def setUp(self):
        super().setUp()
        self.conf = cfg.ConfigOpts()
        self.conf([], project='nova-gpu-test')
        outbox = self.useFixture(fixtures.TempDir()).path
        self.release = threading.Event()
        self.entered = threading.Event()
        self.sent = []
        self.pub = publisher.ReportPublisher(
            self.conf, 'gpu_reports_test', outbox, url='fake:/')
        self.pub.send_timeout = TIMEOUT
        self.pub.transport._send_notification = self.send
        self.addCleanup(self.pub.close)
        self.addCleanup(self.release.set)

    def send(self, target, ctxt, message, version, retry=None):
        # A SIGSTOPped RabbitMQ node: the connection stays open and the
        # publish waits for a confirm that does not come.
        self.entered.set()
        if not self.release.wait(HANG):
            raise TimeoutError('the broker answered nothing')
        self.sent.append(message['payload']['generation'])

    def publish(self, generation):
        start = time.monotonic()
        pending = self.pub.publish({'generation': generation})
        return pending, time.monotonic() - start

    def test_cycle_waits_at_most_the_send_timeout(self):
        log = self.useFixture(fixtures.FakeLogger(name=publisher.__name__))
        pending, took = self.publish(1)
        self.assertEqual(1, pending)
        self.assertLess(took, TIMEOUT + 0.5)
        self.assertIn('the broker has not taken the GPU reports in 0.3 s; '
                      '1 kept in the outbox', log.output)
        # The next cycle: the stuck send is still the only one.
        pending, took = self.publish(2)
        self.assertEqual(2, pending)
        self.assertLess(took, TIMEOUT + 0.5)
        self.assertEqual(1, len([t for t in threading.enumerate()
                                 if t.name == 'nova-gpu-report-send']))
        # The broker answers: everything goes out, oldest first.
        self.release.set()
        self.assertEqual(0, self.publish(3)[0])
        self.assertEqual([1, 2, 3], self.sent)
        self.assertEqual([], self.pub.pending())

    def test_close_is_bounded(self):
        self.publish(1)
        self.pub.transport.cleanup = lambda: self.release.wait(HANG)
        start = time.monotonic()
        self.pub.close()
        self.assertLess(time.monotonic() - start, TIMEOUT + 0.5)
