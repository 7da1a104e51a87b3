"""``openstack gpu defrag`` against a running exporter API and a stand-in
Nova (the functional test drives the real one:
nova_gpu/tests/functional/scheduler/test_defrag.py).
"""

import io
import json
import types

from openstack import exceptions as sdk_exceptions
from osc_lib import exceptions
import prometheus_client
import testtools

from nova_gpu.core import catalog as catalog_mod
from nova_gpu.core import fixtures
from nova_gpu.core import host as H
from nova_gpu.core import report as report_mod
from nova_gpu.exporter import api
from nova_gpu.exporter import cloud
from nova_gpu.osc import client as client_mod
from nova_gpu.osc import defrag as defrag_cmd

CATALOG = catalog_mod.load_catalog()
T4 = CATALOG.model('T4')
FULL = 'T4-16C'


def report(name, busy):
    """A T4 host with two GPUs showing T4-16C on their PFs (pf_mdev);
    ``busy``: the GPU indices holding a vGPU.
    """
    host = fixtures.pcie_host(name, T4, gpus=2, numa_nodes=1,
                              vgpu_types=[FULL])
    providers = {g.index: [report_mod.provider_dict(
        report_mod.mdev_provider_name(name, g.address), report_mod.PF_MDEV,
        g.address, vgpu_type=FULL)] for g in host.gpus}
    devices = {i: [{'kind': H.VGPU, 'detail': FULL}] for i in busy}
    return report_mod.host_to_dict(host, generation=1, providers=providers,
                                   devices=devices)


class FakeNova:
    """The compute, placement and image calls of the command.

    ``servers``: id -> host; each holds GPU 0 of its host. Live
    migrations to a host in ``refuse`` end with the server back ACTIVE
    on its source (as Nova's rollback leaves it).
    """

    def __init__(self, servers, refuse=()):
        self.hosts = dict(servers)
        self.refuse = set(refuse)
        self.migrations = []
        self.compute = types.SimpleNamespace(
            servers=self.servers, get_server=self.get_server,
            live_migrate_server=self.live_migrate_server)
        self.placement = types.SimpleNamespace(get=self.placement_get)
        self.image = types.SimpleNamespace(get_image=lambda i: (
            types.SimpleNamespace(properties={})))

    def _server(self, sid):
        return types.SimpleNamespace(
            id=sid, status='ACTIVE', compute_host=self.hosts[sid],
            task_state=None, image={'id': 'img'}, fault=None)

    def servers(self, details, all_projects):
        return [self._server(s) for s in sorted(self.hosts)]

    def get_server(self, sid):
        if sid not in self.hosts:
            raise sdk_exceptions.NotFoundException('no server %s' % sid)
        return self._server(sid)

    def live_migrate_server(self, sid, host, block_migration):
        self.migrations.append((sid, host, block_migration))
        if host not in self.refuse:
            self.hosts[sid] = host

    def placement_get(self, url, microversion=None, raise_exc=True):
        if url == '/resource_providers':
            body = {'resource_providers': [
                {'uuid': 'rp-%s' % h, 'name': report_mod.mdev_provider_name(
                    h, '0000:3b:00.0')} for h in ('a', 'b', 'c')]}
        else:
            sid = url.rsplit('/', 1)[1]
            body = {'allocations': {'rp-%s' % self.hosts[sid]: {
                'resources': {'VGPU': 1}}}}
        return types.SimpleNamespace(status_code=200, json=lambda: body)


class DefragCommandTest(testtools.TestCase):

    def setUp(self):
        super().setUp()
        self.state = cloud.CloudState(CATALOG)
        for name in ('a', 'b'):
            self.state.ingest_report(report(name, busy=[0]))
        self.state.ingest_report(report('c', busy=[0, 1]))
        server = api.HttpServer(api.Api(
            self.state, prometheus_client.CollectorRegistry(), 180),
            '127.0.0.1', 0)
        self.addCleanup(server.stop)
        self.nova = FakeNova({'s-a': 'a', 's-b': 'b', 's-c': 'c'})
        self.app = types.SimpleNamespace(
            client_manager=types.SimpleNamespace(
                gpu=client_mod.ExporterClient(
                    'http://127.0.0.1:%d/' % server.port),
                sdk_connection=self.nova),
            stdout=io.StringIO(), stderr=io.StringIO(), options=None)

    def run_cmd(self, *argv):
        cmd = defrag_cmd.Defrag(self.app, None)
        parsed = cmd.get_parser('openstack gpu defrag').parse_args(
            list(argv) + ['-f', 'json'])
        code = cmd.run(parsed)
        return code, json.loads(self.app.stdout.getvalue())

    def test_dry_run_prints_one_row_per_move(self):
        code, rows = self.run_cmd('--dry-run', '--min-gpus', '2')
        self.assertEqual(0, code)
        self.assertEqual([{
            'Step': 1, 'Server': 's-a', 'Source': 'a GPU 0',
            'Destination': 'b GPU 1', 'GPU Memory (MiB)': 16384,
            'Status': 'planned',
            'Detail': 'live-migrate server s-a from a GPU 0 to b GPU 1 '
                      '(vGPU T4-16C x1, 16384 MiB GPU memory moved)'}], rows)
        self.assertEqual([], self.nova.migrations)
        err = self.app.stderr.getvalue()
        self.assertIn('whole:2: frees a GPU 0,1 with 1 live migration', err)

    def test_carries_out_through_the_compute_api(self):
        code, rows = self.run_cmd('--target', 'whole:2')
        self.assertEqual(0, code)
        self.assertEqual([('s-a', 'b', 'auto')], self.nova.migrations)
        self.assertEqual('b', self.nova.hosts['s-a'])
        self.assertEqual(('done', 'server s-a is ACTIVE on b'),
                         (rows[0]['Status'], rows[0]['Detail']))

    def test_stops_at_first_failure(self):
        self.nova.refuse = {'b'}
        code, rows = self.run_cmd('--target', 'host:a', '--target',
                                  'host:b', '--max-moves', '3')
        self.assertEqual(1, code)
        self.assertEqual([('s-a', 'b', 'auto')], self.nova.migrations)
        self.assertEqual(['failed', 'not run', 'not run'],
                         [r['Status'] for r in rows])
        self.assertIn('ACTIVE on a, not b', self.app.stderr.getvalue())

    def test_nothing_to_do(self):
        code, rows = self.run_cmd('--target', 'whole:1')
        self.assertEqual((0, []), (code, rows))
        self.assertIn('whole:1: fits now on a GPU 1',
                      self.app.stderr.getvalue())

    def test_bad_arguments(self):
        e = self.assertRaises(exceptions.CommandError, self.run_cmd,
                              '--target', 'gpus:4')
        self.assertIn("defrag target 'gpus:4'", str(e))
        self.assertRaises(exceptions.CommandError, self.run_cmd,
                          '--max-moves', '0')
