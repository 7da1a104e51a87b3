"""The equal-size against mixed-size vGPU comparison (sim.mixed_size)."""

import io
import os
import tempfile
from unittest import mock

import testtools

from nova_gpu.core import catalog as catalog_mod
from nova_gpu.sim import mixed_size

L40S = catalog_mod.load_catalog().model('L40S')
HEADER = 'name,num_gpu,gpu_milli,creation_time,deletion_time\n'


class MixedSizeSimTest(testtools.TestCase):

    def p(self, name):
        return L40S.vgpu_profile(name)

    def test_mixed_sizes_share_a_gpu(self):
        reqs = [(0, None, self.p('L40S-24C')), (1, None, self.p('L40S-4C'))]
        equal = mixed_size.replay(L40S, 1, reqs, 'equal-size')
        mixed = mixed_size.replay(L40S, 1, reqs, 'mixed-size')
        self.assertEqual(1, equal['refused'])
        self.assertEqual(0.5, equal['alloc_at_first_fail'])
        self.assertEqual(0, mixed['refused'])

    def test_departures_free_placements(self):
        reqs = [(0, 5, self.p('L40S-48C')), (6, None, self.p('L40S-4C'))]
        for mode in mixed_size.MODES:
            self.assertEqual(0, mixed_size.replay(L40S, 1, reqs,
                                                  mode)['refused'], mode)

    def test_requests_from_shares(self):
        rows = [{'num_gpu': '1', 'gpu_milli': '250', 'creation_time': '3',
                 'deletion_time': '9'},
                {'num_gpu': '1', 'gpu_milli': '1000', 'creation_time': '1',
                 'deletion_time': ''},
                {'num_gpu': '2', 'gpu_milli': '500', 'creation_time': '1',
                 'deletion_time': ''},
                {'num_gpu': '1', 'gpu_milli': '90', 'creation_time': '1',
                 'deletion_time': ''}]
        got = mixed_size.vgpu_requests(rows, L40S)
        self.assertEqual([(1, None, 'L40S-6C'), (3, 9, 'L40S-12C')],
                         [(a, b, p.name) for a, b, p in got])

    def write(self, text):
        fd, path = tempfile.mkstemp(suffix='.csv')
        self.addCleanup(os.unlink, path)
        with os.fdopen(fd, 'w') as f:
            f.write(text)
        return path

    def test_cli_table(self):
        path = self.write(HEADER + 't0,1,500,0,\nt1,1,100,1,\n')
        out = io.StringIO()
        with mock.patch('sys.stdout', out):
            rc = mixed_size.main(['--gpus', '1', '--tasks', path,
                                  '--seeds', '7'])
        self.assertEqual(0, rc)
        self.assertIn('| trace | equal-size | 2 | 50.0% | 50.0% |',
                      out.getvalue())
        self.assertIn('| trace | mixed-size | 2 | 0.0% | none failed |',
                      out.getvalue())

    def test_cli_bad_input_named(self):
        path = self.write(HEADER + 't0,1,500,0,\n')
        for argv, word in ((['--model', 'T4'], 'no mixed-size vGPU mode'),
                           (['--gpus', '0'], '--gpus'),
                           (['--model', 'NOPE'], 'NOPE')):
            err = io.StringIO()
            with mock.patch('sys.stderr', err):
                rc = mixed_size.main(argv + ['--tasks', path])
            self.assertEqual(2, rc, argv)
            self.assertIn(word, err.getvalue())
        bad = self.write(HEADER + 't0,1,half,0,\n')
        err = io.StringIO()
        with mock.patch('sys.stderr', err):
            self.assertEqual(2, mixed_size.main(['--tasks', bad]))
        self.assertIn('half', err.getvalue())
