"""The agent's host exporter: series from a cycle's report plus NVML."""

import threading
import time
import types
import urllib.request

import prometheus_client
from prometheus_client import parser
import pynvml
import testtools

from nova_gpu.agent import device_events
from nova_gpu.agent import host_metrics as exporter
from nova_gpu.agent import nvml as nvml_mod
from nova_gpu.core import catalog as catalog_mod
from nova_gpu.core import host as host_mod
from nova_gpu.core import notification
from nova_gpu.core import report as report_mod
from nova_gpu.tests.unit.agent import fakenvml

CATALOG = catalog_mod.load_catalog()
VM_UUID = '6b1e0d0c-7c43-4d43-9d2b-4c2a1b9f0a11'
MDEV = 'c0ffee00-0000-4000-8000-000000000001'


class TelemetryNvml(fakenvml.FakePynvml):
    """fakenvml plus the telemetry calls (no GPU here to read them from)."""

    def nvmlDeviceGetUtilizationRates(self, dev):
        return types.SimpleNamespace(gpu=dev.util, memory=10)

    def nvmlDeviceGetMemoryInfo(self, dev):
        return types.SimpleNamespace(total=dev.memory_mib * 2 ** 20,
                                     used=dev.memory_mib * 2 ** 19)

    def nvmlDeviceGetPowerUsage(self, dev):
        return 215500  # milliwatts

    def nvmlDeviceGetTemperature(self, dev, sensor):
        if getattr(dev, 'no_temp', False):
            raise pynvml.NVMLError_NotSupported()
        return 61

    def nvmlDeviceGetVgpuUtilization(self, dev, timestamp):
        return [types.SimpleNamespace(vgpuInstance=v,
                                      smUtil=types.SimpleNamespace(uiVal=40))
                for v in sorted(dev.vgpus)]

    def nvmlVgpuInstanceGetVmID(self, vgpu):
        return (VM_UUID.upper().encode(), pynvml.NVML_VGPU_VM_ID_UUID)

    def nvmlVgpuInstanceGetMdevUUID(self, vgpu):
        return MDEV.encode()

    def nvmlVgpuInstanceGetFbUsage(self, vgpu):
        return 5 * 2 ** 30


def _lib():
    a100 = fakenvml.FakeGpu('00000000:07:00.0', 'NVIDIA A100-SXM4-40GB',
                            40960, mig=True)
    l4 = fakenvml.FakeGpu('00000000:3B:00.0', 'NVIDIA L4', 23034)
    a100.util, l4.util = 87, 5
    l4.no_temp = True
    lib = TelemetryNvml([a100, l4])
    lib.start_vgpu_on(a100, 1)
    return lib


def _report():
    a100, l4 = CATALOG.model('A100-40GB'), CATALOG.model('L4')
    host = host_mod.Host('gpu-1', [
        host_mod.Gpu(0, a100, address='0000:07:00.0', mig_enabled=True),
        host_mod.Gpu(1, l4, address='0000:3b:00.0')])
    providers = {
        0: [report_mod.provider_dict('gpu-1_pci_0000_07_00_4',
                                     report_mod.VF_MDEV, '0000:07:00.4',
                                     vgpu_type='A100-3-20C')],
        1: [report_mod.provider_dict('gpu-1_0000:3B:00.0',
                                     report_mod.PCI_DEVICE, '0000:3b:00.0',
                                     resource_class='CUSTOM_PCI_10DE_27B8')]}
    devices = {0: [{'kind': 'mig', 'detail': ['3g.20gb', 0, 'A100-3-20C'],
                    'uuid': MDEV},
                   {'kind': 'mig', 'detail': ['2g.10gb', 4, None]}]}
    return report_mod.host_to_dict(host, generation=7, providers=providers,
                                   devices=devices)


def _cycle(reconcile=None, unsent=0):
    return {'report': _report(), 'reconcile': reconcile,
            'unsent_reports': unsent}


class HostCollectorTest(testtools.TestCase):

    def setUp(self):
        super().setUp()
        self.nvml = nvml_mod.Nvml(lib=_lib())
        self.collector = exporter.HostCollector('gpu-1', self.nvml, CATALOG,
                                                clock=lambda: 1700000000.0)
        self.registry = prometheus_client.CollectorRegistry()
        self.registry.register(self.collector)

    def value(self, name, **labels):
        return self.registry.get_sample_value(name, labels)

    def test_health_before_any_cycle(self):
        self.assertEqual(0, self.value('nova_gpu_agent_cycles_total',
                                       host='gpu-1'))
        self.assertIsNone(self.value(
            'nova_gpu_agent_last_cycle_timestamp_seconds', host='gpu-1'))
        self.assertIsNone(self.value('nova_gpu_gpu_free_ratio', host='gpu-1',
                                     gpu='0', address='0000:07:00.0',
                                     model='A100-40GB'))
        self.assertEqual(1, self.value('nova_gpu_agent_nvml_available',
                                       host='gpu-1'))

    def test_gpus_modes_and_free_capacity(self):
        self.collector.observe(_cycle())
        a100 = dict(host='gpu-1', gpu='0', address='0000:07:00.0',
                    model='A100-40GB')
        l4 = dict(host='gpu-1', gpu='1', address='0000:3b:00.0', model='L4')
        self.assertEqual(1, self.value(
            'nova_gpu_gpu_info', mode='mig', vgpu_types='A100-3-20C',
            mig_layout='3g.20gb@0,2g.10gb@4', **a100))
        self.assertEqual(1, self.value('nova_gpu_gpu_info',
                                       mode='passthrough', vgpu_types='',
                                       mig_layout='', **l4))
        # 3g.20gb (4 slices) + 2g.10gb (2 slices) of 8 memory slices
        self.assertEqual(0.25, self.value('nova_gpu_gpu_free_ratio', **a100))
        self.assertEqual(1.0, self.value('nova_gpu_gpu_free_ratio', **l4))

    def test_an_idle_mdev_is_still_a_device(self):
        # Not in use (the report's idle_mdevs), but there: shown, with no
        # instance attached.
        raw = {'devices': [], 'idle_mdevs': [
            {'uuid': MDEV, 'detail': 'A100-10C'}]}
        gpu = host_mod.Gpu(0, CATALOG.model('A100-40GB'),
                           address='0000:07:00.0')
        self.assertEqual([(exporter.VGPU, MDEV, 'A100-10C')],
                         list(exporter._devices(raw, gpu, [])))

    def test_nvml_readings_in_base_units(self):
        self.collector.observe(_cycle())
        a100 = dict(host='gpu-1', gpu='0', address='0000:07:00.0',
                    model='A100-40GB')
        l4 = dict(host='gpu-1', gpu='1', address='0000:3b:00.0', model='L4')
        self.assertEqual(0.87, self.value('nova_gpu_gpu_utilization_ratio',
                                          **a100))
        self.assertEqual(40960 * 2 ** 20, self.value(
            'nova_gpu_gpu_memory_total_bytes', **a100))
        self.assertEqual(40960 * 2 ** 19, self.value(
            'nova_gpu_gpu_memory_used_bytes', **a100))
        self.assertEqual(215.5, self.value('nova_gpu_gpu_power_watts',
                                           **a100))
        self.assertEqual(61, self.value('nova_gpu_gpu_temperature_celsius',
                                        **a100))
        # NVML could not read it: absent, not zero
        self.assertIsNone(self.value('nova_gpu_gpu_temperature_celsius',
                                     **l4))
        vgpu = dict(host='gpu-1', gpu='0', vgpu='1', device=MDEV,
                    instance_uuid=VM_UUID)
        self.assertEqual(0.4, self.value('nova_gpu_vgpu_utilization_ratio',
                                         **vgpu))
        self.assertEqual(5 * 2 ** 30, self.value(
            'nova_gpu_vgpu_memory_used_bytes', **vgpu))

    def test_gpu_label_is_the_reports_index(self):
        # The A100 (NVML's GPU 0) is left out of the report: the L4 is the
        # report's GPU 0 and every series labels it so.
        report = _report()
        del report['gpus'][0]
        report['gpus'][0]['index'] = 0
        self.collector.observe({'report': report, 'reconcile': None})
        l4 = dict(host='gpu-1', gpu='0', address='0000:3b:00.0', model='L4')
        self.assertEqual(1, self.value('nova_gpu_gpu_free_ratio', **l4))
        self.assertEqual(215.5, self.value('nova_gpu_gpu_power_watts', **l4))

    def test_devices_labelled_with_their_instance(self):
        self.collector.observe(_cycle(), instances={
            MDEV: ('instance-00000001', VM_UUID)})
        self.assertEqual(1, self.value(
            'nova_gpu_device_info', host='gpu-1', gpu='0', kind='mig',
            device='0000:07:00.0/mig@0', profile='A100-3-20C',
            instance_uuid='', domain=''))
        # the passthrough L4 is referenced by no domain: not attached
        self.assertEqual(0, self.value(
            'nova_gpu_device_attached', host='gpu-1', gpu='1',
            kind='passthrough', device='0000:3b:00.0'))
        self.collector.observe(_cycle(), instances={
            '0000:3b:00.0': ('instance-00000002', VM_UUID)})
        self.assertEqual(1, self.value(
            'nova_gpu_device_attached', host='gpu-1', gpu='1',
            kind='passthrough', device='0000:3b:00.0'))
        self.assertEqual(1, self.value(
            'nova_gpu_device_info', host='gpu-1', gpu='1',
            kind='passthrough', device='0000:3b:00.0', profile='L4',
            instance_uuid=VM_UUID, domain='instance-00000002'))

    def test_agent_health_counters(self):
        reconcile = {'errors': ['x: boom'], 'rolled_back': ['a', 'b'],
                     'removed': ['c'], 'waiting': ['d', 'e', 'f']}
        self.collector.observe(_cycle(reconcile, unsent=4),
                               journal_intents=2)
        self.collector.observe(_cycle(dict(reconcile, waiting=[])))
        self.collector.failed()
        v = lambda name: self.value(name, host='gpu-1')  # noqa: E731
        self.assertEqual(2, v('nova_gpu_agent_cycles_total'))
        self.assertEqual(1, v('nova_gpu_agent_cycle_failures_total'))
        self.assertEqual(2, v('nova_gpu_agent_reconcile_errors_total'))
        self.assertEqual(4, v('nova_gpu_agent_device_rollbacks_total'))
        self.assertEqual(2, v('nova_gpu_agent_orphans_removed_total'))
        self.assertEqual(0, v('nova_gpu_agent_orphan_devices'))
        self.assertEqual(2, v('nova_gpu_agent_journal_intents'))
        self.assertEqual(0, v('nova_gpu_agent_unsent_reports'))
        self.assertEqual(1700000000.0,
                         v('nova_gpu_agent_last_reconcile_timestamp_seconds'))

    def test_gpus_nvml_cannot_read(self):
        self.collector.observe(_cycle())
        self.assertEqual(0, self.value('nova_gpu_agent_gpus_unreadable',
                                       host='gpu-1'))
        lost = {'address': '0000:3b:00.0', 'nvml_index': 1,
                'reason': 'GPU is lost'}
        self.collector.observe(dict(_cycle(), unreadable_gpus=[
            lost, {'address': None, 'nvml_index': 3,
                   'reason': 'Unknown Error'}]))
        self.assertEqual(2, self.value('nova_gpu_agent_gpus_unreadable',
                                       host='gpu-1'))
        self.assertEqual(1, self.value(
            'nova_gpu_gpu_unreadable_info', host='gpu-1', nvml_index='1',
            address='0000:3b:00.0', reason='GPU is lost'))
        self.assertEqual(1, self.value(
            'nova_gpu_gpu_unreadable_info', host='gpu-1', nvml_index='3',
            address='', reason='Unknown Error'))
        # Read again: the series go.
        self.collector.observe(_cycle())
        self.assertEqual(0, self.value('nova_gpu_agent_gpus_unreadable',
                                       host='gpu-1'))
        self.assertIsNone(self.value(
            'nova_gpu_gpu_unreadable_info', host='gpu-1', nvml_index='1',
            address='0000:3b:00.0', reason='GPU is lost'))

    def test_a_bad_report_keeps_the_previous_one(self):
        self.collector.observe(_cycle())
        bad = _report()
        bad['gpus'][0]['model'] = 'NO-SUCH-GPU'
        self.collector.observe({'report': bad, 'reconcile': None})
        self.assertEqual(0.25, self.value(
            'nova_gpu_gpu_free_ratio', host='gpu-1', gpu='0',
            address='0000:07:00.0', model='A100-40GB'))
        self.assertEqual(2, self.value('nova_gpu_agent_cycles_total',
                                       host='gpu-1'))

    def test_without_nvml_no_nvml_series(self):
        collector = exporter.HostCollector(
            'gpu-1', nvml_mod.Nvml(lib=fakenvml.FakePynvml(
                library_missing=True)), CATALOG)
        collector.observe(_cycle())
        names = {f.name for f in collector.collect()}
        self.assertIn('nova_gpu_gpu_free_ratio', names)
        self.assertNotIn('nova_gpu_gpu_utilization_ratio', names)
        self.assertNotIn('nova_gpu_gpu_power_watts', names)


class DomainsTest(testtools.TestCase):
    XML = ('<domain><devices><hostdev mode="subsystem" type="mdev">'
           '<source><address uuid="%s"/></source></hostdev>'
           '<hostdev mode="subsystem" type="pci"><source><address '
           'domain="0x0000" bus="0x3b" slot="0x00" function="0x4"/>'
           '</source></hostdev></devices></domain>' % MDEV.upper())

    def test_devices_to_instances(self):
        found = exporter.domain_instances([
            ('instance-1', VM_UUID, [self.XML]),
            ('broken', 'x', ['<domain']),
        ])
        self.assertEqual({MDEV: ('instance-1', VM_UUID),
                          '0000:3b:00.4': ('instance-1', VM_UUID)}, found)


class ServeTest(testtools.TestCase):

    def test_listen_address(self):
        self.assertEqual(('127.0.0.1', 9835),
                         exporter.parse_listen('127.0.0.1:9835'))
        self.assertEqual(('::1', 9835), exporter.parse_listen('[::1]:9835'))
        for bad in ('9835', 'host:', 'host:99999', 'host:x'):
            e = self.assertRaises(ValueError, exporter.parse_listen, bad)
            self.assertIn('metrics_listen', str(e))

    def test_off_by_default_and_served_when_set(self):
        agent = types.SimpleNamespace(
            host='gpu-1', nvml=None, catalog=CATALOG, libvirt=None,
            journal=types.SimpleNamespace(intents=lambda: {'k': {}}))
        conf = types.SimpleNamespace(
            gpu_agent=types.SimpleNamespace(metrics_listen=''))
        off = exporter.serve(conf, agent)
        off.observe(_cycle())
        self.assertIsNone(off.collector)
        conf.gpu_agent.metrics_listen = '127.0.0.1:0'
        server = exporter.serve(conf, agent)
        self.addCleanup(server.stop)
        server.observe(_cycle())
        with urllib.request.urlopen('http://127.0.0.1:%d/metrics'
                                    % server.port, timeout=10) as r:
            text = r.read().decode()
        samples = {(s.name, s.labels.get('gpu')): s.value
                   for f in parser.text_string_to_metric_families(text)
                   for s in f.samples}
        self.assertEqual(1.0, samples[('nova_gpu_gpu_free_ratio', '1')])
        self.assertEqual(1, samples[('nova_gpu_agent_journal_intents',
                                     None)])


class DeviceEventsTest(testtools.TestCase):

    def test_created_removed_and_rolled_back(self):
        sent = []
        events = device_events.DeviceEvents(
            None, 'gpu-1', send=lambda t, p: sent.append((t, p)))
        self.assertEqual([], events.observe(_cycle()))  # the baseline
        report = _report()
        report['gpus'][0]['devices'] = [
            {'kind': 'mig', 'detail': ['2g.10gb', 4, None]},
            {'kind': 'mig', 'detail': ['1g.5gb', 6, None]}]
        payloads = events.observe(
            {'report': report, 'reconcile': {'rolled_back': [MDEV]}},
            instances={'0000:07:00.0/mig@6': ('instance-9', VM_UUID)})
        self.assertEqual(
            [('remove', '0000:07:00.0/mig@0', 'A100-3-20C', None),
             ('create', '0000:07:00.0/mig@6', '1g.5gb', VM_UUID),
             ('rollback', MDEV, None, None)],
            [(p.action, p.device, p.profile, p.instance_uuid)
             for p in payloads])
        self.assertTrue(events.flush(5))
        self.assertEqual(3, len(sent))
        event_type, primitive = sent[1]
        self.assertEqual('gpu.device.change', event_type)
        back = notification.parse(event_type, primitive)
        self.assertEqual('mig', back.kind)
        self.assertEqual('0000:07:00.0', back.gpu_address)

    def test_an_mdev_its_guest_left_is_not_removed(self):
        # The report lists an mdev no guest holds under idle_mdevs, not
        # devices: it still exists, so nothing was removed.
        held = {'kind': 'vgpu', 'detail': 'A100-10C', 'uuid': MDEV}
        events = device_events.DeviceEvents(None, 'gpu-1',
                                            send=lambda t, p: None)
        report = _report()
        report['gpus'][0]['devices'] = [held]
        events.observe({'report': report})
        report = _report()
        report['gpus'][0]['devices'] = []
        report['gpus'][0]['idle_mdevs'] = [
            {'uuid': MDEV, 'detail': 'A100-10C'}]
        self.assertEqual([], events.observe({'report': report}))
        report = _report()
        report['gpus'][0]['devices'] = []
        self.assertEqual([('remove', MDEV)], [
            (p.action, p.device) for p in events.observe(
                {'report': report})])

    def test_devices_of_a_gpu_nvml_cannot_read_are_not_removed(self):
        # Left out of the report while NVML cannot read its GPU: unknown,
        # not removed; gone once the GPU reads again without them.
        events = device_events.DeviceEvents(None, 'gpu-1',
                                            send=lambda t, p: None)
        events.observe(_cycle())
        report = _report()
        del report['gpus'][0]
        self.assertEqual([], events.observe(
            {'report': report, 'left_out_gpus': ['0000:07:00.0']}))
        report = _report()
        report['gpus'][0]['devices'] = []
        self.assertEqual(
            [('remove', '0000:07:00.0/mig@0'),
             ('remove', '0000:07:00.0/mig@4')],
            [(p.action, p.device) for p in events.observe(
                {'report': report})])

    def test_a_failed_send_is_not_raised(self):
        def boom(*args):
            raise RuntimeError('broker down')
        events = device_events.DeviceEvents(None, 'gpu-1', send=boom)
        events.observe(_cycle())
        report = _report()
        report['gpus'][0]['devices'] = []
        self.assertEqual(2, len(events.observe({'report': report})))
        self.assertTrue(events.flush(5))
        self.assertEqual(2, events.queue.stats()['failed'])

    def test_a_hung_broker_does_not_hold_the_cycle(self):
        # A send that waits on a broker stopped with its connections open
        # (no answer) holds the queue's thread, never observe().
        release = threading.Event()
        sent = []

        def hung(event_type, payload):
            release.wait(30)
            sent.append(event_type)
        events = device_events.DeviceEvents(None, 'gpu-1', send=hung)
        self.addCleanup(release.set)
        events.observe(_cycle())
        empty = _report()
        empty['gpus'][0]['devices'] = []
        start = time.monotonic()
        # Removed, created again, removed: two devices each time.
        for cycle in ({'report': empty}, _cycle(), {'report': empty}):
            self.assertEqual(2, len(events.observe(cycle)))
        self.assertLess(time.monotonic() - start, 1.0)
        self.assertEqual([], sent)
        release.set()
        self.assertTrue(events.flush(5))
        self.assertEqual(6, len(sent))
        events.close()
