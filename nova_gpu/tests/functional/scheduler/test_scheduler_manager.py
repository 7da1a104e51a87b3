"""nova-gpu-scheduler: Nova's scheduler service with nova-gpu's manager.

The Nova methods ``GpuSchedulerManager`` overrides take what they took on
the Nova releases they were checked on (``manager.NOVA_METHODS``): a
change in the installed Nova fails here. The entry point runs Nova's own
scheduler main with the manager, and Nova chooses the concurrency mode.
"""

import os
import subprocess
import sys

import fixtures
from nova.scheduler import manager as nova_manager
from oslo_utils.fixture import uuidsentinel as uuids
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


class RetryWindowTest(testtools.TestCase):
    """Lost claims are scheduled again within ``claim_retry_seconds`` per
    instance of the request (``GpuSchedulerManager._schedule_again``).
    """

    def setUp(self):
        super().setUp()
        from nova import exception
        from nova import objects
        from oslo_config import fixture as config_fixture

        from nova_gpu import conf  # noqa: F401
        objects.register_all()
        self.conf = self.useFixture(config_fixture.Config())
        self.conf.config(claim_retries=10, claim_retry_seconds=10.0,
                         group='gpu_scheduler')
        self.objects, self.exception = objects, exception
        self.clock = [0.0]
        self.useFixture(fixtures.MonkeyPatch(
            'nova_gpu.scheduler.manager.time.monotonic',
            lambda: self.clock[0]))
        self.useFixture(fixtures.MonkeyPatch(
            'nova_gpu.scheduler.manager.time.sleep', lambda s: None))
        self.useFixture(fixtures.MonkeyPatch(
            'nova_gpu.scheduler.manager.RETRY_WAIT', 0.0))
        # Every attempt had a host whose claim Placement refused.
        self.useFixture(fixtures.MonkeyPatch(
            'nova_gpu.scheduler.filters.claims_lost', lambda spec: True))
        self.manager = manager.GpuSchedulerManager.__new__(
            manager.GpuSchedulerManager)
        self.manager.claim_retries = {'retried': 0, 'gave_up': 0}

    def attempts(self, num_instances, seconds_each):
        spec = self.objects.RequestSpec(num_instances=num_instances,
                                        instance_uuid=uuids.instance,
                                        instance_group=None)
        calls = []

        def select(spec_obj):
            calls.append(spec_obj)
            self.clock[0] += seconds_each
            raise self.exception.NoValidHost(reason='claims lost')
        self.assertRaises(self.exception.NoValidHost,
                          self.manager._schedule_again, select, spec)
        return len(calls)

    def test_one_window_for_one_instance(self):
        # 3 s attempts: started at 0, 3, 6, 9; the fifth would start at 12.
        self.assertEqual(4, self.attempts(1, 3.0))
        self.assertEqual({'retried': 3, 'gave_up': 1},
                         self.manager.claim_retries)

    def test_a_window_per_instance_of_a_multi_create(self):
        # Seven servers: 70 s; attempts of 7 x 3 s start at 0, 21, 42, 63.
        self.assertEqual(4, self.attempts(7, 21.0))

    def test_retries_bound_it_too(self):
        self.conf.config(claim_retries=2, group='gpu_scheduler')
        self.assertEqual(3, self.attempts(7, 0.0))
