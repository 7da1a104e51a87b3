"""Every receiver of host reports keeps the same one (issue 26, item 4).

The schedulers' view (``scheduler.hosts.Hosts``), the exporter
(``exporter.cloud.CloudState``) and the reclaimer
(``reclaim.inventory.ReportStore``) each hold the newest report of every
host. Which report replaces the one held is decided once, by
``core.report.replaces``: fed the same reports at the same times, the
three take and drop the same ones, and none adds a rule of its own.
"""

import fixtures
from oslo_config import cfg
from oslo_config import fixture as config_fixture
import testtools

from nova_gpu import conf  # noqa: F401  (registers the options)
from nova_gpu.core import report as report_mod
from nova_gpu.exporter import cloud
from nova_gpu.reclaim import planner_view as inventory
from nova_gpu.scheduler import hosts as hosts_mod
from nova_gpu.tests.unit.reclaim import fakes

RESET_AFTER = 60
HOST = 'h0'

# (seconds since the previous report, generation, boot_id, verdict)
SEQUENCE = [
    (0, 10, 'run-a', report_mod.FIRST),
    (5, 11, 'run-a', report_mod.NEWER),
    # The outbox resends the held report (its acknowledgement was lost).
    (5, 11, 'run-a', report_mod.DUPLICATE),
    # A late delivery from the same run.
    (5, 9, 'run-a', report_mod.OUT_OF_ORDER),
    # The agent restarted and counts from a low number.
    (5, 3, 'run-b', report_mod.NEW_RUN),
    # No boot_id (an older agent release): no proof of a new run.
    (5, 2, None, report_mod.OUT_OF_ORDER),
    (5, 4, None, report_mod.NEWER),
    (5, 4, None, report_mod.DUPLICATE),
    # Generations went back without a new boot_id: once the held report
    # is older than reset_after.
    (5, 1, None, report_mod.OUT_OF_ORDER),
    (RESET_AFTER + 1, 1, None, report_mod.RESET),
    # Another run, the same generation.
    (5, 1, 'run-c', report_mod.NEW_RUN),
    (5, 2, 'run-c', report_mod.NEWER),
    # A duplicate stays one however late it comes.
    (RESET_AFTER + 1, 2, 'run-c', report_mod.DUPLICATE),
    (5, 7, 'run-b', report_mod.NEWER),
]


class Clock:
    now = 1000.0

    def __call__(self):
        return self.now


def report(generation, boot_id):
    data = fakes.report(HOST, used=(0,), generation=generation)
    if boot_id is not None:
        data['boot_id'] = boot_id
    return data


class Receivers:
    """The three receivers, on one clock and one reset_after; ``ingest``
    says, for each, whether it took the report and what it holds then.
    """

    def __init__(self, test):
        test.useFixture(config_fixture.Config(cfg.CONF)).config(
            generation_reset_after=RESET_AFTER, group='gpu_scheduler')
        self.clock = Clock()
        self.scheduler = hosts_mod.Hosts(fakes.CATALOG, clock=self.clock)
        self.exporter = cloud.CloudState(fakes.CATALOG, clock=self.clock,
                                         reset_after=RESET_AFTER)
        self.reclaimer = inventory.ReportStore(
            fakes.CATALOG, reset_after=RESET_AFTER, clock=self.clock)

    def ingest(self, data):
        before = self.scheduler.get(HOST)
        scheduler = self.scheduler.ingest(data) is not before
        exporter = self.exporter.ingest_report(data) is not None
        reclaimer = self.reclaimer.ingest(data)
        return {'scheduler': (scheduler, self.held_by_scheduler()),
                'exporter': (exporter, self.held_by_exporter()),
                'reclaimer': (reclaimer, self.held_by_reclaimer())}

    def held_by_scheduler(self):
        entry = self.scheduler.get(HOST)
        return entry.generation, entry.boot_id

    def held_by_exporter(self):
        parsed = self.exporter.hosts()[HOST].report
        return parsed.generation, parsed.boot_id

    def held_by_reclaimer(self):
        raw = self.reclaimer.fresh(float('inf'))[HOST]
        return raw['generation'], raw.get('boot_id')


class SameReportEverywhereTest(testtools.TestCase):

    def test_every_receiver_keeps_the_same_report_each_step(self):
        receivers = Receivers(self)
        held = None
        for step, (wait, generation, boot_id, expected) in enumerate(
                SEQUENCE):
            receivers.clock.now += wait
            taken = expected in report_mod.REPLACING
            if taken:
                held = (generation, boot_id)
            want = dict.fromkeys(('scheduler', 'exporter', 'reclaimer'),
                                 (taken, held))
            self.assertEqual(
                want, receivers.ingest(report(generation, boot_id)),
                'step %d: report %d of %s (%s)' % (step, generation,
                                                   boot_id, expected))

    def test_the_sequence_is_the_core_rule(self):
        # The expectations above are the core's verdicts, step by step.
        clock, held, received = 1000.0, None, None
        for wait, generation, boot_id, expected in SEQUENCE:
            clock += wait
            new = report_mod.Header(2, HOST, HOST, generation, boot_id)
            verdict = report_mod.replaces(held, received, new, clock,
                                          RESET_AFTER)
            self.assertEqual(expected, verdict.name, verdict.reason)
            if verdict.replaces:
                held, received = new, clock


class EveryReceiverAsksTheCoreTest(testtools.TestCase):
    """Each receiver does what ``core.report.replaces`` says, and nothing
    else: with the rule turned around, so are the receivers.
    """

    def rule(self, name):
        calls = []

        def replaces(held, received, new, now, reset_after):
            calls.append((held.generation, new.generation, reset_after))
            return report_mod.Verdict(name, 'test')
        self.useFixture(fixtures.MonkeyPatch(
            'nova_gpu.core.report.replaces', replaces))
        return calls

    def test_a_newer_report_is_dropped_when_the_rule_says_so(self):
        receivers = Receivers(self)
        receivers.ingest(report(5, 'r'))
        calls = self.rule(report_mod.OUT_OF_ORDER)
        got = receivers.ingest(report(6, 'r'))
        self.assertEqual({'scheduler': (False, (5, 'r')),
                          'exporter': (False, (5, 'r')),
                          'reclaimer': (False, (5, 'r'))}, got)
        # Each asked it (the scheduler on the header, before reading the
        # report), with its own reset_after.
        self.assertEqual([(5, 6, RESET_AFTER)] * 3, calls)

    def test_a_stale_report_is_taken_when_the_rule_says_so(self):
        receivers = Receivers(self)
        receivers.ingest(report(5, 'r'))
        calls = self.rule(report_mod.RESET)
        got = receivers.ingest(report(4, 'r'))
        self.assertEqual({'scheduler': (True, (4, 'r')),
                          'exporter': (True, (4, 'r')),
                          'reclaimer': (True, (4, 'r'))}, got)
        # The scheduler asks again once the report is read (another one
        # may have come in meanwhile).
        self.assertEqual([(5, 4, RESET_AFTER)] * 4, calls)


class OneResetAfterTest(testtools.TestCase):
    """Every receiver's ``reset_after`` is the core's default, and each
    service passes its own ``generation_reset_after`` option.
    """

    def test_options_default_to_the_core_value(self):
        from nova_gpu.conf import exporter as exporter_conf
        from nova_gpu.conf import reclaim as reclaim_conf
        from nova_gpu.conf import scheduler as scheduler_conf
        for module in (exporter_conf, reclaim_conf, scheduler_conf):
            (opt,) = [o for o in module.opts
                      if o.name == 'generation_reset_after']
            self.assertEqual(report_mod.GENERATION_RESET_AFTER, opt.default,
                             module.__name__)

    def test_the_reclaimer_passes_its_option(self):
        # It used to pass [gpu_reclaimer] stale_after (180 s) where the
        # others pass 300 s: a late report was judged differently.
        from nova_gpu.reclaim import service
        from nova_gpu.tests.unit.reclaim import fakes as reclaim_fakes
        overrides = self.useFixture(config_fixture.Config(cfg.CONF))
        overrides.config(group='gpu_reclaimer', generation_reset_after=123,
                         stale_after=45)
        svc = service.ReclaimService(
            cfg.CONF, reclaim_fakes.FakeCompute([]),
            catalog=reclaim_fakes.CATALOG, notifier=object())
        self.assertEqual(123, svc.store.reset_after)
