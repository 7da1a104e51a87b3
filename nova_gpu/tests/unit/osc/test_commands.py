"""``openstack gpu ...`` commands against a running exporter API.

The exporter's HTTP API runs in process on a free port of 127.0.0.1, fed
reports through its state; the commands talk to it over HTTP. Nova and
Placement answers for ``gpu server show`` come from a stand-in
connection (the functional demo drives the real ones).
"""

import io
import json
import types

import fixtures
from osc_lib import exceptions
import prometheus_client
import testtools

from nova_gpu.core import catalog as catalog_mod
from nova_gpu.core import host as host_mod
from nova_gpu.core import report as report_mod
from nova_gpu.exporter import api
from nova_gpu.exporter import cloud
from nova_gpu.osc import client as client_mod
from nova_gpu.osc import commands
from nova_gpu.osc import plugin
from nova_gpu.tests.unit.exporter import test_cloud

CATALOG = catalog_mod.load_catalog()


class Response:
    status_code = 200

    def __init__(self, body):
        self.body = body

    def json(self):
        return self.body


class FakeConnection:
    """Answers the compute and placement calls the commands make."""

    def __init__(self, flavors=None, server=None, allocations=None,
                 providers=None):
        self.compute = types.SimpleNamespace(
            find_flavor=self.find_flavor, find_server=self.find_server)
        self.placement = types.SimpleNamespace(get=self.placement_get)
        self.flavors = flavors or {}
        self.server = server
        self.allocations = allocations or {}
        self.providers = providers or {}

    def find_flavor(self, name, ignore_missing=True):
        return types.SimpleNamespace(name=name,
                                     extra_specs=self.flavors[name])

    def find_server(self, name, ignore_missing=True):
        return self.server

    def placement_get(self, url, microversion=None, raise_exc=True):
        if url.startswith('/allocations/'):
            return Response({'allocations': self.allocations})
        return Response({'name': self.providers[url.rsplit('/', 1)[1]]})


class CommandsTest(testtools.TestCase):

    def setUp(self):
        super().setUp()
        self.state = cloud.CloudState(CATALOG)
        report = test_cloud.mixed_report(devices=test_cloud.BUSY)
        report['gpus'][1]['providers'] = [{
            'name': 'gpu-1_pci_0000_3b_00_4', 'kind': 'vf_mdev',
            'address': '0000:3b:00.4', 'resource_class': 'VGPU',
            'vgpu_type': 'L4-6C', 'vfs': [], 'mig': None}]
        report['gpus'][1]['address'] = '0000:3b:00.0'
        self.state.ingest_report(report)
        self.state.ingest_report(test_cloud.mixed_report(name='gpu-2'))
        registry = prometheus_client.CollectorRegistry()
        server = api.HttpServer(api.Api(self.state, registry, 180),
                                '127.0.0.1', 0)
        self.addCleanup(server.stop)
        self.conn = FakeConnection()
        self.app = types.SimpleNamespace(
            client_manager=types.SimpleNamespace(
                gpu=client_mod.ExporterClient(
                    'http://127.0.0.1:%d/' % server.port),
                sdk_connection=self.conn),
            stdout=io.StringIO(), stderr=io.StringIO(), options=None)

    def run_cmd(self, cls, *argv):
        cmd = cls(self.app, None)
        parsed = cmd.get_parser('openstack gpu').parse_args(list(argv))
        return cmd, parsed, cmd.take_action(parsed)

    def test_host_list(self):
        _c, _p, (columns, rows) = self.run_cmd(commands.ListHosts)
        rows = [dict(zip(columns, r)) for r in rows]
        self.assertEqual(['gpu-1', 'gpu-2'], [r['Host'] for r in rows])
        self.assertEqual(1.75, rows[0]['Free GPUs'])
        self.assertEqual({'A100-40GB': 1, 'L4': 2},
                         rows[0]['Models'].machine_readable())
        self.assertFalse(rows[0]['Stale'])
        self.assertEqual(0.0, rows[1]['Fragmentation'])

    def test_host_show_and_json_output(self):
        cmd, parsed, (columns, values) = self.run_cmd(
            commands.ShowHost, 'gpu-1', '-f', 'json')
        shown = dict(zip(columns, values))
        gpus = shown['GPU Devices'].machine_readable()
        self.assertEqual(['A100-40GB', 'L4', 'L4'],
                         [g['model'] for g in gpus])
        self.assertEqual(['gpu-1_pci_0000_3b_00_4'], gpus[1]['providers'])
        cmd.run(parsed)
        out = json.loads(self.app.stdout.getvalue())
        self.assertEqual('gpu-1', out['Host'])
        self.assertIn({'model': 'L4', 'kind': 'vgpu', 'profile': 'L4-12C',
                       'free': 1}, out['Free Devices'])
        self.assertRaises(exceptions.NotFound, self.run_cmd,
                          commands.ShowHost, 'nope')
        self.assertEqual([], out['Unreadable GPUs'])

    def test_host_show_names_quarantined_gpus(self):
        report = test_cloud.mixed_report(2, name='gpu-2')
        report['gpus'][0]['health'] = {
            'quarantined': True, 'faults': [],
            'reason': 'Xid 79: GPU has fallen off the bus (needs a reboot)'}
        self.state.ingest_report(report)
        _c, _p, (columns, values) = self.run_cmd(commands.ShowHost, 'gpu-2')
        shown = dict(zip(columns, values))
        held = shown['Quarantined GPUs'].machine_readable()
        self.assertEqual(1, len(held))
        self.assertIn('Xid 79', held[0]['reason'])
        self.assertEqual(report['gpus'][0]['health'], shown[
            'GPU Devices'].machine_readable()[0]['health'])

    def test_host_show_names_gpus_nvml_cannot_read(self):
        report = test_cloud.mixed_report(2, name='gpu-2')
        report['left_out'] = [{'address': '0000:9a:00.0',
                               'reason': 'GPU is lost', 'providers': []}]
        self.state.ingest_report(report)
        _c, _p, (columns, values) = self.run_cmd(commands.ShowHost, 'gpu-2')
        self.assertEqual(
            [{'address': '0000:9a:00.0', 'reason': 'GPU is lost'}],
            dict(zip(columns, values))['Unreadable GPUs'].machine_readable())

    def test_capacity(self):
        _c, _p, (columns, rows) = self.run_cmd(commands.Capacity,
                                               '--model', 'L4')
        rows = {r[2]: dict(zip(columns, r)) for r in rows}
        self.assertEqual(3 + 8, rows['L4-6C']['Free'])
        # only where the L4 is set up to go whole (its report names no
        # vGPU type for it)
        self.assertEqual(1, rows['whole']['Free'])
        self.assertEqual(2, rows['L4-6C']['Hosts'])
        self.assertNotIn('3g.20gb', rows)

    def test_capacity_of_a_flavor(self):
        self.conn.flavors = {
            'gpu.20g': {'gpu:mig': '3g.20gb'},
            'two.l4': {'gpu:profile': 'L4-6C', 'gpu:count': '2'},
            'by.memory': {'gpu:memory': '20GB'}}
        _c, _p, (columns, rows) = self.run_cmd(commands.Capacity,
                                               '--flavor', 'gpu.20g')
        # one more on gpu-1's A100, two on gpu-2's empty one
        self.assertEqual([('A100-40GB', 'mig', '3g.20gb', 3, 2, 3)], rows)
        _c, _p, (columns, rows) = self.run_cmd(commands.Capacity,
                                               '--flavor', 'two.l4')
        # two devices on two GPUs of one host: only gpu-2 has two L4s,
        # with 4 each (11 // 2 = 5 would count gpu-1's lone L4)
        self.assertEqual([('L4', 'vgpu', 'L4-6C', 11, 2, 4)], rows)
        e = self.assertRaises(exceptions.CommandError, self.run_cmd,
                              commands.Capacity, '--flavor', 'by.memory')
        self.assertIn('--profile', str(e))

    def test_capacity_csv(self):
        cmd, parsed, _r = self.run_cmd(commands.Capacity, '--profile',
                                       'L4-12C', '-f', 'csv')
        cmd.run(parsed)
        self.assertEqual('"Model","Kind","Profile","Free","Hosts"\n'
                         '"L4","vgpu","L4-12C",3,2\n',
                         self.app.stdout.getvalue().replace('\r\n', '\n'))

    def test_server_show(self):
        self.conn.server = types.SimpleNamespace(
            id='srv-1', name='vm', compute_host='gpu-1',
            flavor={'original_name': 'l4.6c'})
        self.conn.allocations = {
            'rp-gpu': {'resources': {'VGPU': 1}},
            'rp-root': {'resources': {'VCPU': 2, 'MEMORY_MB': 2048}}}
        self.conn.providers = {'rp-gpu': 'gpu-1_pci_0000_3b_00_4',
                               'rp-root': 'gpu-1'}
        _c, _p, (columns, values) = self.run_cmd(commands.ShowServer, 'vm')
        shown = dict(zip(columns, values))
        self.assertEqual('gpu-1', shown['Host'])
        self.assertEqual('l4.6c', shown['Flavor'])
        self.assertEqual([{
            'provider': 'gpu-1_pci_0000_3b_00_4', 'resource_class': 'VGPU',
            'amount': 1, 'host': 'gpu-1', 'gpu': 1,
            'gpu_address': '0000:3b:00.0', 'model': 'L4', 'kind': 'vf_mdev',
            'address': '0000:3b:00.4', 'vgpu_type': 'L4-6C'}],
            shown['GPU Devices'].machine_readable())

    def test_server_show_marks_idle_devices(self):
        from nova_gpu.tests.unit.exporter import test_idle
        report = test_idle.idle_report()
        report['host'] = report['nodename'] = 'gpu-9'
        self.state.ingest_report(report)
        self.conn.server = types.SimpleNamespace(
            id=test_idle.SERVER, name='idle-vm', compute_host='gpu-9',
            flavor={})
        self.conn.allocations = {}
        _c, _p, (columns, values) = self.run_cmd(commands.ShowServer,
                                                 'idle-vm')
        (idle,) = dict(zip(columns, values))['Idle'].machine_readable()
        self.assertEqual(2400.0, idle['seconds'])
        self.assertEqual('1g.5gb', idle['suggestion'])
        # Another server: nothing idle.
        self.conn.server.id = 'srv-other'
        _c, _p, (columns, values) = self.run_cmd(commands.ShowServer,
                                                 'idle-vm')
        self.assertEqual([], dict(zip(columns, values))[
            'Idle'].machine_readable())

    def test_server_show_names_the_guests_own_vf(self):
        # An H100 whose two vendor-VFIO VFs are pooled in one provider; the
        # guest srv-2 holds the second (its host's agent saw its domain).
        h100 = CATALOG.model('H100-80GB')
        host = host_mod.Host('gpu-3', [host_mod.Gpu(0, h100)])
        vfs = ['0000:41:00.4', '0000:41:00.5']
        pool = report_mod.pci_provider_name('gpu-3', '0000:41:00.0')
        report = report_mod.host_to_dict(host, generation=1, providers={
            0: [report_mod.provider_dict(
                pool, report_mod.PCI_POOL, '0000:41:00.0',
                'CUSTOM_NVIDIA_VGPU', 'H100-40C', vfs=vfs)]}, devices={
            0: [{'kind': 'vgpu', 'detail': 'H100-40C', 'vf': vfs[1],
                 'instance': 'srv-2'}]})
        report['gpus'][0]['address'] = '0000:41:00.0'
        self.state.ingest_report(report)
        self.conn.server = types.SimpleNamespace(
            id='srv-2', name='vm2', compute_host='gpu-3', flavor={})
        self.conn.allocations = {'rp-pool': {'resources': {
            'CUSTOM_NVIDIA_VGPU': 1}}}
        self.conn.providers = {'rp-pool': pool}
        cmd, parsed, (columns, values) = self.run_cmd(commands.ShowServer,
                                                      'vm2')
        (device,) = dict(zip(columns, values))[
            'GPU Devices'].machine_readable()
        self.assertEqual(vfs[1], device['vf'])
        self.assertNotIn('vfs', device)
        # As OpenStackClient prints it: key='value' pairs, no Python lists.
        shown = dict(zip(columns, values))['GPU Devices'].human_readable()
        self.assertIn("vf='0000:41:00.5'", shown)
        self.assertNotIn('[', shown)

    def test_unreachable_exporter(self):
        self.app.client_manager.gpu = client_mod.ExporterClient(
            'http://127.0.0.1:9', timeout=2)
        e = self.assertRaises(exceptions.CommandError, self.run_cmd,
                              commands.ListHosts)
        self.assertIn('OS_GPU_EXPORTER_URL', str(e))


class PluginTest(testtools.TestCase):

    def test_exporter_url(self):
        instance = types.SimpleNamespace(
            _cli_options=types.SimpleNamespace(config={
                'gpu_exporter_url': 'http://exp:1'}))
        self.assertEqual('http://exp:1', plugin.exporter_url(instance))
        self.useFixture(fixtures.EnvironmentVariable(plugin.ENV_URL,
                                                     'http://env:2'))
        instance._cli_options.config = {}
        self.assertEqual('http://env:2', plugin.exporter_url(instance))
        self.useFixture(fixtures.EnvironmentVariable(plugin.ENV_URL, None))

        def catalog(service_type, interface=None):
            raise RuntimeError('no catalog')
        instance.get_endpoint_for_service_type = catalog
        self.assertEqual(plugin.DEFAULT_URL, plugin.exporter_url(instance))
        client = plugin.make_client(instance)
        self.assertEqual(plugin.DEFAULT_URL, client.url)
