"""Agent reports reach the scheduler's view through a real RabbitMQ."""

import socket
import time
import uuid

import fixtures
from oslo_config import cfg
from oslo_config import fixture as config_fixture
import oslo_messaging as messaging
import testtools

from nova_gpu.agent import publisher
from nova_gpu.core import catalog as catalog_mod
from nova_gpu.core import host as host_mod
from nova_gpu.core import report as report_mod
from nova_gpu.scheduler import listener
from nova_gpu.scheduler import view as view_mod

RABBIT = ('127.0.0.1', 5672)
URL = 'rabbit://guest:guest@%s:%d/' % RABBIT


def _rabbit_up():
    try:
        socket.create_connection(RABBIT, timeout=1).close()
        return True
    except OSError:
        return False


@testtools.skipUnless(_rabbit_up(), 'no RabbitMQ on %s:%d' % RABBIT)
class ReportListenerTest(testtools.TestCase):

    def setUp(self):
        super().setUp()
        conf = self.useFixture(config_fixture.Config(cfg.CONF)).conf
        self.topic = 'nova_gpu_reports_test_%s' % uuid.uuid4().hex[:8]
        conf.set_override('report_topic', self.topic, 'gpu_scheduler')
        self.view = view_mod.GpuView()
        transport = messaging.get_notification_transport(cfg.CONF, url=URL)
        self.addCleanup(transport.cleanup)
        self.server = listener.start(self.view, transport)
        self.addCleanup(self.server.wait)
        self.addCleanup(self.server.stop)

    def report(self, generation):
        model = catalog_mod.load_catalog().model('L4')
        host = host_mod.Host('rmq-host', [host_mod.Gpu(i, model)
                                          for i in range(2)])
        return report_mod.host_to_dict(host, generation=generation)

    def wait_for(self, generation):
        deadline = time.time() + 20
        while time.time() < deadline:
            entry = self.view.get('rmq-host')
            if entry is not None and entry.generation == generation:
                return entry
            time.sleep(0.1)
        self.fail('report %d never reached the view' % generation)

    def test_agent_publisher_to_scheduler_view(self):
        outbox = self.useFixture(fixtures.TempDir()).path
        pub = publisher.ReportPublisher(cfg.CONF, self.topic, outbox,
                                        url=URL)
        self.addCleanup(pub.close)
        self.assertEqual(0, pub.publish(self.report(1)))
        entry = self.wait_for(1)
        self.assertEqual(2, len(entry.host.gpus))
        # Newer reports replace the host; the listener keeps up.
        self.assertEqual(0, pub.publish(self.report(2)))
        self.wait_for(2)
