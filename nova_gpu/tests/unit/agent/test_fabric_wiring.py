"""NVSwitch partitions wired in: configuration, qemu hook, agent cycle."""

import io
import time

import fixtures
from oslo_config import cfg
from oslo_config import fixture as config_fixture
import testtools

from nova_gpu.agent import fabric
from nova_gpu.agent import jsonstore
from nova_gpu.agent import privsep
from nova_gpu.agent import qemu_hook
import nova_gpu.conf  # noqa: F401 - registers the options
from nova_gpu.tests.unit.agent import fakefm
from nova_gpu.tests.unit.agent import fakenvml
from nova_gpu.tests.unit.agent import fakesys
from nova_gpu.tests.unit.agent import test_qemu_hook

# GPUS[i] is module i + 1: the pair partitions are 3: GPUS[0:3:2]
# (modules 1, 3), 4: GPUS[1:4:2], 5: GPUS[4:7:2], 6: GPUS[5:8:2].
GPUS = ['0000:%s:00.0' % b for b in fakenvml.H100_BUS]
NIC = '0000:3b:00.0'


class _Case(testtools.TestCase):

    def setUp(self):
        super().setUp()
        privsep.use_in_process()
        self.root = self.useFixture(fixtures.TempDir()).path
        self.state = self.useFixture(fixtures.TempDir()).path
        self.fs = fakesys.FakeSysfs(self.root)
        fakenvml.hgx_h100_sysfs(self.fs)
        self.fs.add_pci(NIC, '0x1017', vendor='0x15b3', driver='mlx5_core',
                        pci_class='0x020000')
        self.fm = fakefm.FakeFabricManager(GPUS, unsupported={6})
        self.conf = self.useFixture(config_fixture.Config(cfg.CONF)).conf
        for name, value in (('sysfs_root', self.root),
                            ('state_dir', self.state),
                            ('use_nvml', False),
                            ('libvirt_uri', 'test:///default'),
                            ('provider_config_file', ''),
                            ('placement_cloud', None)):
            self.conf.set_override(name, value, 'gpu_agent')

    def keeper(self, clock=None):
        return fabric.PartitionKeeper(
            self.fm, jsonstore.JsonStore(self.state, fabric.STORE_NAME,
                                         'held'),
            **({'clock': clock} if clock else {}))


class ConfTest(_Case):

    def test_no_fabric_manager_unless_shared(self):
        self.assertIsNone(fabric.from_conf(self.conf))
        self.assertIsNone(fabric.keeper_from_conf(self.conf))

    def test_shared_mode_builds_fmpm_client_and_keeper(self):
        self.conf.set_override('nvswitch_mode', 'shared', 'gpu_agent')
        self.conf.set_override('fmpm_path', '/opt/fm/fmpm', 'gpu_agent')
        self.conf.set_override('fabric_manager_socket', '/run/fm.sock',
                               'gpu_agent')
        self.conf.set_override('fabric_manager_timeout', 7, 'gpu_agent')
        fm = fabric.from_conf(self.conf)
        self.assertEqual('/opt/fm/fmpm', fm.path)
        self.assertEqual(['--unix-domain-socket', '/run/fm.sock'],
                         fm.connect)
        self.assertEqual(7, fm.timeout)
        keeper = fabric.keeper_from_conf(self.conf)
        self.assertEqual(self.state + '/' + fabric.STORE_NAME,
                         keeper.store.path)

    def test_bad_mode_is_refused(self):
        self.assertRaises(ValueError, self.conf.set_override,
                          'nvswitch_mode', 'full', 'gpu_agent')


class HookTest(_Case):

    def run_hook(self, addresses, phase=('prepare', 'begin'),
                 profile=None, keeper=None):
        err = io.StringIO()
        rc = qemu_hook.main(
            ['instance-1', *phase, '-'],
            stdin=io.StringIO(test_qemu_hook.domain_xml(addresses,
                                                        profile=profile)),
            stderr=err, sysfs_root=self.root, state_dir=self.state,
            keeper=keeper or self.keeper())
        return rc, err.getvalue()

    def test_partition_activated_at_start_deactivated_at_stop(self):
        rc, err = self.run_hook([NIC] + GPUS[1:4:2])
        self.assertEqual(0, rc, err)
        self.assertIn('NVSwitch partition 4 activated', err)
        self.assertEqual({4}, self.fm.active)
        self.assertEqual({'instance-1': 4}, self.keeper().held())
        rc, err = self.run_hook(GPUS[1:4:2], phase=('release', 'end'))
        self.assertEqual(0, rc, err)
        self.assertIn('NVSwitch partition 4 deactivated', err)
        self.assertEqual(set(), self.fm.active)
        self.assertEqual({}, self.keeper().held())

    def test_gpus_forming_no_partition_fail_the_start(self):
        rc, err = self.run_hook(GPUS[1:3])
        self.assertEqual(1, rc)
        self.assertIn('form no NVSwitch partition', err)
        self.assertIn(GPUS[1], err)
        self.assertEqual(set(), self.fm.active)

    def test_fabric_manager_refusal_fails_the_start(self):
        rc, err = self.run_hook(GPUS[5:8:2])   # partition 6: unsupported
        self.assertEqual(1, rc)
        self.assertIn('FM_ST_NOT_SUPPORTED', err)
        self.fm.down = True
        rc, err = self.run_hook(GPUS[0:3:2])
        self.assertEqual(1, rc)
        self.assertIn('FM_ST_CONNECTION_NOT_VALID', err)
        self.assertEqual({}, self.keeper().held())

    def test_release_failure_never_fails_the_stop(self):
        self.assertEqual(0, self.run_hook(GPUS[0:3:2])[0])
        self.fm.fail_next['deactivate'] = fabric.FM_ST_GENERIC_ERROR
        rc, err = self.run_hook(GPUS[0:3:2], phase=('release', 'end'))
        self.assertEqual(0, rc)
        self.assertIn('the agent retries', err)
        self.assertEqual({'instance-1': 3}, self.keeper().held())

    def test_guest_without_gpus_asks_nothing(self):
        calls = len(self.fm.calls)
        self.assertEqual((0, ''), self.run_hook([NIC]))
        self.assertEqual((0, ''), self.run_hook([]))
        self.assertEqual(calls, len(self.fm.calls))

    def test_partition_released_when_vgpu_typing_fails(self):
        # A typed guest whose VF typing fails after its partition was
        # activated: the partition goes again, the start fails.
        self.useFixture(fixtures.MockPatch(
            'nova_gpu.agent.qemu_hook.prepare',
            side_effect=qemu_hook.HookError('VF cannot take it')))
        rc, err = self.run_hook(GPUS[0:3:2], profile='H100XM-10C')
        self.assertEqual(1, rc)
        self.assertIn('VF cannot take it', err)
        self.assertEqual(set(), self.fm.active)
        self.assertEqual({}, self.keeper().held())

    def test_configured_keeper_used_by_the_installed_hook(self):
        keeper = self.keeper()
        self.useFixture(fixtures.MockPatch(
            'nova_gpu.agent.qemu_hook._configured',
            return_value=(self.root, self.state, keeper)))
        err = io.StringIO()
        rc = qemu_hook.main(['instance-1', 'prepare', 'begin', '-'],
                            stdin=io.StringIO(test_qemu_hook.domain_xml(
                                GPUS[4:7:2], profile=None)), stderr=err)
        self.assertEqual(0, rc, err.getvalue())
        self.assertEqual({5}, self.fm.active)


class _Libvirt:
    """libvirt_host.LibvirtHost's ``call``, over named domains."""

    def __init__(self, running, fail=False):
        self.running = running
        self.fail = fail

    def call(self, what, fn):
        if self.fail:
            raise RuntimeError('libvirtd restarting')
        doms = [_Dom(n) for n in self.running]
        conn = type('Conn', (), {'listAllDomains':
                                 lambda self, flags: doms})()
        return fn(conn)


class _Dom:
    def __init__(self, name):
        self._name = name

    def name(self):
        return self._name

    def isActive(self):
        return True


class KeepTest(_Case):

    def setUp(self):
        super().setUp()
        self.now = [1000.0]
        self.k = self.keeper(clock=lambda: self.now[0])
        self.k.prepare('alive', GPUS[0:3:2])
        self.k.prepare('gone', GPUS[4:8])

    def test_gone_guests_partitions_deactivated_after_grace(self):
        lv = _Libvirt({'alive'})
        self.assertEqual([], fabric.keep(self.k, lv, 300)['deactivated'])
        self.now[0] += 600
        out = fabric.keep(self.k, lv, 300)
        self.assertEqual({'restored': None, 'deactivated': [2]}, out)
        self.assertEqual({3}, self.fm.active)
        self.assertEqual({'alive': 3}, self.k.held())

    def test_restore_after_fabric_manager_restart(self):
        self.fm.restart()
        out = fabric.keep(self.k, _Libvirt({'alive', 'gone'}), 300)
        self.assertEqual([2, 3], out['restored'])
        self.assertEqual({2, 3}, self.fm.active)

    def test_failures_are_retried_next_cycle(self):
        self.now[0] += 600
        self.fm.down = True
        out = fabric.keep(self.k, _Libvirt(set()), 300)
        self.assertEqual({'restored': None, 'deactivated': []}, out)
        self.fm.down = False
        out = fabric.keep(self.k, _Libvirt(set(), fail=True), 300)
        self.assertEqual([], out['deactivated'])
        self.assertEqual({2, 3}, self.fm.active)   # nobody known gone
        self.assertEqual([2, 3], sorted(fabric.keep(
            self.k, _Libvirt(set()), 300)['deactivated']))
        self.assertIsNone(fabric.keep(None, _Libvirt(set()), 300))


class AgentCycleTest(_Case):

    def test_cycle_reports_partitions_and_settles_gone_guests(self):
        from nova_gpu.agent import agent as agent_mod
        self.conf.set_override('nvswitch_mode', 'shared', 'gpu_agent')
        self.useFixture(fixtures.MockPatch(
            'nova_gpu.agent.fabric.from_conf', return_value=self.fm))
        agent = agent_mod.Agent(self.conf)
        self.addCleanup(agent.close)
        self.assertIs(self.fm, agent.fabric)
        # A guest that died while its hook could not release.
        agent.partitions.clock = lambda: 0.0
        agent.partitions.prepare('instance-gone', GPUS[1:4:2])
        agent.partitions.clock = time.time
        result = agent.cycle()
        self.assertEqual([4], result['partitions']['deactivated'])
        self.assertEqual(set(), self.fm.active)
        listed = {p['id']: p for p in result['report']['partitions']}
        self.assertEqual(15, len(listed))
        self.assertFalse(listed[6]['supported'])
        self.assertFalse(listed[4]['active'])
