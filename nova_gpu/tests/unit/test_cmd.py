"""nova-gpu's services start in native threading and never import eventlet.

Nova 34 runs its services in native threading (``nova/cmd``); nova-gpu's
own (agent, restore, qemu hook, CLI, exporter, reclaimer, defrag) start
from ``nova_gpu.cmd``, whose ``native_threading`` sets oslo.service's
threading backend and refuses eventlet before anything else is imported.
nova-gpu-scheduler runs Nova's own scheduler main, which chooses the mode
as Nova does (``nova.monkey_patch``): threading unless asked otherwise.
"""

import configparser
import os
import subprocess
import sys

import testtools

from nova_gpu import tests

ROOT = tests.REPO_ROOT
SERVICES = ('nova-gpu-agent', 'nova-gpu-restore', 'nova-gpu-qemu-hook',
            'nova-gpu', 'nova-gpu-exporter', 'nova-gpu-reclaimer',
            'nova-gpu-defrag')


def console_scripts():
    """{script: 'module:function'} of setup.cfg."""
    parser = configparser.ConfigParser()
    parser.read(os.path.join(ROOT, 'setup.cfg'))
    lines = parser['entry_points']['console_scripts'].strip().splitlines()
    return dict((part.strip() for part in line.split('=', 1))
                for line in lines if '=' in line)


class NoEventletTest(testtools.TestCase):

    def test_every_entry_point_is_in_nova_gpu_cmd(self):
        scripts = console_scripts()
        self.assertEqual([], ['%s = %s' % item for item in sorted(
            scripts.items()) if not item[1].startswith('nova_gpu.cmd.')])

    def test_services_start_in_nova_gpu_cmd(self):
        scripts = console_scripts()
        for name in SERVICES:
            self.assertTrue(scripts[name].startswith('nova_gpu.cmd.'),
                            '%s = %s' % (name, scripts[name]))

    def test_no_eventlet_and_threading_backend(self):
        scripts = console_scripts()
        modules = sorted({scripts[n].split(':')[0] for n in SERVICES})
        code = '\n'.join(
            ['import sys'] +
            ['import %s' % m for m in modules] +
            ['import oslo_messaging, oslo_privsep.daemon',
             'from oslo_service import backend',
             'print(sorted(m for m in sys.modules',
             '             if m.split(".")[0] == "eventlet"))',
             'print(backend.get_backend_type().value)'])
        proc = subprocess.run([sys.executable, '-c', code],
                              capture_output=True, text=True, timeout=120)
        self.assertEqual(0, proc.returncode, proc.stderr)
        self.assertEqual(['[]', 'threading'], proc.stdout.split())

    def test_a_process_running_eventlet_is_left_alone(self):
        code = ('import eventlet, sys\n'
                'from nova_gpu.cmd import native_threading as cmd\n'
                'print(cmd.forbid_eventlet())\n'
                'import eventlet.green.socket\n')
        proc = subprocess.run([sys.executable, '-c', code],
                              capture_output=True, text=True, timeout=120)
        self.assertEqual(0, proc.returncode, proc.stderr)
        self.assertEqual('False', proc.stdout.strip())
