"""nova-gpu-scheduler: Nova's scheduler service with nova-gpu's manager.

The Nova methods ``GpuSchedulerManager`` overrides take what they took on
the Nova releases they were checked on (``manager.NOVA_METHODS``): a
change in the installed Nova fails here. The entry point runs Nova's own
scheduler main with the manager, and Nova chooses the concurrency mode.
"""

import os
import subprocess
import sys

from nova.scheduler import manager as nova_manager
import testtools

from nova_gpu.scheduler import manager
from nova_gpu.tests.unit import test_cmd

console_scripts = test_cmd.console_scripts


class NovaMethodsTest(testtools.TestCase):

    def test_overridden_methods_take_what_they_were_checked_on(self):
        for name, params in manager.NOVA_METHODS.items():
            self.assertEqual(params, manager.nova_method_params(name), name)

    def test_every_override_is_listed(self):
        overridden = {name for name, value in
                      vars(manager.GpuSchedulerManager).items()
                      if callable(value) and not name.startswith('__')
                      and hasattr(nova_manager.SchedulerManager, name)}
        self.assertEqual(set(manager.NOVA_METHODS), overridden)

    def test_parameters_read_under_decorators(self):
        # select_destinations sits under oslo.messaging's
        # expected_exceptions, which keeps no __wrapped__.
        self.assertEqual('inner', nova_manager.SchedulerManager
                         .select_destinations.__name__)
        self.assertIn('spec_obj',
                      manager.nova_method_params('select_destinations'))


class SchedulerEntryPointTest(testtools.TestCase):
    """nova-gpu-scheduler is Nova's scheduler main with nova-gpu's manager,
    and Nova, not nova-gpu, chooses its concurrency mode.
    """

    def run_code(self, code, **env):
        proc = subprocess.run([sys.executable, '-c', code],
                              capture_output=True, text=True, timeout=120,
                              env=dict(os.environ, **env))
        self.assertEqual(0, proc.returncode, proc.stderr)
        return proc.stdout.split()

    def test_the_entry_point(self):
        self.assertEqual('nova_gpu.cmd.scheduler:main',
                         console_scripts()['nova-gpu-scheduler'])

    def test_manager_named_for_nova_scheduler(self):
        out = self.run_code(
            'from nova_gpu.cmd import scheduler\n'
            'from nova import service\n'
            'scheduler.manager.use_in_nova_scheduler()\n'
            'print(service.SERVICE_MANAGERS["nova-scheduler"])\n'
            'from oslo_utils import importutils\n'
            'cls = importutils.import_class(\n'
            '    service.SERVICE_MANAGERS["nova-scheduler"])\n'
            'from nova.scheduler import manager\n'
            'print(issubclass(cls, manager.SchedulerManager))\n',
            OS_NOVA_DISABLE_EVENTLET_PATCHING='')
        self.assertEqual(
            ['nova_gpu.scheduler.manager.GpuSchedulerManager', 'True'], out)

    def test_nova_chooses_the_mode(self):
        code = ('import sys\n'
                'from nova_gpu.cmd import scheduler\n'
                'print("eventlet" in sys.modules)\n')
        self.assertEqual(['False'], self.run_code(
            code, OS_NOVA_DISABLE_EVENTLET_PATCHING='true'))
        # Eventlet mode, deprecated but Nova's to choose: not refused.
        self.assertEqual(['True'], self.run_code(
            code, OS_NOVA_DISABLE_EVENTLET_PATCHING='false'))
