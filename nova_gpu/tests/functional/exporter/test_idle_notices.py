"""Owners of idle GPU servers told through a real Nova and RabbitMQ.

A server with an L4-12C vGPU boots in a real Nova. The host's report,
as the agent builds it (the harness's ``gpu_report``), is given the
agent's idle verdicts (``core.idle.annotate``: NVML's samples faked at
0% for the vGPU over ``IDLE_AFTER`` seconds, there is no GPU here) and
taken by nova-gpu-exporter as its listener takes it
(``CloudState.ingest_report``). With ``[gpu_exporter] idle_notify`` on,
the server's metadata in Nova's API gets ``nova_gpu_idle`` and a
``gpu.idle.notice`` arrives on the report topic over RabbitMQ, once for
the episode; a busy report removes the key, a new idle episode tells
again, and the server's deletion ends what was told. With the option off
nothing is set or sent.

The exporter's Nova client here is Nova's in-process API (the harness
has no Keystone endpoint openstacksdk could reach), as in the reclaimer's
test; the rest (options, decision, queue, notifier) is the service's.
"""

import time
import types
import uuid

from nova.tests.functional.api import client
from oslo_config import cfg

from nova_gpu.core import catalog as catalog_mod
from nova_gpu.core import idle
from nova_gpu.exporter import idle_notices
from nova_gpu.exporter import service
from nova_gpu import listening
from nova_gpu.tests.functional.agent import rabbit
from nova_gpu.tests.harness import cloud

CONF = cfg.CONF
IDLE_AFTER = 60.0
WAIT_S = 20


class HarnessNova:
    """``cloud_api.Nova``'s server, set_metadata and delete_metadata over
    the harness's admin API.
    """

    def __init__(self, api):
        self.api = api

    def server(self, server_id):
        try:
            s = self.api.get_server(server_id)
        except client.OpenStackApiNotFoundException:
            return None
        return types.SimpleNamespace(project_id=s.get('tenant_id'),
                                     user_id=s.get('user_id'))

    def set_metadata(self, server_id, metadata):
        self.api.post_server_metadata(server_id, metadata)

    def delete_metadata(self, server_id, keys):
        for key in keys:
            try:
                self.api.api_delete('/servers/%s/metadata/%s'
                                    % (server_id, key))
            except client.OpenStackApiNotFoundException:
                continue


class Received(listening.Endpoint):
    filter_rule = listening.event_filter((idle_notices.IDLE_EVENT,))

    def __init__(self):
        self.received = []

    def handle(self, event_type, payload):
        self.received.append((event_type, payload))


class IdleNoticesTest(cloud.GpuCloudTestCase):

    HOSTS = (cloud.GpuHost('l4', 'L4', 'L4-12C', gpus=1),)

    def setUp(self):
        super().setUp()
        self.catalog = catalog_mod.load_catalog()
        url = self.useFixture(rabbit.SharedOrPrivateRabbit()).url
        self.topic = 'nova_gpu_idle_test_%s' % uuid.uuid4().hex[:8]
        self.flags(report_topic=self.topic, group='gpu_exporter')
        self.flags(listen='127.0.0.1:0', group='gpu_exporter')
        self.transport = listening.transport(CONF, url=url)
        self.addCleanup(self.transport.cleanup)
        self.endpoint = Received()
        # the transport's control exchange, where the exporter sends
        self.listener = listening.Listener(
            None, [(self.topic, None)], [self.endpoint],
            pool='idle-test-%s' % self.topic, transport=self.transport)
        self.listener.start()
        self.addCleanup(self.listener.stop)
        self.tracker = idle.Tracker(idle_after=IDLE_AFTER)
        self.t = time.time() - 10 * IDLE_AFTER

    def exporter(self):
        exporter = service.Exporter(CONF, transport=self.transport,
                                    catalog=self.catalog)
        if exporter.idle_notices is not None:
            exporter.idle_notices._nova_factory = lambda: HarnessNova(
                self.admin_api)
            self.addCleanup(exporter.idle_notices.stop)
        return exporter

    def report(self, compute):
        """The host's report after one more agent pass at ``compute``."""
        report = self.gpu_report('l4')
        gpu = report['gpus'][0]
        vgpus = [{'mdev': d['uuid'], 'vm': d['instance'],
                  'compute': compute, 'memory_mib': 900.0}
                 for d in gpu['devices'] if d.get('uuid')]
        self.t += IDLE_AFTER / 2
        idle.annotate(report, {
            'gpus': {gpu['address']: {'compute': compute,
                                      'memory_mib': 900.0}},
            'vgpus': {gpu['address']: vgpus}},
            self.tracker, self.catalog, self.t)
        return report

    def metadata(self, server_id):
        return self.api.get_server(server_id)['metadata']

    def settle(self, exporter):
        if exporter.idle_notices is not None:
            self.assertTrue(exporter.idle_notices.queue.flush(WAIT_S))

    def wait_received(self, count):
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            if len(self.endpoint.received) >= count:
                return
            time.sleep(0.1)
        self.fail('%d gpu.idle.notice received, %d expected'
                  % (len(self.endpoint.received), count))

    def boot_gpu_server(self):
        flavor = self.create_gpu_flavor({'gpu:model': 'L4'})
        return self.boot(flavor)

    def test_owner_told_once_and_key_removed(self):
        self.flags(idle_notify=True, group='gpu_exporter')
        exporter = self.exporter()
        server = self.boot_gpu_server()
        for _ in range(4):   # 0% for IDLE_AFTER and more: idle
            entry = exporter.state.ingest_report(self.report(0.0))
            self.settle(exporter)
        (dev,) = [d for d in entry.raw['gpus'][0]['devices']
                  if d.get('instance') == server['id']]
        self.assertIn('idle', dev)
        text = self.metadata(server['id'])[idle_notices.METADATA_KEY]
        self.assertIn('GPU idle since', text)
        self.assertIn('L4 L4-12C', text)
        self.wait_received(1)
        (event, payload), = self.endpoint.received
        data = payload['nova_object.data']
        self.assertEqual(server['id'], data['instance_uuid'])
        self.assertEqual(server['tenant_id'], data['project_id'])
        self.assertEqual('l4', data['host'])
        # more idle reports of the same episode: nothing more is sent
        for _ in range(3):
            exporter.state.ingest_report(self.report(0.0))
            self.settle(exporter)
        time.sleep(1)
        self.assertEqual(1, len(self.endpoint.received))
        # busy again: the key goes
        exporter.state.ingest_report(self.report(0.9))
        self.settle(exporter)
        self.assertNotIn(idle_notices.METADATA_KEY,
                         self.metadata(server['id']))
        # idle again: a new episode, told again
        for _ in range(4):
            exporter.state.ingest_report(self.report(0.0))
            self.settle(exporter)
        self.wait_received(2)
        self.assertIn(idle_notices.METADATA_KEY, self.metadata(server['id']))
        # the server goes away: its report entry goes, and so does the
        # record of what its owner was told (Nova's 404 is no failure)
        self.api.delete_server(server['id'])
        self._wait_until_deleted(server)
        exporter.state.ingest_report(self.report(0.0))
        self.settle(exporter)
        stats = exporter.idle_notices.stats()
        self.assertEqual((2, 2, 0), (stats['tell'], stats['clear'],
                                     stats['failed']))
        self.assertEqual({}, exporter.idle_notices.told)

    def test_off_nothing_is_sent(self):
        exporter = self.exporter()
        self.assertIsNone(exporter.idle_notices)
        server = self.boot_gpu_server()
        for _ in range(5):
            entry = exporter.state.ingest_report(self.report(0.0))
        self.assertTrue(any('idle' in d for d in
                            entry.raw['gpus'][0]['devices']))
        time.sleep(2)
        self.assertEqual([], self.endpoint.received)
        self.assertNotIn(idle_notices.METADATA_KEY,
                         self.metadata(server['id']))
