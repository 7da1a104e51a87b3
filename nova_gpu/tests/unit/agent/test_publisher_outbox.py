"""The report outbox: a report is queued whole or not at all.

Each report is written by ``nova_gpu.atomic_file`` (durable: see
nova_gpu/tests/unit/test_atomic_file.py); here, what the outbox's reader sees:
a
report being written is not pending yet, and a cut-short report left by an
older agent is dropped instead of holding back every later one.
"""

import os

import fixtures
from oslo_config import cfg
import testtools

from nova_gpu.agent import publisher


class OutboxTest(testtools.TestCase):

    def setUp(self):
        super().setUp()
        self.conf = cfg.ConfigOpts()
        self.conf([], project='nova-gpu-test')
        self.outbox = self.useFixture(fixtures.TempDir()).path
        self.sent = []
        self.pub = publisher.ReportPublisher(
            self.conf, 'gpu_reports_test', self.outbox, url='fake:/')
        self.pub.transport._send_notification = self.send
        self.addCleanup(self.pub.close)
        self.log = self.useFixture(fixtures.FakeLogger())

    def send(self, target, ctxt, message, version, retry=None):
        self.sent.append(message['payload'])

    def test_a_report_being_written_is_not_pending(self):
        seen = []

        def spy(real):
            def renaming(src, dst, **kw):
                seen.append(self.pub.pending())
                return real(src, dst, **kw)
            return renaming
        for name in ('rename', 'replace'):
            self.useFixture(fixtures.MonkeyPatch(
                'os.' + name, spy(getattr(os, name))))
        self.assertEqual(0, self.pub.publish({'generation': 1}))
        self.assertEqual([[]], seen)
        self.assertEqual([{'generation': 1}], self.sent)

    def test_a_cut_short_report_is_dropped(self):
        # what an agent without durable writes could leave after a power
        # cut: the name on disk, the content not
        for name, content in (('00000000000000000001-dead0001.json', ''),
                              ('00000000000000000002-dead0002.json',
                               '{"generation": 2, "gp')):
            with open(os.path.join(self.outbox, name), 'w') as f:
                f.write(content)
        self.assertEqual(0, self.pub.publish({'generation': 3}))
        self.assertEqual([{'generation': 3}], self.sent)
        self.assertEqual([], os.listdir(self.outbox))
        self.assertEqual(2, self.log.output.count(
            'dropping unreadable GPU report'))
