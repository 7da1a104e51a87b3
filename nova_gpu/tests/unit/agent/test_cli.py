"""The nova-gpu console script, run as an operator runs it.

Each test runs the installed ``nova-gpu`` script (a subprocess) against a
fake sysfs tree; libvirt is an unreachable socket, so nothing here needs
libvirtd (nova_gpu/tests/functional/agent/test_cli.py drives a real one).
"""

import json
import os
import subprocess
import sys
import tempfile

import testtools

from nova_gpu.tests.unit.agent import fakesys

UNREACHABLE = 'qemu+unix:///system?socket=/nonexistent/libvirt-sock'


def console_script():
    """The ``nova-gpu`` entry point of the environment running the tests."""
    script = os.path.join(os.path.dirname(sys.executable), 'nova-gpu')
    if os.path.exists(script):
        return [script]
    return [sys.executable, '-m', 'nova_gpu.agent.cli']  # pragma: no cover


class CliCase(testtools.TestCase):

    def setUp(self):
        super().setUp()
        self.tmp = tempfile.mkdtemp()
        self.addCleanup(subprocess.run, ['rm', '-rf', self.tmp])
        self.root = os.path.join(self.tmp, 'sys')
        self.fs = fakesys.FakeSysfs(self.root)
        self.fs.add_pci('0000:3b:00.0', '0x1eb8')
        self.fs.add_mdev_type('0000:3b:00.0', 'nvidia-222', 'GRID T4-1Q', 16)
        self.fs.add_pci('0000:86:00.0', '0x2330', numa_node=1)
        self.vfs = self.fs.add_vfs('0000:86:00.0', 2,
                                   {1062: 'NVIDIA H100-20C'})
        self.fs.set_vgpu_type(self.vfs[0], 1062)
        self.fs.add_pci('0000:c1:00.0', '0x26b9', driver='vfio-pci')
        self.conf = self.write('nova-gpu.conf', '[gpu_agent]\nhost = cmp1\n'
                               'libvirt_retries = 1\n')

    def write(self, name, text):
        path = os.path.join(self.tmp, name)
        with open(path, 'w') as f:
            f.write(text)
        return path

    def run_cli(self, *args, conf=None, root=None, rc=0):
        cmd = console_script() + [
            '--config-file', conf or self.conf, '--no-nvml',
            '--libvirt-uri', UNREACHABLE,
            '--sysfs-root', root or self.root] + list(args)
        proc = subprocess.run(cmd, capture_output=True, text=True,
                              timeout=120,
                              env=dict(os.environ, PYTHONWARNINGS='ignore'))
        self.assertEqual(rc, proc.returncode,
                         'stdout: %s\nstderr: %s' % (proc.stdout,
                                                     proc.stderr))
        return proc

    def assertOneLineError(self, proc, *expected):
        """The last stderr line is the error; no traceback anywhere."""
        lines = proc.stderr.strip().splitlines()
        self.assertTrue(lines, 'no error printed')
        self.assertTrue(lines[-1].startswith('nova-gpu: error: '),
                        proc.stderr)
        for text in expected:
            self.assertIn(text, lines[-1])
        self.assertNotIn('Traceback', proc.stderr)
        return lines[-1]


class TestErrors(CliCase):

    def test_missing_config_file(self):
        proc = self.run_cli('list', conf='/nonexistent/nova-gpu.conf', rc=1)
        self.assertOneLineError(proc, 'configuration file '
                                '/nonexistent/nova-gpu.conf does not exist')

    def test_bad_config_value_names_option_and_file(self):
        conf = self.write('bad.conf', '[gpu_agent]\nlibvirt_retries = abc\n')
        proc = self.run_cli('list', conf=conf, rc=1)
        line = self.assertOneLineError(proc, 'libvirt_retries', conf)
        self.assertNotIn('LocationInfo', line)

    def test_bad_catalog_file(self):
        catalog = self.write('catalog.yaml', 'models: [1\n')
        conf = self.write('cat.conf', '[gpu]\ncatalog_files = %s\n'
                          % catalog)
        proc = self.run_cli('list', conf=conf, rc=1)
        self.assertOneLineError(proc, catalog, 'not valid YAML')

    def test_debug_adds_the_traceback(self):
        proc = self.run_cli('--debug', 'list',
                            conf='/nonexistent/nova-gpu.conf', rc=1)
        self.assertIn('Traceback', proc.stderr)
        lines = proc.stderr.strip().splitlines()
        self.assertTrue(lines[-1].startswith('nova-gpu: error: '
                                             'configuration file '
                                             '/nonexistent/nova-gpu.conf'))

    def test_sysfs_root_that_does_not_exist(self):
        proc = self.run_cli('list', root='/nonexistent', rc=1)
        self.assertOneLineError(proc, 'sysfs root /nonexistent does not '
                                      'exist')
        self.assertEqual('', proc.stdout)

    def test_sysfs_root_without_pci_bus(self):
        proc = self.run_cli('list', root=self.tmp, rc=1)
        self.assertOneLineError(proc, 'has no PCI bus')

    def test_remove_vgpu_of_missing_vf(self):
        proc = self.run_cli('remove', 'vgpu', '0000:86:00.7', rc=1)
        self.assertOneLineError(proc, '0000:86:00.7', 'does not exist')

    def test_retries_are_quiet_and_the_error_comes_last(self):
        proc = self.run_cli('remove', 'vgpu', self.vfs[0], rc=1)
        self.assertOneLineError(proc, 'not reachable')
        self.assertNotIn('retrying', proc.stderr)
        proc = self.run_cli('--verbose', 'remove', 'vgpu', self.vfs[0],
                            rc=1)
        self.assertIn('retrying', proc.stderr)
        self.assertOneLineError(proc, 'not reachable')


class TestOutput(CliCase):

    def test_report_lists_every_provider(self):
        out = self.run_cli('report', '--providers').stdout
        rows = [[c.strip() for c in line.strip('|').split('|')]
                for line in out.splitlines() if line.startswith('|')]
        self.assertEqual(['GPU', 'PF', 'MODEL', 'KIND', 'PROVIDER',
                          'RESOURCE CLASS', 'VGPU TYPE', 'FUNCTION', 'VFS',
                          'MIG'], rows[0])
        self.assertEqual(
            [['0', '0000:3b:00.0', 'T4', 'pf_mdev', 'cmp1_pci_0000_3b_00_0',
              'VGPU', 'T4-1Q', '0000:3b:00.0', '-', '-'],
             ['1', '0000:86:00.0', 'H100-80GB', 'pci_pool',
              'cmp1_0000:86:00.0', 'CUSTOM_PCI_10DE_2330', 'H100-20C',
              '0000:86:00.0', '2', '-'],
             ['2', '0000:c1:00.0', 'L40S', 'pci_device',
              'cmp1_0000:C1:00.0', 'CUSTOM_PCI_10DE_26B9', '-',
              '0000:c1:00.0', '-', '-']], rows[1:])

    def test_report_providers_json(self):
        out = self.run_cli('--json', 'report', '--providers').stdout
        providers = json.loads(out)
        self.assertEqual(['cmp1_pci_0000_3b_00_0', 'cmp1_0000:86:00.0',
                          'cmp1_0000:C1:00.0'],
                         [p['name'] for p in providers])
        self.assertEqual(self.vfs, providers[1]['vfs'])
        self.assertEqual(1, providers[1]['gpu'])

    def test_report_json_by_default(self):
        report = json.loads(self.run_cli('report').stdout)
        self.assertEqual(['cmp1_pci_0000_3b_00_0', 'cmp1_0000:86:00.0',
                          'cmp1_0000:C1:00.0'],
                         [g['provider'] for g in report['gpus']])
        self.assertEqual([1, 1, 1],
                         [len(g['providers']) for g in report['gpus']])

    def test_mig_on_a_gpu_nvml_does_not_see(self):
        proc = self.run_cli('remove', 'mig', '0', '5', rc=1)
        self.assertOneLineError(proc, 'GPU 0 (0000:3b:00.0) is not seen by '
                                'NVML')

    def test_list_table(self):
        out = self.run_cli('list').stdout
        self.assertIn('| 0000:3b:00.0 | T4 ', out)
        self.assertIn('| 0000:c1:00.0 | L40S ', out)
        self.assertIn('vfio-pci', out)


class TestCliff(CliCase):
    """The commands are cliff's: formatters, help, entry points."""

    def test_formatters(self):
        rows = json.loads(self.run_cli('list', '-f', 'json').stdout)
        self.assertEqual(['0000:3b:00.0', '0000:86:00.0', '0000:c1:00.0'],
                         [r['ADDRESS'] for r in rows])
        self.assertEqual('vfio-pci', rows[2]['DRIVER'])
        out = self.run_cli('profiles', '-f', 'value', '-c', 'TYPE', '-c',
                           'FREE').stdout
        self.assertEqual(['nvidia-222 16', '1062 1'], out.splitlines())
        out = self.run_cli('report', '--providers', '-f', 'csv', '-c',
                           'PROVIDER').stdout
        self.assertEqual(['"PROVIDER"', '"cmp1_pci_0000_3b_00_0"',
                          '"cmp1_0000:86:00.0"', '"cmp1_0000:C1:00.0"'],
                         out.splitlines())

    def test_json_prints_the_whole_result(self):
        # --json: the GPUs of the host report, beyond the table's columns
        gpus = json.loads(self.run_cli('--json', 'list').stdout)
        self.assertEqual(['0000:3b:00.0', '0000:86:00.0', '0000:c1:00.0'],
                         [g['address'] for g in gpus])
        self.assertIn('providers', gpus[0])

    def test_config_files_in_order(self):
        # Each --config-file is read, the later one winning, by
        # oslo.config (not from the command line a second time).
        second = self.write('second.conf', '[gpu_agent]\nhost = cmp2\n')
        out = self.run_cli('--config-file', second, 'report',
                           '--providers', '-f', 'value', '-c',
                           'PROVIDER').stdout
        self.assertEqual(['cmp2_pci_0000_3b_00_0', 'cmp2_0000:86:00.0',
                          'cmp2_0000:C1:00.0'], out.splitlines())

    def test_help_lists_every_command(self):
        out = self.run_cli('--help').stdout
        for name in ('list', 'profiles', 'create mdev', 'create vgpu',
                     'create mig', 'remove mdev', 'remove vgpu',
                     'remove mig', 'attach', 'detach', 'reconcile',
                     'report'):
            self.assertIn('\n  %s ' % name, out)

    def test_usage_errors(self):
        proc = self.run_cli(rc=2)  # no command: no interactive shell
        self.assertIn('a command is required', proc.stderr)
        proc = self.run_cli('create', 'mig', '0', rc=2)
        self.assertIn('the following arguments are required: profile',
                      proc.stderr)
        proc = self.run_cli('destroy', rc=2)
        self.assertIn("'destroy' is not a nova-gpu command", proc.stdout)

    def test_unknown_column_is_one_line(self):
        proc = self.run_cli('list', '-c', 'NOPE', rc=1)
        self.assertOneLineError(proc, 'unknown column NOPE (the columns: '
                                'IDX, ADDRESS, MODEL')
        self.assertEqual('', proc.stdout)
        # One unknown among known ones is refused too, not dropped: the
        # fields of -f value would shift silently.
        proc = self.run_cli('profiles', '-f', 'value', '-c', 'TYPE', '-c',
                            'FRE', rc=1)
        self.assertOneLineError(proc, 'unknown column FRE')
        self.assertEqual('', proc.stdout)

    def test_short_debug_option(self):
        proc = self.run_cli('-d', 'remove', 'vgpu', '0000:86:00.7', rc=1)
        self.assertIn('Traceback', proc.stderr)
        self.assertTrue(proc.stderr.strip().splitlines()[-1].startswith(
            'nova-gpu: error: PCI device 0000:86:00.7 does not exist'))
