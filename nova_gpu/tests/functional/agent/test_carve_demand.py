"""Carve to demand: the scheduler's demand reshapes the idle GPUs.

Real libvirtd + mdevctl on the fake-sysfs harness (``fakehost``), NVML
faked at its boundary (two A100-40GB in MIG mode, state in a file), a
real RabbitMQ: the scheduler's view counts requests into its demand
window and publishes it (``gpu.demand.updated``); the agent's demand
listener receives it in its host's pool, and the agent's cycle plans and
carves. The demand shifts from 1g.5gb to 7g.40gb vGPUs: the idle GPU is
re-carved, the GPU where a guest runs is not touched at all.
"""

import os
import time
import uuid

from oslo_config import cfg
from oslo_config import fixture as config_fixture
import oslo_messaging as messaging
import testtools

from nova_gpu.agent import agent as agent_mod
from nova_gpu.agent import carver as carver_mod
from nova_gpu.agent import planning
from nova_gpu.agent import privsep
from nova_gpu.agent import sysfs
from nova_gpu.bench import reliability_agent as rel
import nova_gpu.conf  # noqa: F401 - registers the options
from nova_gpu.core import catalog
from nova_gpu.core import layout as L
from nova_gpu.core import notification
from nova_gpu.scheduler import gpu_spec
from nova_gpu.scheduler import notifier as notifications
from nova_gpu.scheduler import view as view_mod
from nova_gpu.tests.functional.agent import fakehost
from nova_gpu.tests.functional.agent import rabbit
from nova_gpu.tests.harness import agent_process
from nova_gpu.tests.unit.agent import fakenvml

A100 = catalog.load_catalog().model('A100-40GB')
WINDOW = 4


def _spec(profile):
    return gpu_spec.parse({'gpu:profile': profile, 'resources:VGPU': '1'},
                          gpu_spec.default_catalog(), vcpus=4, memory_mb=8192)


SMALL = _spec('A100X-1-5C')
LARGE = _spec('A100X-7-40C')


def _fake_nvml(state_file):
    return fakenvml.FakePynvml(
        [fakenvml.FakeGpu('00000000:%s:00.0' % bus, 'NVIDIA A100-SXM4-40GB',
                          40960, mig=True) for bus in ('07', '0f')],
        state_file=state_file)


class TestCarveToDemand(testtools.TestCase):

    def setUp(self):
        super().setUp()
        self.url = self.useFixture(rabbit.SharedOrPrivateRabbit()).url
        self.host = self.useFixture(fakehost.FakeHost(rel.build_host))
        privsep.use_in_process()
        conf = self.useFixture(config_fixture.Config(cfg.CONF)).conf
        topic = 'nova_gpu_demand_test_%s' % uuid.uuid4().hex[:8]
        state = os.path.join(self.host.dir, 'agent-state')
        for name, value in (
                ('host', 'cmp-carve'), ('sysfs_root', self.host.fs.root),
                ('libvirt_uri', self.host.uri), ('use_nvml', True),
                ('state_dir', state), ('provider_config_file', ''),
                ('carve_enabled', True), ('carve_interval', 0),
                ('carve_min_hold', 0), ('demand_topic', topic)):
            conf.set_override(name, value, 'gpu_agent')
        for name, value in (('demand_window', WINDOW),
                            ('demand_refresh_interval', 1),
                            ('demand_publish_interval', 1),
                            ('demand_topic', topic)):
            conf.set_override(name, value, 'gpu_scheduler')
        self.lib = _fake_nvml(os.path.join(self.host.dir, 'nvml.json'))
        self.agent = agent_mod.Agent(conf, nvml_lib=self.lib)
        self.addCleanup(self.agent.close)
        # nova-scheduler sends on Nova's control exchange, where the agent
        # listens ([gpu_agent] report_exchange), as nova.rpc.set_defaults
        # makes it; overridden for this test only.
        # Building a transport registers oslo.messaging's own options (not
        # copies: Nova's fixtures register the same objects later).
        messaging.get_notification_transport(conf, url=self.url).cleanup()
        conf.set_override('control_exchange', 'nova')
        transport = messaging.get_notification_transport(conf, url=self.url)
        self.addCleanup(transport.cleanup)
        # The agent's side: the service's listener, in its host's pool.
        demand = planning.DemandListener(conf, self.agent.demand,
                                         self.agent.host, transport).start()
        self.addCleanup(demand.stop)
        # The scheduler's side: its view's demand window, sending as
        # nova-scheduler does (the notifier on the demand topic).
        notifications.set_notifier(messaging.Notifier(
            transport, driver='messagingv2',
            publisher_id='nova-gpu-scheduler:test', topics=[topic]))
        self.addCleanup(notifications.set_notifier, None)
        self.now = 1000.0
        self.view = view_mod.GpuView(clock=lambda: self.now)

    def schedule(self, spec, count=WINDOW):
        """``count`` requests of ``spec`` reach the scheduler; the agent
        receives the demand they make.
        """
        for _ in range(count):
            self.now += 2
            self.view.note_request(spec)
        version = self.view.demand_version
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            _demand, origin = self.agent.demand.current()
            if 'window version %d,' % version in origin:
                return
            time.sleep(0.1)
        self.fail('demand version %d never reached the agent (%s)'
                  % (version, origin))

    def shapes(self, index):
        self.lib._sync()
        return {(g['start'], g['size']): gi_id
                for gi_id, g in self.lib.gpus[index].gis.items()}

    def test_demand_shift_recarves_idle_gpus_only(self):
        self.schedule(SMALL)
        result = self.agent.cycle()
        self.assertEqual([0, 1], result['carve']['changed'],
                         result['carve'])
        for index in (0, 1):
            layout = self.agent.carver.store.load()[
                self.agent.nvml.address(index)]
            self.assertEqual({('1g.5gb', 'A100X-1-5C')},
                             {(g, v) for g, _s, v in layout.instances})
            self.assertEqual(7, len(self.shapes(index)))
        # The T4 and the H100 only sysfs shows: nothing the carver reaches.
        self.assertIn('NVML does not see', result['carve']['decisions'][2])
        self.assertEqual({}, result['carve']['failed'])
        # The report carries the carved layouts.
        self.assertEqual('mig', result['report']['gpus'][0]['layout']['kind'])
        # A guest's vGPU runs on GPU 0's 1g.5gb instance at slice 6.
        busy = self.agent.carver.mig_state(0, A100)[('1g.5gb', 6)]
        self.lib.start_vgpu_on(self.lib.gpus[0], busy)
        before = self.shapes(0)

        self.schedule(LARGE)
        result = self.agent.cycle()
        self.assertEqual([1], result['carve']['changed'], result['carve'])
        self.assertIn('in use: kept', result['carve']['decisions'][0])
        self.assertEqual(
            L.Layout(L.MIG, instances=(('7g.40gb', 0, 'A100X-7-40C'),)),
            self.agent.carver.store.load()[self.agent.nvml.address(1)])
        self.assertEqual([(0, 8)], list(self.shapes(1)))
        self.assertEqual({}, result['carve']['failed'])
        # Nothing on the GPU in use changed, not even its idle instances.
        self.assertEqual(before, self.shapes(0))
        self.assertEqual([], list(self.agent.journal.intents()))
        gpus = result['report']['gpus']
        self.assertEqual([['7g.40gb', 0, 'A100X-7-40C']],
                         gpus[1]['layout']['instances'])
        # Once the guest is gone GPU 0 follows the demand too.
        self.lib._sync()
        self.lib.gpus[0].vgpus.clear()
        self.lib._flush()
        result = self.agent.cycle()
        self.assertEqual([0], result['carve']['changed'], result['carve'])
        self.assertEqual([(0, 8)], list(self.shapes(0)))


class TestAgentServiceCarves(testtools.TestCase):
    """nova-gpu-agent as a process: its listener, its cycle, its stop."""

    PF = rel.PF                      # an H100 with four vendor-VFIO VFs

    def setUp(self):
        super().setUp()
        self.url = self.useFixture(rabbit.SharedOrPrivateRabbit()).url
        self.host = self.useFixture(fakehost.FakeHost(rel.build_host))
        self.topic = 'nova_gpu_demand_test_%s' % uuid.uuid4().hex[:8]
        work = self.host.dir
        self.state = os.path.join(work, 'agent-state')
        nvml_file = agent_process.write_fake_nvml(
            os.path.join(work, 'fake-nvml.json'),
            [{'address': self.PF, 'name': 'NVIDIA H100 80GB HBM3',
              'memory_mib': 81920}])
        config = agent_process.write_config(
            os.path.join(work, 'agent.conf'), self.url,
            'nova_gpu_reports_test',
            work, self.host.fs.root, 'cmp-svc', libvirt_uri=self.host.uri,
            options={'gpu_agent': {
                'use_nvml': 'true', 'reconcile_interval': 1,
                'state_dir': self.state, 'carve_enabled': 'true',
                'carve_interval': 0, 'carve_min_hold': 0,
                'demand_topic': self.topic}})
        # An idle VF typed for an older demand.
        self.vfs = sysfs.Sysfs(self.host.fs.root).pci_function(self.PF).vfs
        self.host.fs.set_vgpu_type(self.vfs[0], rel.VGPU_TYPE)
        self.agent = self.useFixture(agent_process.AgentProcess(
            config, os.path.join(work, 'agent.log'), fake_nvml=nvml_file))
        conf = self.useFixture(config_fixture.Config(cfg.CONF)).conf
        # Building a transport registers oslo.messaging's own options (not
        # copies: Nova's fixtures register the same objects later).
        messaging.get_notification_transport(conf, url=self.url).cleanup()
        conf.set_override('control_exchange', 'nova')
        transport = messaging.get_notification_transport(conf, url=self.url)
        self.addCleanup(transport.cleanup)
        self.notifier = messaging.Notifier(
            transport, driver='messagingv2',
            publisher_id='nova-gpu-scheduler:test', topics=[self.topic])

    def test_published_demand_is_carved_by_the_service(self):
        self.assertTrue(self.agent.wait_cycles(1), self.agent.log_tail())
        demand = notification.DemandPayload(
            items=[[{'kind': 'vgpu', 'profile': 'H100XM-20C'}, 1.0]],
            publisher='sched-1', version=1, requests=5)
        deadline = time.monotonic() + 30
        store = carver_mod.LayoutStore(self.state)
        while time.monotonic() < deadline:
            # Sent until the agent's pool exists and the agent carved.
            self.notifier.info({}, notification.DEMAND_EVENT,
                               demand.to_primitive())
            if self.PF in store.load():
                break
            time.sleep(1)
        self.assertEqual(L.Layout(L.TIME_SLICED, 'H100XM-20C'),
                         store.load().get(self.PF), self.agent.log_tail())
        # Cleared for the hook to set the new type just in time.
        self.assertEqual(0, sysfs.Sysfs(self.host.fs.root).pci_function(
            self.vfs[0]).current_vgpu_type)
        log = self.agent.log_tail(20000)
        self.assertIn('GPU 0: idle, not set up: carved vGPU H100XM-20C',
                      log)
        self.assertIn('[demand: scheduler sched-1 (window version 1', log)
        # SIGTERM: the listener stops with the service.
        self.assertEqual(0, self.agent.stop())
