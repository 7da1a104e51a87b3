"""The cloud exporter: figures from reports, counters from notifications,
the Prometheus series and the JSON API.
"""

import io
import json

from oslo_config import cfg
from oslo_config import fixture as config_fixture
import oslo_messaging as messaging
from oslo_messaging.notify import _impl_test
import prometheus_client
import testtools

from nova_gpu.core import catalog as catalog_mod
from nova_gpu.core import host as host_mod
from nova_gpu.core import notification
from nova_gpu.core import report as report_mod
from nova_gpu.exporter import api
from nova_gpu.exporter import cloud
from nova_gpu.exporter import collector
from nova_gpu.exporter import listener
from nova_gpu.exporter import service
from nova_gpu.scheduler import notifier as notifications
from nova_gpu.tests.unit.scheduler import base as scheduler_base

CATALOG = catalog_mod.load_catalog()


class Clock:
    now = 1000.0

    def __call__(self):
        return self.now


def mixed_report(generation=1, devices=None, boot_id='b1', name='gpu-1'):
    """An A100 in MIG mode, an L4 with L4-6C enabled, an L4 set up for
    nothing in particular.
    """
    a100, l4 = CATALOG.model('A100-40GB'), CATALOG.model('L4')
    host = host_mod.Host(name, [
        host_mod.Gpu(0, a100, mig_enabled=True),
        host_mod.Gpu(1, l4, vgpu_types=['L4-6C']),
        host_mod.Gpu(2, l4)])
    return report_mod.host_to_dict(host, generation=generation,
                                   devices=devices, boot_id=boot_id)


BUSY = {0: [{'kind': 'mig', 'detail': ['3g.20gb', 0, None]}],
        1: [{'kind': 'vgpu', 'detail': 'L4-6C'}],
        2: [{'kind': 'vgpu', 'detail': 'L4-12C'}]}


class FiguresTest(testtools.TestCase):

    def setUp(self):
        super().setUp()
        self.clock = Clock()
        self.state = cloud.CloudState(CATALOG, clock=self.clock)

    def figures(self, report):
        self.state.ingest_report(report)
        return self.state.figures()[report['host']][1]

    def test_empty_host_has_no_fragmentation(self):
        f = self.figures(mixed_report())
        self.assertEqual(0.0, f.fragmentation_milli)
        self.assertEqual(0, f.stranded_milli)
        self.assertEqual(3000, f.free_milli)
        self.assertEqual({'A100-40GB': 1, 'L4': 2}, f.gpus)
        self.assertEqual(7, f.free_devices[('A100-40GB', 'mig', '1g.5gb')])
        # MIG mode: no whole A100; only the L4 whose report says nothing
        # of its path could go whole (the other serves its vGPU type: a
        # whole GPU is no device Nova would give it)
        self.assertEqual(0, f.free_devices[('A100-40GB', 'whole', 'whole')])
        self.assertEqual(1, f.free_devices[('L4', 'whole', 'whole')])
        # L4-6C: 4 per GPU on either L4; L4-4C only on the open one
        self.assertEqual(8, f.free_devices[('L4', 'vgpu', 'L4-6C')])
        self.assertEqual(6, f.free_devices[('L4', 'vgpu', 'L4-4C')])

    def test_free_devices_and_fragmentation_with_devices(self):
        f = self.figures(mixed_report(devices=BUSY))
        # MIG 3g.20gb at slice 0 leaves slices 4-7: one more 3g.20gb
        self.assertEqual(1, f.free_devices[('A100-40GB', 'mig', '3g.20gb')])
        self.assertEqual(0, f.free_devices[('A100-40GB', 'mig', '7g.40gb')])
        self.assertEqual(3, f.free_devices[('L4', 'vgpu', 'L4-6C')])
        self.assertEqual(1, f.free_devices[('L4', 'vgpu', 'L4-12C')])
        self.assertEqual(0, f.free_devices[('L4', 'whole', 'whole')])
        # FGD on the open L4: its free half is lost to every offered
        # device but L4-12C (whole, L4-4C, -6C, -8C, -24C: 5 of 6)
        l4_open = 500 * 5 / 6
        # the L4-6C GPU offers one type, which still fits: no fragment
        # the A100 offers its 7 MIG profiles; 4 slices and 4 compute
        # slices free: 7g and 4g no longer fit (2 of 7 lost)
        a100 = 500 * 2 / 7
        self.assertAlmostEqual(l4_open + a100, f.fragmentation_milli)
        self.assertEqual(0, f.stranded_milli)

    def test_stranded_gpu(self):
        # seven 1g.5gb instances use every compute slice of an A100 and
        # leave one memory slice that no MIG profile can use: stranded
        a100 = CATALOG.model('A100-40GB')
        host = host_mod.Host('s', [host_mod.Gpu(0, a100, mig_enabled=True)])
        report = report_mod.host_to_dict(host, generation=1, devices={
            0: [{'kind': 'mig', 'detail': ['1g.5gb', s, None]}
                for s in range(7)]})
        f = self.figures(report)
        self.assertEqual(125, f.free_milli)
        self.assertEqual(125, f.stranded_milli)
        self.assertAlmostEqual(125, f.fragmentation_milli)

    def test_generations(self):
        self.state.ingest_report(mixed_report(5))
        self.assertIsNone(self.state.ingest_report(mixed_report(4)))
        self.assertEqual(5, self.state.hosts()['gpu-1'].report.generation)
        # a new agent run, or a held report past reset_after, lets it in
        self.assertIsNotNone(self.state.ingest_report(
            mixed_report(3, boot_id='b2')))
        self.clock.now += 301
        self.assertIsNotNone(self.state.ingest_report(
            mixed_report(2, boot_id='b2')))

    def test_generations_by_the_core_rule(self):
        # core.report.replaces, as the schedulers apply it: a report
        # without boot_id (an older agent) is no new agent run ...
        self.state.ingest_report(mixed_report(5))
        self.assertIsNone(self.state.ingest_report(
            mixed_report(4, boot_id=None)))
        # ... the held report resent is not taken again, however late ...
        self.clock.now += 301
        self.assertIsNone(self.state.ingest_report(mixed_report(5)))
        self.assertEqual(1000.0, self.state.hosts()['gpu-1'].received)
        # ... and past reset_after a lower generation is.
        self.assertIsNotNone(self.state.ingest_report(
            mixed_report(4, boot_id=None)))
        self.assertIsNone(self.state.hosts()['gpu-1'].report.boot_id)

    def test_bad_report_counted_and_other_hosts_kept(self):
        self.state.ingest_report(mixed_report())
        bad = mixed_report(name='bad')
        bad['gpus'][0]['index'] = 7
        self.assertRaises(report_mod.ReportError, self.state.ingest_report,
                          bad)
        self.assertEqual(['gpu-1'], list(self.state.hosts()))
        self.assertEqual(1, self.state.snapshot_counters()[
            'reports_rejected'])


class CollectorAndApiTest(testtools.TestCase):

    def setUp(self):
        super().setUp()
        self.clock = Clock()
        self.state = cloud.CloudState(CATALOG, clock=self.clock)
        self.registry = prometheus_client.CollectorRegistry()
        self.registry.register(collector.CloudCollector(self.state,
                                                        stale_after=180))
        self.state.ingest_report(mixed_report(devices=BUSY))
        self.state.ingest_report(mixed_report(name='gpu-2'))
        self.endpoint = listener.Endpoint(self.state)

    def value(self, name, **labels):
        return self.registry.get_sample_value(name, labels)

    def test_cloud_series(self):
        self.assertEqual(1, self.value('nova_gpu_cloud_free_devices',
                                       model='L4', kind='whole',
                                       profile='whole'))
        self.assertEqual(4, self.value('nova_gpu_cloud_gpus', model='L4'))
        # gpu-1: half an A100, a quarter and a half of an L4 taken
        self.assertEqual(4.75, self.value('nova_gpu_cloud_free_gpus'))
        self.assertAlmostEqual(1.25 / 6, self.value(
            'nova_gpu_cloud_allocated_ratio'))
        frag = 500 * 5 / 6 + 500 * 2 / 7
        self.assertAlmostEqual(frag / 1000, self.value(
            'nova_gpu_host_fragmentation_gpus', host='gpu-1'))
        self.assertAlmostEqual(frag / 3000, self.value(
            'nova_gpu_host_fragmentation_ratio', host='gpu-1'))
        self.assertAlmostEqual(frag / 6000, self.value(
            'nova_gpu_cloud_fragmentation_ratio'))
        self.assertEqual(0, self.value('nova_gpu_host_fragmentation_gpus',
                                       host='gpu-2'))

    def test_stale_hosts(self):
        self.assertEqual(0, self.value('nova_gpu_cloud_stale_hosts'))
        self.clock.now += 100
        self.state.ingest_report(mixed_report(2, name='gpu-2'))
        self.clock.now += 100
        self.assertEqual(1, self.value('nova_gpu_host_stale', host='gpu-1'))
        self.assertEqual(0, self.value('nova_gpu_host_stale', host='gpu-2'))
        self.assertEqual(200, self.value('nova_gpu_host_report_age_seconds',
                                         host='gpu-1'))
        self.assertEqual(1, self.value('nova_gpu_cloud_stale_hosts'))

    def test_gpus_left_out_by_their_agents(self):
        self.assertEqual(0, self.value('nova_gpu_cloud_unreadable_gpus'))
        data = mixed_report(2, name='gpu-2')
        data['left_out'] = [{'address': '0000:9a:00.0',
                             'reason': 'GPU is lost', 'providers': []}]
        self.state.ingest_report(data)
        self.assertEqual(1, self.value('nova_gpu_host_unreadable_gpus',
                                       host='gpu-2'))
        self.assertEqual(0, self.value('nova_gpu_host_unreadable_gpus',
                                       host='gpu-1'))
        self.assertEqual(1, self.value('nova_gpu_cloud_unreadable_gpus'))

    def test_notifications_counted(self):
        refusal = notification.RefusalPayload(
            refusals={notification.NO_GPU_FITS: 3,
                      notification.STALE_REPORT: 1}, hosts_passed=0)
        self.endpoint.info({}, 'nova-gpu-scheduler:s1',
                           notification.REFUSAL_EVENT,
                           refusal.to_primitive(), {})
        self.endpoint.info({}, 'x', notification.REFUSAL_EVENT,
                           {'nova_object.name': 'Other'}, {})
        self.endpoint.info({}, 'x', notification.DEVICE_EVENT,
                           notification.DevicePayload(
                               host='gpu-1', action='rollback', kind='mig',
                               device='0000:07:00.0/mig@0').to_primitive(),
                           {})
        self.assertEqual(3, self.value('nova_gpu_scheduler_refusals_total',
                                       reason='no_gpu_fits'))
        self.assertEqual(1, self.value('nova_gpu_scheduler_refusals_total',
                                       reason='stale_report'))
        self.assertEqual(0, self.value('nova_gpu_scheduler_refusals_total',
                                       reason='topology'))
        self.assertEqual(1, self.value(
            'nova_gpu_scheduler_requests_unplaced_total'))
        self.assertEqual(1, self.value('nova_gpu_device_changes_total',
                                       action='rollback', kind='mig'))

    def test_bad_report_message_is_dropped(self):
        result = self.endpoint.info({}, 'nova-gpu-agent.x',
                                    report_mod.EVENT_TYPE, {'host': 'x'}, {})
        self.assertEqual(messaging.NotificationResult.HANDLED, result)
        self.assertEqual(1, self.value(
            'nova_gpu_exporter_reports_rejected_total'))

    def get(self, path, method='GET'):
        app = api.Api(self.state, self.registry, 180)
        status = []
        body = b''.join(app({'PATH_INFO': path, 'REQUEST_METHOD': method,
                             'wsgi.input': io.BytesIO(),
                             'QUERY_STRING': ''},
                            lambda s, h: status.append(s)))
        return int(status[0].split()[0]), body

    def test_api(self):
        code, body = self.get('/v1/hosts')
        self.assertEqual(200, code)
        hosts = json.loads(body)['hosts']
        self.assertEqual(['gpu-1', 'gpu-2'], [h['host'] for h in hosts])
        self.assertEqual(1.75, hosts[0]['free_gpus'])
        code, body = self.get('/v1/hosts/gpu-1')
        detail = json.loads(body)
        self.assertEqual(0.5, detail['gpus'][0]['free_ratio'])
        self.assertIn({'model': 'L4', 'kind': 'vgpu', 'profile': 'L4-12C',
                       'free': 1}, detail['free_devices'])
        code, body = self.get('/v1/capacity')
        capacity = {(c['model'], c['profile']): c for c in
                    json.loads(body)['capacity']}
        # servers of 1, 2, 3 ... L4-6C, each device on its own GPU, host
        # by host: gpu-1 holds 3 (one L4), gpu-2 4 + 4 (two L4s)
        self.assertEqual({'model': 'L4', 'kind': 'vgpu', 'profile': 'L4-6C',
                          'free': 3 + 8, 'hosts': 2,
                          'servers': [11, 4, 0, 0, 0, 0, 0, 0]},
                         capacity[('L4', 'L4-6C')])
        self.assertEqual(404, self.get('/v1/hosts/nope')[0])
        self.assertEqual(404, self.get('/v2')[0])
        self.assertEqual(405, self.get('/v1/hosts', 'POST')[0])
        code, body = self.get('/metrics')
        self.assertEqual(200, code)
        self.assertIn(b'nova_gpu_cloud_free_gpus 4.75', body)


class PayloadTest(testtools.TestCase):

    def test_round_trip_nova_style(self):
        p = notification.PlacementPayload(host='h', gpus=[0, 1],
                                          slots=[['mig', ['3g.20gb', 0]]],
                                          instance_uuid='u')
        prim = json.loads(json.dumps(p.to_primitive()))
        self.assertEqual('GpuPlacementPayload', prim['nova_object.name'])
        self.assertEqual('nova_gpu', prim['nova_object.namespace'])
        self.assertEqual('1.0', prim['nova_object.version'])
        # a newer minor version with a field this reader does not know
        prim['nova_object.version'] = '1.3'
        prim['nova_object.data']['new_field'] = 1
        back = notification.parse(notification.PLACEMENT_EVENT, prim)
        self.assertEqual([0, 1], back.gpus)

    def test_refusals_validated(self):
        prim = notification.RefusalPayload(refusals={'no_gpu_fits': 1},
                                           hosts_passed=2).to_primitive()
        prim['nova_object.data']['refusals'] = {'boom': 1}
        e = self.assertRaises(notification.PayloadError, notification.parse,
                              notification.REFUSAL_EVENT, prim)
        self.assertIn('boom', str(e))
        prim['nova_object.version'] = '2.0'
        self.assertRaises(notification.PayloadError, notification.parse,
                          notification.REFUSAL_EVENT, prim)

    def test_reason_of_engine_sentences(self):
        self.assertEqual('no_gpu_fits', notification.reason_of(
            '1 of 8 GPUs can take a A100-3-20C device, 2 needed'))
        self.assertEqual('cpu_memory', notification.reason_of(
            'needs 4000 CPU milli, 2000 free'))
        self.assertEqual('gpu_model', notification.reason_of(
            'no GPU of model H100-80GB'))
        self.assertEqual('topology', notification.reason_of(
            'no 2 GPUs satisfy topology=nvlink'))
        self.assertEqual('no_report', notification.reason_of(
            'no GPU report from this host yet'))
        self.assertEqual('no_gpu_fits', notification.reason_of(
            'every GPU provider Placement offered is full with the earlier '
            'instances of this request'))
        self.assertEqual('other', notification.reason_of('???'))


class SchedulerEmitterTest(testtools.TestCase):

    def setUp(self):
        super().setUp()
        self.useFixture(config_fixture.Config(cfg.CONF))
        self.useFixture(scheduler_base.Notifications())

    def test_refused_reaches_the_exporter_state(self):
        self.assertTrue(notifications.refused(
            'uuid-1', {'no_gpu_fits': 2, 'weird': 1}, 0, request='vgpu x1'))
        (ctxt, message, priority, retry), = _impl_test.NOTIFICATIONS
        self.assertEqual(notification.REFUSAL_EVENT, message['event_type'])
        state = cloud.CloudState(CATALOG)
        listener.Endpoint(state).info({}, message['publisher_id'],
                                      message['event_type'],
                                      message['payload'], {})
        counters = state.snapshot_counters()
        self.assertEqual(2, counters['refusals']['no_gpu_fits'])
        self.assertEqual(1, counters['refusals']['other'])
        self.assertEqual(1, counters['requests_unplaced'])

    def test_placed_reaches_the_exporter_state(self):
        self.assertTrue(notifications.placed(
            'gpu-1', (0,), instance_uuid='uuid-1',
            slots=[host_mod.Slot(0, host_mod.MIG, ('3g.20gb', 4, None))],
            request='a100.mig', fragmentation_delta=0.5))
        (ctxt, message, priority, retry), = _impl_test.NOTIFICATIONS
        self.assertEqual(notification.PLACEMENT_EVENT, message['event_type'])
        wire = json.loads(json.dumps(message['payload']))
        payload = notification.parse(notification.PLACEMENT_EVENT, wire)
        self.assertEqual(('gpu-1', [0], 'uuid-1', 'a100.mig', 0.5),
                         (payload.host, payload.gpus, payload.instance_uuid,
                          payload.request, payload.fragmentation_delta))
        # [gpu, kind, detail], the MIG detail as a list, as on the wire.
        self.assertEqual([[0, 'mig', ['3g.20gb', 4, None]]],
                         message['payload']['nova_object.data']['slots'])
        state = cloud.CloudState(CATALOG)
        listener.Endpoint(state).info({}, message['publisher_id'],
                                      message['event_type'], wire, {})
        self.assertEqual(1, state.snapshot_counters()['placements'])

    def test_sends_without_retrying_a_lost_broker(self):
        # Nova's [oslo_messaging_notifications] retry (-1) would retry for
        # ever inside the scheduling request.
        notifications.set_notifier(None)
        self.useFixture(config_fixture.Config(cfg.CONF)).config(
            transport_url='fake:/', group='oslo_messaging_notifications')
        self.addCleanup(notifications.reset)
        self.assertEqual(0, notifications._get_notifier().retry)
        self.assertEqual(-1, cfg.CONF.oslo_messaging_notifications.retry)

    def test_never_raises(self):
        notifications.set_notifier(None)
        self.useFixture(config_fixture.Config(cfg.CONF)).config(
            transport_url='nope://', group='oslo_messaging_notifications')
        self.assertFalse(notifications.placed('h', ['x']))  # bad GPU index
        self.assertFalse(notifications.placed('h', [0]))    # no transport


class ListenTest(testtools.TestCase):
    def test_listen(self):
        self.assertEqual(('127.0.0.1', 9836),
                         service.parse_listen('127.0.0.1:9836'))
        self.assertRaises(ValueError, service.parse_listen, 'nope')


class HostDetailForPlannersTest(testtools.TestCase):
    """``/v1/hosts/<host>`` carries what ``core.inventory`` needs to give
    a planner outside the scheduler the host the scheduler sees: NVLink
    peers, PCIe switches, CPU, memory, NUMA cells and the vGPU manager.
    """

    def test_detail_round_trips_to_the_reported_host(self):
        from nova_gpu.core import drivers
        from nova_gpu.core import inventory
        h100 = CATALOG.model('H100-80GB')
        host = host_mod.Host('nv-1', [
            host_mod.Gpu(i, h100, numa_node=i // 2,
                         pcie_switch='sw%d' % (i // 2),
                         nvlink_peers=[i ^ 1]) for i in range(4)],
            cpu_milli=64000, memory_mib=262144)
        info = drivers.DriverInfo.build('550.54.14', ['R535', 'R550'],
                                        None)
        state = cloud.CloudState(CATALOG, clock=Clock())
        state.ingest_report(report_mod.host_to_dict(host, drivers=info))
        app = api.Api(state, prometheus_client.CollectorRegistry(), 180)
        status = []
        body = b''.join(app({'PATH_INFO': '/v1/hosts/nv-1',
                             'REQUEST_METHOD': 'GET',
                             'wsgi.input': io.BytesIO(),
                             'QUERY_STRING': ''},
                            lambda s, h: status.append(s)))
        detail = json.loads(body)
        hosts, infos = inventory.hosts_from_api([detail], CATALOG)
        seen = hosts['nv-1']
        self.assertEqual([frozenset([i ^ 1]) for i in range(4)],
                         [frozenset(g.nvlink_peers) for g in seen.gpus])
        self.assertEqual(['sw0', 'sw0', 'sw1', 'sw1'],
                         [g.pcie_switch for g in seen.gpus])
        self.assertEqual((64000, 262144), (seen.cpu_milli, seen.memory_mib))
        self.assertEqual(info.guest_branches, infos['nv-1'].guest_branches)


class ServersFittingTest(testtools.TestCase):
    """Servers of N devices, each on its own GPU of one host."""

    def test_each_device_on_its_own_gpu(self):
        self.assertEqual(7, cloud.servers_fitting([3, 2, 2], 1))
        # one GPU never holds two devices of one server
        self.assertEqual(0, cloud.servers_fitting([8], 2))
        self.assertEqual(4, cloud.servers_fitting([4, 4], 2))
        self.assertEqual(2, cloud.servers_fitting([4, 1, 1], 2))
        self.assertEqual(1, cloud.servers_fitting([1] * 8, 8))
        self.assertEqual(0, cloud.servers_fitting([1] * 7, 8))
        self.assertEqual(0, cloud.servers_fitting([], 1))
