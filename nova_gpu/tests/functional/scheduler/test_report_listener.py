"""Agent reports reach the scheduler's view through a real RabbitMQ."""

import logging
import threading
import time
import uuid

import fixtures
from nova import test as nova_test
from nova.tests.functional import fixtures as func_fixtures
from oslo_config import cfg
from oslo_config import fixture as config_fixture
import oslo_messaging as messaging
import testtools

from nova_gpu.agent import publisher
from nova_gpu.core import catalog as catalog_mod
from nova_gpu.core import host as host_mod
from nova_gpu.core import report as report_mod
from nova_gpu.scheduler import listener
from nova_gpu.scheduler import manager as scheduler_manager
from nova_gpu.scheduler import view as view_mod
from nova_gpu.tests.functional.agent import rabbit


def _amqp(broker):
    """The same broker's URL for kombu."""
    return 'amqp://guest:guest@%s:%d//' % (broker.host, broker.port)


class ReportListenerTest(testtools.TestCase):

    def setUp(self):
        super().setUp()
        self.broker = self.useFixture(rabbit.SharedOrPrivateRabbit())
        conf = self.useFixture(config_fixture.Config(cfg.CONF)).conf
        self.topic = 'nova_gpu_reports_test_%s' % uuid.uuid4().hex[:8]
        conf.set_override('report_topic', self.topic, 'gpu_scheduler')
        self.view = view_mod.GpuView()
        transport = messaging.get_notification_transport(
            cfg.CONF, url=self.broker.url)
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
                                        url=self.broker.url)
        self.addCleanup(pub.close)
        self.assertEqual(0, pub.publish(self.report(1)))
        entry = self.wait_for(1)
        self.assertEqual(2, len(entry.host.gpus))
        # Newer reports replace the host; the listener keeps up.
        self.assertEqual(0, pub.publish(self.report(2)))
        self.wait_for(2)
        # The topic's shared queue, where every report also lands, is
        # drained: it cannot grow on the broker.
        self.assertEqual(0, self.shared_queue_depth())

    def shared_queue_depth(self, timeout=10):
        import kombu
        name = '%s.info' % self.topic
        with kombu.Connection(_amqp(self.broker)) as conn:
            channel = conn.channel()
            self.addCleanup(_delete_queue, _amqp(self.broker), name)
            deadline = time.time() + timeout
            while True:
                _name, depth, _consumers = channel.queue_declare(
                    queue=name, passive=True)
                if depth == 0 or time.time() > deadline:
                    return depth
                time.sleep(0.2)


def _delete_queue(url, name):
    import kombu
    with kombu.Connection(url) as conn:
        conn.channel().queue_delete(queue=name)


class SchedulerServiceLifecycleTest(nova_test.TestCase):
    """Issue 10 item 8 / issue 9 item 6: the listener lives and dies with
    the nova-scheduler service (Nova's RPCPollerCleanupFixture, active in
    this base class, fails the test if a poller outlives it).
    """

    def setUp(self):
        super().setUp()
        self.useFixture(func_fixtures.PlacementFixture())
        self.topic = 'nova_gpu_reports_svc_%s' % uuid.uuid4().hex[:8]
        self.flags(available_filters=[
            'nova.scheduler.filters.all_filters',
            'nova_gpu.scheduler.filters.GpuFilter'],
            enabled_filters=['ComputeFilter', 'GpuFilter'],
            group='filter_scheduler')
        self.flags(report_listener=True, report_topic=self.topic,
                   group='gpu_scheduler')
        # Nova's own RPC and notifications stay on the fake bus the base
        # class set up; the GPU reports come over the real broker.
        self.broker = self.useFixture(rabbit.SharedOrPrivateRabbit())
        self.flags(transport_url=self.broker.url,
                   group='oslo_messaging_notifications')

    def report(self, generation):
        model = catalog_mod.load_catalog().model('L4')
        host = host_mod.Host('svc-host', [host_mod.Gpu(i, model)
                                          for i in range(2)])
        return report_mod.host_to_dict(host, generation=generation)

    def test_listener_started_and_stopped_with_the_service(self):
        # Threads other tests of this worker left running are not this
        # service's.
        before = set(threading.enumerate())
        service = self.start_service('scheduler',
                                     manager=scheduler_manager.MANAGER)
        found = listener.listener_of(service.manager)
        self.assertIsNotNone(found)
        self.assertTrue(found.running)
        # The listener feeds the view its scheduler service owns.
        self.view = view_mod.of_service(service.manager)
        self.assertIs(self.view, found.view)
        server = found._server.servers[0]
        self.assertTrue(server.listener._started)
        threads = set(threading.enumerate())

        outbox = self.useFixture(fixtures.TempDir()).path
        pub = publisher.ReportPublisher(cfg.CONF, self.topic, outbox,
                                        url=self.broker.url)
        try:
            self.assertEqual(0, pub.publish(self.report(1)))
        finally:
            pub.close()
        deadline = time.time() + 20
        while self.view.get('svc-host') is None and time.time() < deadline:
            time.sleep(0.1)
        self.assertIsNotNone(self.view.get('svc-host'), 'not ingested')
        self.assertIn('Thread-', ' '.join(
            t.name for t in threading.enumerate() if t not in threads))

        service.stop()
        self.assertFalse(found.running)
        self.assertFalse(server.listener._started)
        # The poller, its executor and the broker connection's heartbeat
        # threads are gone: nothing of the listener outlives the service.
        deadline = time.time() + 10
        while time.time() < deadline and self._messaging_threads(before):
            time.sleep(0.1)
        self.assertEqual([], self._messaging_threads(before))

    @staticmethod
    def _messaging_threads(before):
        return [t.name for t in threading.enumerate()
                if t not in before and t.is_alive() and (
                    t.name == 'Rabbit-heartbeat' or '_runner' in t.name)]

    def test_no_listener_without_the_option_or_the_plugin(self):
        self.flags(report_listener=False, group='gpu_scheduler')
        service = self.start_service('scheduler',
                                     manager=scheduler_manager.MANAGER)
        self.assertIsNone(listener.listener_of(service.manager))

    def test_plain_nova_scheduler_is_not_patched(self):
        # Nova's own manager: nothing of Nova changed, no listener; the
        # filter says once that it gets no GPU reports.
        from nova.scheduler import manager as nova_manager
        from nova_gpu.scheduler import filters
        service = self.start_service('scheduler')
        self.assertIs(nova_manager.SchedulerManager, type(service.manager))
        self.assertIsNone(listener.listener_of(service.manager))
        for name in scheduler_manager.NOVA_METHODS:
            method = getattr(nova_manager.SchedulerManager, name)
            self.assertFalse(method.__module__.startswith('nova_gpu'), name)
        log = self.useFixture(fixtures.FakeLogger(level=logging.WARNING))
        self.useFixture(fixtures.MonkeyPatch(
            'nova_gpu.scheduler.filters._WARNED_UNBOUND', []))
        gpu_filter = [f for f in service.manager.host_manager.enabled_filters
                      if isinstance(f, filters.GpuFilter)][0]
        self.assertIsNotNone(gpu_filter.view)
        self.assertIn('GpuFilter runs outside a started nova-gpu-scheduler',
                      log.output)
