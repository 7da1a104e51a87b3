"""The one rule of which host report a receiver keeps (issue 26, item 4):
``core.report.replaces``.
"""

import types

import testtools

from nova_gpu.core import catalog as catalog_mod
from nova_gpu.core import fixtures
from nova_gpu.core import report

RESET_AFTER = 300
T0 = 1000.0


def header(generation, boot_id=None):
    return report.Header(2, 'c1', 'c1', generation, boot_id)


class ReplacesTest(testtools.TestCase):

    def verdict(self, held, new, age=10.0, reset_after=RESET_AFTER):
        """``new`` against ``held`` received ``age`` seconds ago."""
        return report.replaces(held, T0, new, T0 + age, reset_after)

    def assertVerdict(self, name, verdict):
        self.assertEqual(name, verdict.name, verdict.reason)
        self.assertEqual(name in (report.FIRST, report.NEWER,
                                  report.NEW_RUN, report.RESET),
                         verdict.replaces)

    def test_first_report_is_taken(self):
        self.assertVerdict(report.FIRST,
                           report.replaces(None, None, header(7, 'a'), T0,
                                           RESET_AFTER))

    def test_higher_generation_is_taken_whatever_its_run(self):
        for boot_id in ('a', 'b', None):
            self.assertVerdict(report.NEWER, self.verdict(
                header(7, 'a'), header(8, boot_id)))
        self.assertVerdict(report.NEWER, self.verdict(header(7),
                                                      header(8)))
        # Not a generation going back: nothing to warn of.
        self.assertFalse(self.verdict(header(7, 'a'),
                                      header(8, 'b')).went_back)

    def test_agent_restart_counting_from_low_is_taken_at_once(self):
        verdict = self.verdict(header(10 ** 12, 'run-1'), header(3, 'run-2'))
        self.assertVerdict(report.NEW_RUN, verdict)
        self.assertTrue(verdict.went_back)
        self.assertIn('new agent run (boot_id run-2, was run-1)',
                      verdict.reason)
        # The same generation from another run is another report too.
        self.assertVerdict(report.NEW_RUN, self.verdict(
            header(3, 'run-1'), header(3, 'run-2')))

    def test_agent_upgraded_to_boot_ids_is_a_new_run(self):
        # The held report comes from a release without boot_id.
        self.assertVerdict(report.NEW_RUN, self.verdict(header(50),
                                                        header(1, 'r')))

    def test_stale_replay_from_the_same_run_is_ignored(self):
        verdict = self.verdict(header(9, 'run-1'), header(8, 'run-1'))
        self.assertVerdict(report.OUT_OF_ORDER, verdict)
        self.assertFalse(verdict.went_back)
        self.assertIn('older than the one held (9)', verdict.reason)

    def test_exact_duplicate_is_ignored(self):
        # The outbox resending after a lost acknowledgement: the report
        # held, again. Ignored even once the held one is old, and without
        # boot_ids alike.
        for age in (0.0, 10.0, RESET_AFTER + 1, 10 * RESET_AFTER):
            self.assertVerdict(report.DUPLICATE, self.verdict(
                header(9, 'run-1'), header(9, 'run-1'), age))
            self.assertVerdict(report.DUPLICATE, self.verdict(
                header(9), header(9), age))
            # Without a boot_id nothing says it is from another run.
            self.assertVerdict(report.DUPLICATE, self.verdict(
                header(9, 'run-1'), header(9), age))

    def test_report_without_boot_id_is_judged_by_its_generation(self):
        # An old agent release (or a version 1 report): a missing boot_id
        # is no new run, or every late delivery of such an agent would
        # replace the newer report.
        self.assertVerdict(report.OUT_OF_ORDER, self.verdict(
            header(9, 'run-1'), header(8)))
        self.assertVerdict(report.OUT_OF_ORDER, self.verdict(header(9),
                                                             header(8)))
        self.assertVerdict(report.NEWER, self.verdict(header(9, 'run-1'),
                                                      header(10)))

    def test_lower_generation_taken_once_the_held_one_is_old(self):
        # The agent's generations went back (clock set back, or restarted
        # without boot_id support): not before reset_after seconds.
        held = header(10 ** 12)
        self.assertVerdict(report.OUT_OF_ORDER, self.verdict(
            held, header(5), age=RESET_AFTER))
        verdict = self.verdict(held, header(5), age=RESET_AFTER + 0.5)
        self.assertVerdict(report.RESET, verdict)
        self.assertTrue(verdict.went_back)
        self.assertIn('arrived 300 s ago, more than 300 s', verdict.reason)
        # The same within a run.
        self.assertVerdict(report.RESET, self.verdict(
            header(9, 'r'), header(2, 'r'), age=RESET_AFTER + 1))
        # reset_after is the receiver's own.
        self.assertVerdict(report.RESET, self.verdict(
            header(9, 'r'), header(2, 'r'), age=61, reset_after=60))

    def test_takes_any_object_with_generation_and_boot_id(self):
        catalog = catalog_mod.load_catalog()
        host = fixtures.hgx_host('c1', catalog.model('A100-40GB'), gpus=1)
        parsed = report.parse(report.host_to_dict(host, generation=4,
                                                  boot_id='r'), catalog)
        entry = types.SimpleNamespace(generation=5, boot_id='r')
        self.assertVerdict(report.OUT_OF_ORDER, self.verdict(entry, parsed))
        self.assertVerdict(report.NEWER, self.verdict(parsed, entry))
        self.assertVerdict(report.DUPLICATE, self.verdict(
            parsed, report.parse_header(report.host_to_dict(
                host, generation=4, boot_id='r'))))
