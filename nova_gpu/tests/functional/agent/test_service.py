"""nova-gpu-agent run as a command with an oslo.config file."""

import os
import threading
import uuid as uuid_mod

from oslo_config import cfg
import oslo_messaging
import yaml

from nova_gpu.tests.functional.agent import rabbit
from nova_gpu.tests.functional.agent import test_mdev
from nova_gpu.tests.harness import agent_process


class Reports:
    def __init__(self):
        self.got = []
        self.event = threading.Event()

    def info(self, ctxt, publisher_id, event_type, payload, metadata):
        self.got.append((publisher_id, event_type, payload))
        self.event.set()


class TestService(test_mdev.MdevTestCase):

    def test_one_cycle(self):
        url = self.useFixture(rabbit.SharedOrPrivateRabbit()).url
        topic = 'ngpu_test_%s' % uuid_mod.uuid4().hex[:8]
        conf = cfg.ConfigOpts()
        conf([], project='nova-gpu-test')
        transport = oslo_messaging.get_notification_transport(conf, url=url)
        reports = Reports()
        listener = oslo_messaging.get_notification_listener(
            # what nova-scheduler listens on: Nova's exchange
            transport, [oslo_messaging.Target(topic=topic, exchange='nova')],
            [reports],
            executor='threading')
        listener.start()
        self.addCleanup(listener.wait)
        self.addCleanup(listener.stop)

        used = self.manager.create_mdev(test_mdev.PARENT, 'nvidia-222')
        orphan = self.manager.create_mdev(test_mdev.PARENT, 'nvidia-222')
        domain = self.define_domain('vm', mdevs=[used])
        path = agent_process.write_config(
            os.path.join(self.host.dir, 'nova-gpu.conf'), url, topic,
            self.host.dir, self.fs.root, host='cmp1',
            libvirt_uri=self.host.uri)
        proc = agent_process.run_once(path)
        self.assertEqual(0, proc.returncode, proc.stderr)
        self.assertEqual([used], self.fs.mdevs())  # orphan removed
        self.assertNotIn(orphan, self.lv.mdevs())
        self.assertTrue(reports.event.wait(30), 'no report received')
        publisher_id, event_type, payload = reports.got[0]
        self.assertEqual('nova-gpu-agent.cmp1', publisher_id)
        self.assertEqual('gpu.host.report', event_type)
        self.assertEqual('cmp1', payload['host'])
        # The guest holding it: its domain (a Nova instance's UUID).
        self.assertEqual([{'kind': 'vgpu', 'detail': 'T4-1Q',
                           'uuid': used, 'instance': domain.UUIDString()}],
                         payload['gpus'][0]['devices'])
        with open(os.path.join(self.host.dir, 'provider_config',
                               'nova-gpu.yaml')) as f:
            doc = yaml.safe_load(f)
        self.assertEqual('1.0', doc['meta']['schema_version'])
        self.assertEqual(
            {'identification': {'name': 'cmp1_pci_0000_3b_00_0'},
             # topology, and the set traits of GPU 0 of 2 (core.gpu_sets)
             'traits': {'additional': ['CUSTOM_GPU_MODEL_T4',
                                       'CUSTOM_GPU_NUMA_0',
                                       'CUSTOM_NOVA_GPU_SET2_0']}},
            doc['providers'][0])
