"""The select_destinations bench's arguments and plan (no Nova needed)."""

import unittest

from nova_gpu.bench import select_destinations as bench


class TestPlan(unittest.TestCase):

    def test_quick_is_one_path_one_size(self):
        args = bench.parse_args(['--quick'])
        self.assertEqual([('vgpu-vf', 1000)], bench.plan(args))
        self.assertEqual(bench.QUICK['requests'], args.requests)

    def test_full_is_every_path_at_both_sizes(self):
        args = bench.parse_args([])
        self.assertEqual(
            [(p, n) for n in bench.HOSTS for p in bench.PATHS],
            bench.plan(args))
        self.assertEqual(bench.FULL['threads'], args.threads)

    def test_paths_and_hosts_given(self):
        args = bench.parse_args(['--paths', 'vgpu-pf', '--hosts', '10',
                                 '20', '--requests', '3'])
        self.assertEqual([('vgpu-pf', 10), ('vgpu-pf', 20)],
                         bench.plan(args))
        self.assertEqual(3, args.requests)

    def test_configs_always_with_stock(self):
        self.assertEqual(bench.CONFIGS, bench.parse_args([]).configs)
        self.assertEqual(('stock', 'plugin'), bench.parse_args(
            ['--configs', 'plugin']).configs)
        with self.assertRaises(SystemExit):
            bench.parse_args(['--configs', 'plugin,large'])

    def test_unknown_path_refused(self):
        with self.assertRaises(SystemExit):
            bench.parse_args(['--paths', 'pci-pools'])

    def test_every_path_of_the_issue_is_built(self):
        # Issue #26: VGPU providers per GPU or VF, PCI pools, passthrough.
        self.assertEqual(['vgpu-vf', 'vgpu-pf', 'pci-pool', 'passthrough'],
                         list(bench.PATHS))
        self.assertEqual(['pci-pool', 'passthrough'], [
            p for p, v in bench.PATHS.items() if v[3] in bench.PCI_PATHS])

    def test_percentile(self):
        self.assertEqual(9, bench._percentile(range(10), 0.9))
