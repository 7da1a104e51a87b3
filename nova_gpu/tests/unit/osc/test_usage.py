"""``openstack gpu usage`` against a running exporter API."""

import io
import json
import types

from osc_lib import exceptions
import prometheus_client
import testtools

from nova_gpu.exporter import api
from nova_gpu.exporter import cloud
from nova_gpu.exporter import usage as exporter_usage
from nova_gpu.osc import client as client_mod
from nova_gpu.osc import usage
from nova_gpu.tests.unit.exporter import test_cloud
from nova_gpu.tests.unit.exporter import test_usage as exporter_test

S1 = exporter_test.S1
T0 = 1735689600.0  # 2025-01-01T00:00:00Z


class UsageCommandTest(testtools.TestCase):

    def setUp(self):
        super().setUp()
        self.clock = test_cloud.Clock()
        state = cloud.CloudState(test_cloud.CATALOG, clock=self.clock)
        self.book = exporter_usage.UsageBook(
            projects=exporter_test.Projects({S1: 'project-a'}),
            clock=self.clock)
        state.report_observers.append(self.book.observe)
        for n, (t, held) in enumerate(((T0, True), (T0 + 3600, True),
                                       (T0 + 3660, False))):
            self.clock.now = t
            state.ingest_report(exporter_test.report(n + 1, held))
        self.book.write()
        server = api.HttpServer(
            api.Api(state, prometheus_client.CollectorRegistry(), 180,
                    usage=self.book), '127.0.0.1', 0)
        self.addCleanup(server.stop)
        self.app = types.SimpleNamespace(
            client_manager=types.SimpleNamespace(
                gpu=client_mod.ExporterClient(
                    'http://127.0.0.1:%d/' % server.port)),
            stdout=io.StringIO(), stderr=io.StringIO(), options=None)

    def run_cmd(self, *argv):
        cmd = usage.Usage(self.app, None)
        parsed = cmd.get_parser('openstack gpu usage').parse_args(
            list(argv))
        return cmd, parsed, cmd.take_action(parsed)

    def test_rows_per_server_model_and_profile(self):
        _c, _p, (columns, rows) = self.run_cmd(
            '--project', 'project-a', '--start', '2025-01-01T00:30:00Z',
            '--end', '2025-01-01T02:30:00+01:00')
        self.assertEqual(['Project', 'Server', 'Model', 'Profile',
                          'Seconds', 'GPU Seconds', 'FB GiB Seconds',
                          'First', 'Last'], columns)
        # 00:30 .. 01:30 UTC of the time it was counted (00:00 .. 01:01:
        # until the report that no longer shows it)
        self.assertEqual([('project-a', S1, 'L4', 'L4-6C', 1860.0, 465.0,
                           11160.0, '2025-01-01T00:30:00+00:00',
                           '2025-01-01T01:01:00+00:00')], rows)

    def test_json_output(self):
        cmd, parsed, _r = self.run_cmd('--start', '2025-01-01', '-f', 'json')
        cmd.run(parsed)
        (row,) = json.loads(self.app.stdout.getvalue())
        self.assertEqual({'Project': 'project-a', 'Server': S1,
                          'Model': 'L4', 'Profile': 'L4-6C',
                          'Seconds': 3660.0, 'GPU Seconds': 915.0,
                          'FB GiB Seconds': 21960.0,
                          'First': '2025-01-01T00:00:00+00:00',
                          'Last': '2025-01-01T01:01:00+00:00'}, row)

    def test_other_project_has_none(self):
        _c, _p, (_columns, rows) = self.run_cmd(
            '--project', 'project-b', '--start', '2025-01-01')
        self.assertEqual([], rows)

    def test_bad_input(self):
        e = self.assertRaises(exceptions.CommandError, self.run_cmd,
                              '--start', 'last tuesday')
        self.assertIn("--start 'last tuesday': not an ISO 8601 time",
                      str(e))
        e = self.assertRaises(exceptions.CommandError, self.run_cmd,
                              '--start', '2025-01-02', '--end', '2025-01-01')
        self.assertIn('is not after --start', str(e))
        self.assertRaises(SystemExit, self.run_cmd, '--project', 'p')

    def test_exporter_refusal_is_a_command_error(self):
        # what an exporter says of a query it refuses reaches the user
        e = self.assertRaises(
            exceptions.CommandError, self.app.client_manager.gpu.usage,
            'not-a-time')
        self.assertIn('HTTP 400', str(e))
        self.assertIn('not an ISO 8601 time', str(e))
