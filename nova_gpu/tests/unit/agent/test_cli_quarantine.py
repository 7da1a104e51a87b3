"""``nova-gpu quarantine list|clear`` on the agent's health records."""

import json
import os

from nova_gpu.agent import health
from nova_gpu.core import health as core_health
from nova_gpu.tests.unit.agent import test_cli

GPU = '0000:86:00.0'


class QuarantineCliTest(test_cli.CliCase):

    def setUp(self):
        super().setUp()
        self.state = os.path.join(self.tmp, 'state')
        self.conf = self.write('nova-gpu.conf', '[gpu_agent]\nhost = cmp1\n'
                               'libvirt_retries = 1\nstate_dir = %s\n'
                               % self.state)
        store = health.HealthStore(self.state)

        def fail(healths):
            healths[GPU] = core_health.observe(
                core_health.Health(), core_health.Sample(
                    remap_failure=True, boot_id='b'), 1000.0)
        store.update(fail)

    def test_list_then_clear(self):
        out = self.run_cli('quarantine', 'list', '-f', 'json').stdout
        rows = json.loads(out)
        self.assertEqual([GPU], [r['ADDRESS'] for r in rows])
        self.assertEqual('yes', rows[0]['QUARANTINED'])
        self.assertEqual('row remapping failed', rows[0]['FAULT'])
        out = self.run_cli('quarantine', 'clear', GPU).stdout
        self.assertIn('GPU %s cleared' % GPU, out)
        self.assertIn('cleared by', out)
        self.assertEqual([], json.loads(self.run_cli(
            'quarantine', 'list', '-f', 'json').stdout))
        data = json.loads(self.run_cli('quarantine', 'list',
                                       '--json').stdout)
        self.assertFalse(data[GPU]['quarantined'])

    def test_unknown_gpu_is_a_one_line_error(self):
        proc = self.run_cli('quarantine', 'clear', '0000:ff:00.0', rc=1)
        self.assertOneLineError(proc, 'no health record', '0000:ff:00.0')
