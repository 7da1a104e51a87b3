"""The agent's host exporter against a real libvirtd and mdevctl.

Devices are made by the agent's device manager on the fake sysfs of
``nova_gpu.tests.functional.agent`` (no GPU here), domains are defined in a
real
libvirtd: the exporter must label each device with the instance (domain
UUID) whose domain references it, and mark the others unattached.
"""

import types
import urllib.request

from prometheus_client import parser

from nova_gpu.agent import device_events
from nova_gpu.agent import discovery
from nova_gpu.agent import host_metrics as exporter
from nova_gpu.core import catalog as catalog_mod
from nova_gpu.tests.functional.agent import test_mdev

CATALOG = catalog_mod.load_catalog()


class HostMetricsTest(test_mdev.MdevTestCase):

    def cycle(self):
        inv = discovery.Discovery(self.sysfs, host='cmp1',
                                  libvirt=self.lv).discover()
        return {'report': inv.report(generation=1), 'reconcile': None}

    def scrape(self, port):
        with urllib.request.urlopen('http://127.0.0.1:%d/metrics' % port,
                                    timeout=10) as r:
            text = r.read().decode()
        return [s for f in parser.text_string_to_metric_families(text)
                for s in f.samples]

    def test_devices_labelled_with_their_instances(self):
        used = self.manager.create_mdev(test_mdev.PARENT, 'nvidia-222')
        spare = self.manager.create_mdev(test_mdev.PARENT, 'nvidia-222')
        dom = self.define_domain('instance-00000001', mdevs=[used])
        agent = types.SimpleNamespace(
            host='cmp1', nvml=None, catalog=CATALOG, libvirt=self.lv,
            journal=self.manager.journal)
        server = exporter.MetricsServer(agent, '127.0.0.1', 0)
        self.addCleanup(server.stop)
        server.observe(self.cycle())
        samples = self.scrape(server.port)
        info = {s.labels['device']: s.labels for s in samples
                if s.name == 'nova_gpu_device_info'}
        self.assertEqual(dom.UUIDString(), info[used]['instance_uuid'])
        self.assertEqual('instance-00000001', info[used]['domain'])
        self.assertEqual('', info[spare]['instance_uuid'])
        attached = {s.labels['device']: s.value for s in samples
                    if s.name == 'nova_gpu_device_attached'}
        self.assertEqual({used: 1, spare: 0}, attached)
        modes = {s.labels['gpu']: s.labels['mode'] for s in samples
                 if s.name == 'nova_gpu_gpu_info'}
        self.assertEqual('vgpu', modes['0'])

    def test_device_change_notifications(self):
        sent = []
        events = device_events.DeviceEvents(
            None, 'cmp1', libvirt=self.lv,
            send=lambda t, p: sent.append(p))
        events.observe(self.cycle())
        uuid = self.manager.create_mdev(test_mdev.PARENT, 'nvidia-222')
        dom = self.define_domain('instance-00000002', mdevs=[uuid])
        payloads = events.observe(self.cycle())
        self.assertEqual([('create', uuid, 'T4-1Q', dom.UUIDString())],
                         [(p.action, p.device, p.profile, p.instance_uuid)
                          for p in payloads])
        self.assertTrue(events.flush(5))
        self.assertEqual(1, len(sent))
