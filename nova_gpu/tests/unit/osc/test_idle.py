"""``openstack gpu idle`` on the exporter's /v1/idle."""

import io
import json
import types

import testtools

from nova_gpu.osc import idle

ROWS = [
    {'host': 'gpu-1', 'gpu': 0, 'address': '0000:07:00.0',
     'device': '0000:07:00.0/mig@0', 'server_id': 'srv-1',
     'model': 'A100-40GB', 'kind': 'mig', 'profile': 'A100-3-20C',
     'since': '2025-01-01T00:00:00+00:00', 'seconds': 1900.1234,
     'peak_compute': 0.0123456, 'peak_memory_mib': 3000.0,
     'suggestion': '1g.5gb'},
    {'host': 'gpu-2', 'gpu': 1, 'address': '0000:3b:00.0',
     'device': 'c0ffee00-0000-4000-8000-000000000002', 'server_id': 'srv-2',
     'model': 'L4', 'kind': 'vgpu', 'profile': 'L4-12C',
     'since': '2025-01-01T00:00:00+00:00', 'seconds': 7200.0,
     'peak_compute': 0.0, 'peak_memory_mib': None, 'suggestion': None}]


class FakeClient:
    def idle(self):
        return [dict(r) for r in ROWS]


class IdleCommandTest(testtools.TestCase):

    def setUp(self):
        super().setUp()
        self.app = types.SimpleNamespace(
            client_manager=types.SimpleNamespace(gpu=FakeClient()),
            stdout=io.StringIO(), stderr=io.StringIO(), options=None)

    def run_cmd(self, *argv):
        cmd = idle.Idle(self.app, None)
        parsed = cmd.get_parser('openstack gpu idle').parse_args(list(argv))
        return cmd, parsed, cmd.take_action(parsed)

    def test_longest_idle_first(self):
        _c, _p, (columns, rows) = self.run_cmd()
        self.assertEqual('Suggestion', columns[9])
        self.assertEqual(['srv-2', 'srv-1'], [r[1] for r in rows])
        self.assertEqual(('gpu-1', 'srv-1', 'A100-40GB', 'mig', 'A100-3-20C',
                          1900.123, '2025-01-01T00:00:00+00:00', 0.012,
                          3000.0, '1g.5gb', '0000:07:00.0/mig@0'), rows[1])

    def test_filters(self):
        _c, _p, (_cols, rows) = self.run_cmd('--host', 'gpu-1')
        self.assertEqual(['srv-1'], [r[1] for r in rows])
        _c, _p, (_cols, rows) = self.run_cmd('--model', 'L4')
        self.assertEqual(['srv-2'], [r[1] for r in rows])
        _c, _p, (_cols, rows) = self.run_cmd('--min-seconds', '3600')
        self.assertEqual(['srv-2'], [r[1] for r in rows])

    def test_json_output(self):
        cmd, parsed, _r = self.run_cmd('-f', 'json')
        cmd.run(parsed)
        out = json.loads(self.app.stdout.getvalue())
        self.assertEqual([None, '1g.5gb'], [r['Suggestion'] for r in out])
