import contextlib
import io
import os
import tempfile

import testtools

from nova_gpu.sim import cli
from nova_gpu.tests.unit.sim import test_trace


class CliTest(testtools.TestCase):

    def run_cli(self, *argv):
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = cli.main(list(argv))
        return rc, out.getvalue(), err.getvalue()

    def test_replay_writes_placements_that_pass_audit(self):
        tmp = self.useFixture_tempdir()
        placements = os.path.join(tmp, 'placements.csv')
        rc, out, _ = self.run_cli(
            '--nodes', test_trace.NODES, '--tasks', test_trace.TASKS,
            '--policies', 'fgd', '--seeds', '42', '--jobs', '1',
            '--placements-out', placements)
        self.assertEqual(0, rc)
        self.assertIn('fgd', out)
        rc, out, _ = self.run_cli('--nodes', test_trace.NODES, '--tasks',
                                  test_trace.TASKS, '--audit', placements)
        self.assertEqual(0, rc, out)
        self.assertIn('valid packing', out)

    def test_unknown_policy_is_a_clear_error(self):
        rc, _, err = self.run_cli('--nodes', test_trace.NODES, '--tasks',
                                  test_trace.TASKS, '--policies', 'nope')
        self.assertEqual(2, rc)
        self.assertIn("unknown policy 'nope'", err)

    def test_seed_ranges(self):
        self.assertEqual([42, 43, 44, 50], cli.parse_seeds('42-44,50'))

    def useFixture_tempdir(self):
        path = tempfile.mkdtemp()
        self.addCleanup(lambda: [os.unlink(os.path.join(path, f))
                                 for f in os.listdir(path)]
                        and os.rmdir(path))
        return path
