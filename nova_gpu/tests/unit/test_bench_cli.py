"""Every benchmark entry point refuses bad arguments by name and runs
what it was asked to run."""

import contextlib
import io
from unittest import mock

import testtools

from nova_gpu.bench import __main__ as bench_main
from nova_gpu.bench import agent_bench
from nova_gpu.bench import core_bench
from nova_gpu.bench import reliability
from nova_gpu.bench import scheduler_cost


class BadArgumentsTest(testtools.TestCase):

    def _refused(self, main, argv):
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            e = self.assertRaises(SystemExit, main, argv)
        self.assertEqual(2, e.code)
        return err.getvalue()

    def test_scheduler_cost_names_the_bad_size(self):
        for bad in ('--help-me', 'lots', '0', '-5'):
            err = self._refused(scheduler_cost.main, [bad])
            self.assertIn('usage: python -m nova_gpu.bench.scheduler_cost',
                          err)
        self.assertIn("positive integer, not 'lots'",
                      self._refused(scheduler_cost.main, ['lots']))

    def test_unknown_options_are_refused(self):
        for main in (agent_bench.main, core_bench.main, reliability.main,
                     scheduler_cost.main, bench_main.main):
            self.assertIn('unrecognized arguments: --bogus',
                          self._refused(main, ['--bogus']))

    def test_reliability_names_an_unknown_part(self):
        err = self._refused(reliability.main, ['specs', 'speks'])
        self.assertIn('no such part: speks', err)

    def test_bench_names_an_unknown_module(self):
        err = self._refused(bench_main.main, ['--only', 'sim_bench,simbench'])
        self.assertIn('no such benchmark: simbench', err)

    def test_core_bench_number_is_checked(self):
        self.assertIn('at least 10',
                      self._refused(core_bench.main, ['--number', '3']))


class DispatchTest(testtools.TestCase):

    def test_scheduler_cost_sizes_and_flags(self):
        with mock.patch.object(scheduler_cost, 'run') as run, \
                mock.patch.object(scheduler_cost, 'CLOCK'):
            self.assertEqual(0, scheduler_cost.main(
                ['--cpu', '--no-in-tree', '100', '200']))
            run.assert_called_once_with((100, 200), in_tree=False)
            self.assertIs(scheduler_cost.time.process_time,
                          scheduler_cost.CLOCK)
            run.reset_mock()
            scheduler_cost.main([])
            run.assert_called_once_with((1000, 10000), in_tree=True)

    def test_reliability_runs_all_parts_or_those_named(self):
        with mock.patch.object(reliability, 'run',
                               return_value=True) as run:
            self.assertEqual(0, reliability.main([]))
            run.assert_called_once_with(quick=False, parts=[])
            run.reset_mock()
            run.return_value = False
            self.assertEqual(1, reliability.main(['boots', '--quick']))
            run.assert_called_once_with(quick=True, parts=['boots'])

    def test_one_part_alone_fails_on_a_missed_bound(self):
        fig = reliability.Figure
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            self.assertEqual(0, reliability.part_main(
                'specs', lambda quick: [fig('specs', 'x', 0, '0', True)], []))
            self.assertEqual(1, reliability.part_main(
                'specs', lambda quick: [fig('specs', 'x', 1, '0', False)],
                ['--quick']))
        self.assertIn('| specs | x      |     1 | 0      | NO |',
                      out.getvalue())
