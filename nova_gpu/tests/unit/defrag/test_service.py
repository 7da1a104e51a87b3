"""nova-gpu-defrag: off by default, one run per interval, runs isolated."""

import threading

import fixtures
from oslo_config import fixture as config_fixture
import prometheus_client
import testtools

import nova_gpu.conf
from nova_gpu.core import catalog as catalog_mod
from nova_gpu.core import defrag
from nova_gpu.core import exceptions
from nova_gpu.defrag import service
from nova_gpu.exporter import api
from nova_gpu.exporter import cloud
from nova_gpu.tests.unit.osc import test_defrag as osc_test

CATALOG = catalog_mod.load_catalog()


class ServiceTest(testtools.TestCase):

    def conf(self, **values):
        self.fixture.config(group='gpu_defrag', **values)
        return nova_gpu.conf.CONF

    def setUp(self):
        super().setUp()
        self.fixture = self.useFixture(config_fixture.Config(
            nova_gpu.conf.CONF))
        state = cloud.CloudState(CATALOG)
        for name in ('a', 'b'):
            state.ingest_report(osc_test.report(name, busy=[0]))
        server = api.HttpServer(api.Api(
            state, prometheus_client.CollectorRegistry(), 180),
            '127.0.0.1', 0)
        self.addCleanup(server.stop)
        self.reader = service.ExporterReader('http://127.0.0.1:%d'
                                             % server.port)
        self.nova = osc_test.FakeNova({'s-a': 'a', 's-b': 'b'})

    def test_off_by_default(self):
        self.assertEqual(0, self.conf().gpu_defrag.interval)
        connect = self.useFixture(fixtures.MockPatchObject(service,
                                                           'connect')).mock
        self.assertEqual(0, service.main([]))
        connect.assert_not_called()

    def test_one_run_moves_for_the_targets(self):
        d = service.Defragmenter(self.conf(targets=['whole:2']), self.reader,
                                 self.nova, CATALOG)
        (step,) = d.run_once()
        self.assertEqual(defrag.DONE, step.status)
        self.assertEqual([('s-a', 'b', 'auto')], self.nova.migrations)

    def test_dry_run_and_demand_targets(self):
        d = service.Defragmenter(self.conf(dry_run=True, min_gpus=2),
                                 self.reader, self.nova, CATALOG)
        (step,) = d.run_once()
        self.assertEqual(defrag.PLANNED, step.status)
        self.assertEqual([], self.nova.migrations)

    def test_bad_target_refused_at_start(self):
        e = self.assertRaises(exceptions.InvalidRequest,
                              service.Defragmenter,
                              self.conf(targets=['gpus']),
                              self.reader, self.nova, CATALOG)
        self.assertIn("defrag target 'gpus'", str(e))

    def test_a_failed_run_does_not_end_the_service(self):
        stop = threading.Event()
        runs = []

        class Flaky:
            def run_once(self):
                runs.append(1)
                if len(runs) == 2:
                    stop.set()
                raise RuntimeError('exporter down')
        service.serve(Flaky(), 0, stop)
        self.assertEqual(2, len(runs))
