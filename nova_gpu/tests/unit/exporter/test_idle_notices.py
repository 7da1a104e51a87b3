"""Owners told of idle GPU devices by nova-gpu-exporter (idle_notify)."""

import json
import os
import threading
import types

import fixtures
from oslo_config import fixture as config_fixture
import prometheus_client
import testtools

from nova_gpu import conf as conf_mod
from nova_gpu.exporter import cloud
from nova_gpu.exporter import collector
from nova_gpu.exporter import idle_notices
from nova_gpu.exporter import service
from nova_gpu import owner_notice
from nova_gpu.tests.unit.exporter import test_cloud
from nova_gpu.tests.unit.exporter import test_idle

SERVER = test_idle.SERVER
KEY = idle_notices.METADATA_KEY


class FakeNova:
    """``cloud_api.Nova``'s server, set_metadata and delete_metadata."""

    def __init__(self):
        self.metadata = {SERVER: {}}
        self.calls = []
        self.fail = False
        self.gate = None   # an Event the calls wait for (a slow Nova)

    def _call(self, *what):
        if self.gate is not None:
            self.gate.wait(10)
        self.calls.append(what)
        if self.fail:
            raise RuntimeError('Nova is down')

    def server(self, server_id):
        self._call('server', server_id)
        if server_id not in self.metadata:
            return None
        return types.SimpleNamespace(project_id='p1', user_id='u1')

    def set_metadata(self, server_id, metadata):
        self._call('set', server_id)
        self.metadata[server_id].update(metadata)

    def delete_metadata(self, server_id, keys):
        self._call('delete', server_id)
        for key in keys:
            self.metadata.get(server_id, {}).pop(key, None)


class Sent:
    def __init__(self):
        self.sent = []

    def info(self, ctxt, event_type, payload):
        self.sent.append((event_type, payload))


def busy_report():
    report = test_idle.idle_report()
    del report['gpus'][0]['devices'][0]['idle']
    return report


class IdleNoticesTest(testtools.TestCase):

    def setUp(self):
        super().setUp()
        self.path = os.path.join(
            self.useFixture(fixtures.TempDir()).path, 'told.json')
        self.nova = FakeNova()
        self.sent = Sent()
        self.start()

    def start(self):
        self.notices = idle_notices.IdleNotices(
            lambda: self.nova, owner_notice.Notifier(
                self.sent, {idle_notices.IdlePayload:
                            idle_notices.IDLE_EVENT}), self.path)
        self.addCleanup(self.notices.stop)
        self.state = cloud.CloudState(test_cloud.CATALOG,
                                      clock=test_cloud.Clock())
        self.state.report_observers.append(self.notices.observe)

    def ingest(self, report):
        # each report a new one of the host (the same one resent is
        # ignored, core.report.replaces)
        self.generation = getattr(self, 'generation', 0) + 1
        report['generation'] = self.generation
        self.state.ingest_report(report)
        self.assertTrue(self.notices.queue.flush(10))

    def test_told_once_per_episode_and_cleared(self):
        self.ingest(test_idle.idle_report())
        text = self.nova.metadata[SERVER][KEY]
        self.assertIn('GPU idle since 1970-01-01T00:16:40Z', text)
        self.assertIn('A100-40GB A100-3-20C (fits 1g.5gb)', text)
        (event, payload), = self.sent.sent
        self.assertEqual('gpu.idle.notice', event)
        data = payload['nova_object.data']
        self.assertEqual('GpuIdlePayload', payload['nova_object.name'])
        self.assertEqual((SERVER, 'gpu-1', 'p1', 'u1'), (
            data['instance_uuid'], data['host'], data['project_id'],
            data['user_id']))
        self.assertEqual('1g.5gb', data['devices'][0]['suggestion'])
        # the same episode in the next reports: nothing more
        for _ in range(3):
            self.ingest(test_idle.idle_report())
        self.assertEqual(1, len(self.sent.sent))
        self.assertEqual(1, len([c for c in self.nova.calls
                                 if c[0] == 'set']))
        # busy again: the key goes, no notification
        self.ingest(busy_report())
        self.assertNotIn(KEY, self.nova.metadata[SERVER])
        self.assertEqual(1, len(self.sent.sent))
        self.assertEqual({'tell': 1, 'update': 0, 'clear': 1},
                         {k: self.notices.stats()[k]
                          for k in ('tell', 'update', 'clear')})

    def test_a_restart_tells_no_one_again(self):
        self.ingest(test_idle.idle_report())
        with open(self.path) as f:
            self.assertEqual({'d': 1}, {'d': len(json.load(f)['told'])})
        self.start()   # a new exporter, from the file
        self.ingest(test_idle.idle_report())
        self.assertEqual(1, len(self.sent.sent))
        # and still removes the key it set before the restart
        self.ingest(busy_report())
        self.assertNotIn(KEY, self.nova.metadata[SERVER])

    def test_a_server_gone_is_told_nothing(self):
        del self.nova.metadata[SERVER]
        self.ingest(test_idle.idle_report())
        self.assertEqual([], self.sent.sent)
        self.assertEqual({}, self.notices.told)

    def test_failures_counted_and_decided_again(self):
        self.nova.fail = True
        self.ingest(test_idle.idle_report())
        stats = self.notices.stats()
        self.assertEqual((1, 0), (stats['failed'], stats['tell']))
        self.assertEqual([], self.sent.sent)
        self.nova.fail = False
        self.ingest(test_idle.idle_report())
        self.assertEqual(1, len(self.sent.sent))
        self.assertIn(KEY, self.nova.metadata[SERVER])

    def test_ingest_never_waits_on_nova(self):
        self.nova.gate = threading.Event()
        self.addCleanup(self.nova.gate.set)
        for _ in range(5):
            # taken at once while the first notice waits on Nova; the
            # same server's notice is queued once
            report = test_idle.idle_report()
            report['generation'] = self.generation = getattr(
                self, 'generation', 0) + 1
            self.state.ingest_report(report)
        self.assertEqual(1, self.notices.stats()['queued'])
        self.nova.gate.set()
        self.assertTrue(self.notices.queue.flush(10))
        self.assertEqual(1, len(self.sent.sent))

    def test_metrics(self):
        self.ingest(test_idle.idle_report())
        registry = prometheus_client.CollectorRegistry()
        registry.register(collector.CloudCollector(
            self.state, idle_notices=self.notices))
        self.assertEqual(1, registry.get_sample_value(
            'nova_gpu_idle_notices_total', {'action': 'tell'}))
        self.assertEqual(0, registry.get_sample_value(
            'nova_gpu_idle_notices_failed_total', {'reason': 'failed'}))
        self.assertEqual(1, registry.get_sample_value(
            'nova_gpu_idle_notices_servers'))

    def test_an_unreadable_file_is_a_clear_error(self):
        with open(self.path, 'w') as f:
            f.write('{not json')
        err = self.assertRaises(ValueError, idle_notices.IdleNotices,
                                lambda: self.nova, None, self.path)
        self.assertIn('idle_notice_file: cannot read %s' % self.path,
                      str(err))


class WiringTest(testtools.TestCase):

    def setUp(self):
        super().setUp()
        self.conf = self.useFixture(config_fixture.Config(conf_mod.CONF)).conf
        self.conf.set_override('listen', '127.0.0.1:0', 'gpu_exporter')

    def exporter(self):
        return service.Exporter(self.conf, transport=object(),
                                catalog=test_cloud.CATALOG)

    def test_off_by_default_nothing_sent(self):
        self.assertFalse(self.conf.gpu_exporter.idle_notify)
        exporter = self.exporter()
        self.assertIsNone(exporter.idle_notices)
        self.assertEqual([exporter.usage.observe],
                         exporter.state.report_observers)

    def test_on(self):
        self.conf.set_override('idle_notify', True, 'gpu_exporter')
        self.useFixture(fixtures.MockPatch(
            'nova_gpu.owner_notice.messaging_notifier'))
        exporter = self.exporter()
        self.addCleanup(exporter.idle_notices.stop)
        self.assertIn(exporter.idle_notices.observe,
                      exporter.state.report_observers)
