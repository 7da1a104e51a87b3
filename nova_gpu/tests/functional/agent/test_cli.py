"""The nova-gpu helper CLI, run as a command against the fake host."""

import json
import os
import subprocess
import sys

from nova_gpu.tests.functional.agent import test_mdev


class TestCli(test_mdev.MdevTestCase):

    def nova_gpu(self, *args, ok=True):
        cmd = [sys.executable, '-m', 'nova_gpu.agent.cli',
               '--libvirt-uri', self.host.uri,
               '--sysfs-root', self.fs.root] + list(args)
        # The intent journal in the test's own directory, not /var/lib
        # (oslo.config reads OS_<GROUP>__<OPTION> from the environment).
        state = os.path.join(self.fs.root, '..', 'agent-state')
        proc = subprocess.run(cmd, capture_output=True, text=True,
                              timeout=120,
                              env=dict(os.environ, PYTHONWARNINGS='ignore',
                                       OS_GPU_AGENT__STATE_DIR=state))
        if ok and proc.returncode:
            self.fail('%s failed: %s' % (' '.join(args), proc.stderr))
        if not ok:
            self.assertEqual(1, proc.returncode, proc.stdout)
            # one line, the last one, and no traceback
            self.assertNotIn('Traceback', proc.stderr)
            last = proc.stderr.strip().splitlines()[-1]
            self.assertTrue(last.startswith('nova-gpu: error: '),
                            proc.stderr)
            return last
        return proc.stdout

    def test_list_profiles_create_attach_remove(self):
        out = self.nova_gpu('list')
        self.assertIn('| 0000:3b:00.0 | T4 ', out)
        table = self.nova_gpu('report', '--providers')
        self.assertIn('| pf_mdev | %s_pci_0000_3b_00_0 | VGPU ' % (
            json.loads(self.nova_gpu('report'))['nodename']), table)
        profiles = json.loads(self.nova_gpu('--json', 'profiles', '0'))
        self.assertEqual({'nvidia-222': 16, 'nvidia-223': 8},
                         {p['type']: p['free'] for p in profiles})
        uuid = self.nova_gpu('create', 'mdev', '0000:3b:00.0',
                             'nvidia-222').strip()
        self.assertEqual([uuid], self.fs.mdevs())
        self.define_domain('vm1')
        self.assertIn('attached', self.nova_gpu('attach', 'vm1', '--mdev',
                                                uuid))
        self.assertIn(uuid, self.conn.lookupByName('vm1').XMLDesc(0))
        err = self.nova_gpu('remove', 'mdev', uuid, ok=False)
        self.assertIn('used by domain(s) vm1', err)
        self.nova_gpu('detach', 'vm1', '--mdev', uuid)
        self.assertNotIn(uuid, self.conn.lookupByName('vm1').XMLDesc(0))
        self.nova_gpu('remove', 'mdev', uuid)
        self.assertEqual([], self.fs.mdevs())
        report = json.loads(self.nova_gpu('report'))
        self.assertEqual(2, len(report['gpus']))

    def test_errors_are_clear(self):
        err = self.nova_gpu('create', 'mdev', '0000:3b:00.0', 'bogus',
                            ok=False)
        self.assertIn("nova-gpu: error: mdev type 'bogus' is not supported",
                      err)
        err = self.nova_gpu('attach', 'nope', '--mdev',
                            '4b20d080-1b54-4048-85b3-a6a62d165c01', ok=False)
        self.assertIn("no libvirt domain named 'nope'", err)

    def test_remove_vgpu_of_missing_vf(self):
        # was: FileNotFoundError and a traceback
        err = self.nova_gpu('remove', 'vgpu', '0000:3b:00.7', ok=False)
        self.assertIn('0000:3b:00.7', err)
        self.assertIn('does not exist', err)
