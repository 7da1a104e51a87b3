"""Reports over a real RabbitMQ, through a broker restart."""

import os
import tempfile
import threading
import time

from oslo_config import cfg
import oslo_messaging
import testtools

from nova_gpu.agent import publisher
from nova_gpu.tests.functional.agent import rabbit


class Collector:
    def __init__(self):
        self.generations = []
        self.lock = threading.Lock()

    def info(self, ctxt, publisher_id, event_type, payload, metadata):
        with self.lock:
            self.generations.append(payload['generation'])
        return oslo_messaging.NotificationResult.HANDLED


class TestBrokerRestart(testtools.TestCase):

    def setUp(self):
        super().setUp()
        self.rabbit = self.useFixture(rabbit.PrivateRabbit())
        self.conf = cfg.ConfigOpts()
        self.conf([], project='nova-gpu-test')
        transport = oslo_messaging.get_notification_transport(
            self.conf, url=self.rabbit.url)
        # durable queues: what the broker took survives its restart
        self.conf.set_override('amqp_durable_queues', True,
                               group='oslo_messaging_rabbit')
        self.conf.set_override('rabbit_retry_interval', 1,
                               group='oslo_messaging_rabbit')
        self.collector = Collector()
        self.listener = oslo_messaging.get_notification_listener(
            transport, [oslo_messaging.Target(topic='gpu_reports_test')],
            [self.collector], executor='threading')
        self.listener.start()
        self.addCleanup(self.listener.wait)
        self.addCleanup(self.listener.stop)
        self.outbox = os.path.join(tempfile.mkdtemp(), 'outbox')
        self.pub = publisher.ReportPublisher(
            self.conf, 'gpu_reports_test', self.outbox, url=self.rabbit.url,
            retry=0)
        self.addCleanup(self.pub.close)

    def wait_for(self, expected, timeout=60):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.collector.lock:
                if set(expected) <= set(self.collector.generations):
                    return
            time.sleep(0.1)
        self.fail('reports missing after %ds: %s' % (
            timeout, sorted(set(expected) - set(
                self.collector.generations))))

    def test_no_report_lost_across_restart(self):
        for gen in range(1, 6):
            self.assertEqual(0, self.pub.publish({'generation': gen}))
        self.wait_for(range(1, 6))
        self.rabbit.stop_app()
        kept = [self.pub.publish({'generation': gen})
                for gen in range(6, 11)]
        self.assertEqual([1, 2, 3, 4, 5], kept)  # all kept while down
        self.assertEqual(5, len(self.pub.pending()))
        self.rabbit.start_app()
        deadline = time.monotonic() + 60
        while self.pub.flush() and time.monotonic() < deadline:
            time.sleep(0.5)
        self.assertEqual([], self.pub.pending())
        for gen in range(11, 14):
            self.pub.publish({'generation': gen})
        self.wait_for(range(1, 14))
        # sent in order, oldest first
        seen = [g for g in self.collector.generations if g >= 6]
        self.assertEqual(sorted(set(seen)), sorted(set(seen), key=seen.index))

    def test_outbox_bounded(self):
        self.rabbit.stop_app()
        self.pub.outbox_max = 3
        for gen in range(1, 6):
            self.pub.publish({'generation': gen})
        self.assertEqual(3, len(self.pub.pending()))
        self.assertTrue(self.pub.pending()[0].startswith('%020d' % 3))
        self.rabbit.start_app()
