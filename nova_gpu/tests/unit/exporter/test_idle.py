"""Idle guest devices on the cloud exporter: the metric and /v1/idle."""

import io
import json

import prometheus_client
import testtools

from nova_gpu.exporter import api
from nova_gpu.exporter import cloud
from nova_gpu.exporter import collector
from nova_gpu.tests.unit.exporter import test_cloud

SERVER = '11111111-2222-4333-8444-555555555555'
MARK = {'since': 1000.0, 'seconds': 2400.0, 'peak_compute': 0.01,
        'peak_memory_mib': 3000.0, 'suggestion': '1g.5gb', 'samples': 40}


def idle_report():
    """gpu-1 of test_cloud with its A100 MIG guest idle."""
    return test_cloud.mixed_report(devices={
        0: [{'kind': 'mig', 'detail': ['3g.20gb', 0, 'A100-3-20C'],
             'uuid': 'c0ffee00-0000-4000-8000-000000000001',
             'instance': SERVER, 'idle': dict(MARK)}],
        1: [{'kind': 'vgpu', 'detail': 'L4-6C'}]})


class IdleExportTest(testtools.TestCase):

    def setUp(self):
        super().setUp()
        self.state = cloud.CloudState(test_cloud.CATALOG,
                                      clock=test_cloud.Clock())
        self.registry = prometheus_client.CollectorRegistry()
        self.registry.register(collector.CloudCollector(self.state))
        self.state.ingest_report(idle_report())
        self.state.ingest_report(test_cloud.mixed_report(name='gpu-2'))

    def test_idle_devices(self):
        (row,) = collector.idle_devices(self.state.hosts())
        self.assertEqual('%s/mig@0' % row.pop('address'), row.pop('device'))
        self.assertEqual({
            'host': 'gpu-1', 'gpu': 0, 'server_id': SERVER,
            'model': 'A100-40GB', 'kind': 'mig', 'profile': 'A100-3-20C',
            'since': 1000.0, 'seconds': 2400.0, 'peak_compute': 0.01,
            'peak_memory_mib': 3000.0, 'suggestion': '1g.5gb'}, row)

    def test_metric(self):
        (row,) = collector.idle_devices(self.state.hosts())
        self.assertEqual(2400.0, self.registry.get_sample_value(
            'nova_gpu_device_idle_seconds', {
                'host': 'gpu-1', 'gpu': '0', 'address': row['address'],
                'device': row['device'], 'server_id': SERVER,
                'model': 'A100-40GB', 'kind': 'mig',
                'profile': 'A100-3-20C', 'suggestion': '1g.5gb'}))

    def test_busy_devices_are_not_listed(self):
        state = cloud.CloudState(test_cloud.CATALOG)
        state.ingest_report(test_cloud.mixed_report(
            devices=test_cloud.BUSY))
        self.assertEqual([], collector.idle_devices(state.hosts()))

    def test_an_odd_mark_is_ignored(self):
        report = idle_report()
        report['gpus'][0]['devices'][0]['idle'] = 'yes'
        state = cloud.CloudState(test_cloud.CATALOG)
        state.ingest_report(report)
        self.assertEqual([], collector.idle_devices(state.hosts()))

    def test_api(self):
        app = api.Api(self.state, self.registry, 180)
        status = []
        body = b''.join(app({'PATH_INFO': '/v1/idle', 'REQUEST_METHOD': 'GET',
                             'wsgi.input': io.BytesIO(), 'QUERY_STRING': ''},
                            lambda s, h: status.append(s)))
        self.assertEqual('200 OK', status[0])
        (row,) = json.loads(body)['idle']
        self.assertEqual('1970-01-01T00:16:40+00:00', row['since'])
        self.assertEqual(SERVER, row['server_id'])
        self.assertEqual('1g.5gb', row['suggestion'])
