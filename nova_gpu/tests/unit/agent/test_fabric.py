"""NVSwitch partitions from Fabric Manager: discovery, report, fmpm."""

import json
import subprocess

import testtools

from nova_gpu.agent import discovery
from nova_gpu.agent import fabric
from nova_gpu.agent import nvml
from nova_gpu.core import catalog
from nova_gpu.core import engine as engine_mod
from nova_gpu.core import exceptions
from nova_gpu.core import report
from nova_gpu.core import request as R
from nova_gpu.tests.unit.agent import fakefm
from nova_gpu.tests.unit.agent import fakenvml
from nova_gpu.tests.unit.agent import test_discovery

CATALOG = catalog.load_catalog()


def h100_addresses():
    return ['0000:%s:00.0' % b for b in fakenvml.H100_BUS]


class DiscoveryPartitionsTest(test_discovery.SysfsCase):

    def setUp(self):
        super().setUp()
        fakenvml.hgx_h100_sysfs(self.fs)
        self.nvml = nvml.Nvml(lib=fakenvml.hgx_h100())
        self.fm = fakefm.FakeFabricManager(h100_addresses(),
                                           unsupported={4})

    def discover(self, fm):
        return discovery.Discovery(self.sysfs, self.nvml, CATALOG,
                                   host='hgx1', fabric=fm).discover()

    def test_partitions_reported_and_read_back(self):
        self.fm.active.add(5)   # modules 5, 7
        inv = self.discover(self.fm)
        data = inv.report(generation=1)
        listed = {p['id']: p for p in data['partitions']}
        self.assertEqual(15, len(listed))
        self.assertEqual([0, 2], listed[3]['gpus'])   # modules 1, 3
        self.assertFalse(listed[4]['supported'])
        self.assertTrue(listed[5]['active'])
        parsed = report.parse(json.loads(json.dumps(data)), CATALOG)
        table = parsed.host.partitions
        self.assertEqual(inv.host.partitions, table)
        # The scheduler's engine, on the parsed report: a 2-GPU guest
        # gets a free supported pair that is not the active one, and
        # keeps the free 4-GPU partition (modules 1-4) whole.
        best = engine_mod.PlacementEngine().best(
            parsed.host, R.GpuRequest('whole', count=2))
        self.assertEqual((5, 7), best.placement.gpus)

    def test_no_fabric_manager_no_partitions(self):
        data = self.discover(None).report()
        self.assertNotIn('partitions', data)
        self.assertIsNone(report.parse(data, CATALOG).host.partitions)

    def test_fabric_manager_down_offers_no_whole_gpu(self):
        self.fm.down = True
        inv = self.discover(self.fm)
        self.assertEqual((), report.parse(inv.report(), CATALOG)
                         .host.partitions.partitions)
        self.assertEqual([], engine_mod.PlacementEngine().rank(
            inv.host, R.GpuRequest('whole')))

    def test_partition_of_a_gpu_not_on_the_host_is_left_out(self):
        addresses = h100_addresses()
        addresses[7] = '0000:ee:00.0'   # module 8 is not on this host
        inv = self.discover(fakefm.FakeFabricManager(addresses))
        ids = {p.id for p in inv.host.partitions.partitions}
        self.assertNotIn(0, ids)   # all 8
        self.assertNotIn(2, ids)   # modules 5-8
        self.assertNotIn(14, ids)  # module 8
        self.assertIn(13, ids)


class ReportPartitionsValidationTest(testtools.TestCase):

    def report(self, partitions):
        host = discovery.host_mod.Host('h', [discovery.host_mod.Gpu(
            i, CATALOG.model('H100-80GB'), address='0000:%02x:00.0' % i)
            for i in range(2)])
        data = report.host_to_dict(host)
        data['partitions'] = partitions
        return data

    def test_bad_partitions_are_named(self):
        for value, field, words in (
                ('all', 'partitions', 'must be a list'),
                ([7], 'partitions[0]', 'must be an object'),
                ([{'gpus': [0]}], 'partitions[0].id', 'missing'),
                ([{'id': 64, 'gpus': [0]}], 'partitions[0].id', '0..63'),
                ([{'id': 1}], 'partitions[0].gpus', 'missing'),
                ([{'id': 1, 'gpus': [0, 0]}], 'partitions[0].gpus',
                 'listed twice'),
                ([{'id': 1, 'gpus': [2]}], 'partitions[0].gpus[0]', '0..1'),
                ([{'id': 1, 'gpus': [True]}], 'partitions[0].gpus[0]',
                 'integer'),
                ([{'id': 1, 'gpus': [0], 'active': 'yes'}],
                 'partitions[0].active', 'true or false'),
                ([{'id': 1, 'gpus': []}], 'partitions', 'no GPUs'),
                ([{'id': 1, 'gpus': [0]}, {'id': 1, 'gpus': [1]}],
                 'partitions', 'listed twice'),
                ([{'id': 1, 'gpus': [0, 1], 'active': True},
                  {'id': 2, 'gpus': [1], 'active': True}],
                 'partitions', 'share GPU 1'),
                ([{'id': i, 'gpus': [0]} for i in range(65)], 'partitions',
                 'more than 64')):
            err = self.assertRaises(report.ReportError, report.parse,
                                    self.report(value), CATALOG)
            self.assertEqual(field, err.field, value)
            self.assertIn(words, str(err))
            self.assertIsInstance(err, exceptions.InvalidRequest)

    def test_null_is_no_partitions(self):
        self.assertIsNone(report.parse(self.report(None), CATALOG)
                          .host.partitions)


class FmpmClientTest(testtools.TestCase):
    """The real client, with ``fmpm``'s process faked (its JSON, its exit
    status: the negative fmReturn_t mod 256).
    """

    LIST = {'version': 1, 'numPartitions': 2, 'maxNumPartitions': 64,
            'partitionInfo': [
                {'partitionId': 3, 'isActive': 1, 'numGpus': 2,
                 'gpuInfo': [
                     {'physicalId': 1, 'uuid': 'GPU-a',
                      'pciBusId': '00000000:1B:00.0',
                      'numNvLinksAvailable': 18, 'maxNumNvLinks': 18,
                      'nvlinkLineRateMBps': 26562},
                     {'physicalId': 3, 'uuid': 'GPU-c',
                      'pciBusId': '00000000:52:00.0',
                      'numNvLinksAvailable': 18, 'maxNumNvLinks': 18,
                      'nvlinkLineRateMBps': 26562}]},
                {'partitionId': 7, 'isActive': 0, 'numGpus': 1,
                 'gpuInfo': [{'physicalId': 1, 'uuid': 'GPU-a',
                              'pciBusId': '00000000:1B:00.0'}]}]}

    def client(self, rc=0, out='', err=''):
        self.cmds = []

        def run(cmd, **kw):
            self.cmds.append(cmd)
            return subprocess.CompletedProcess(cmd, rc, out, err)
        return fabric.FmpmClient('/usr/bin/fmpm',
                                 unix_socket='/run/fm.sock', run=run)

    def test_list(self):
        parts = self.client(out=json.dumps(self.LIST)).supported_partitions()
        self.assertEqual([3, 7], [p.id for p in parts])
        self.assertTrue(parts[0].active)
        self.assertEqual(('0000:1b:00.0', '0000:52:00.0'),
                         parts[0].pci_bus_ids)
        self.assertEqual(['/usr/bin/fmpm', '-l', '--unix-domain-socket',
                          '/run/fm.sock'], self.cmds[0])

    def test_errors_carry_fm_codes(self):
        client = self.client(rc=256 - 7,
                             out='Failed to activate partition. '
                                 'fmReturn: -7\n')
        err = self.assertRaises(fabric.FabricManagerError,
                                client.activate, 3)
        self.assertEqual(fabric.FM_ST_IN_USE, err.code)
        self.assertIn('FM_ST_IN_USE', str(err))
        self.assertIn('activate 3', str(err))

    def test_malformed_answers_are_named(self):
        for out in ('Failed', '{}', json.dumps({'partitionInfo': [{}]})):
            err = self.assertRaises(
                fabric.FabricManagerError,
                self.client(out=out).supported_partitions)
            self.assertEqual(fabric.FM_ST_GENERIC_ERROR, err.code)

    def test_timeout_and_missing_tool(self):
        def slow(cmd, **kw):
            raise subprocess.TimeoutExpired(cmd, 30)
        err = self.assertRaises(
            fabric.FabricManagerError,
            fabric.FmpmClient(run=slow).deactivate, 3)
        self.assertEqual(fabric.FM_ST_TIMEOUT, err.code)

        def missing(cmd, **kw):
            raise FileNotFoundError(2, 'No such file', cmd[0])
        err = self.assertRaises(
            fabric.FabricManagerError,
            fabric.FmpmClient(run=missing).set_activated, [3])
        self.assertIn('cannot run fmpm', str(err))

    def test_set_activated_list_is_comma_separated(self):
        client = self.client()
        client.set_activated([7, 3])
        self.assertEqual(['--set-activated-list', '3,7'],
                         self.cmds[0][1:3])


class KeeperTest(testtools.TestCase):
    """Activation for a guest's GPUs, crash recovery, FM restart."""

    def setUp(self):
        super().setUp()
        from nova_gpu.agent import jsonstore
        self.addresses = h100_addresses()
        self.fm = fakefm.FakeFabricManager(self.addresses, unsupported={6})
        self.state = self.useFixture(test_discovery._TempDir()).path
        self.now = [1000.0]
        self.store = lambda: jsonstore.JsonStore(
            self.state, 'partitions.json', 'held')
        self.keeper = self.keeper_again()

    def keeper_again(self):
        # A new process (the next hook run, the agent after a crash):
        # only what is on disk is known.
        return fabric.PartitionKeeper(self.fm, self.store(),
                                      clock=lambda: self.now[0])

    # self.addresses[i] is module i + 1: the pair partitions are 3:
    # [0:3:2] (modules 1, 3), 4: [1:4:2], 5: [4:7:2], 6: [5:8:2].

    def test_activate_then_deactivate(self):
        pid = self.keeper.prepare('inst-1', self.addresses[1:4:2])
        self.assertEqual(4, pid)
        self.assertEqual({4}, self.fm.active)
        self.assertEqual({'inst-1': 4}, self.keeper_again().held())
        self.assertEqual(4, self.keeper_again().release('inst-1'))
        self.assertEqual(set(), self.fm.active)
        self.assertEqual({}, self.keeper.held())
        # Released twice (a retried hook): nothing to do.
        self.assertIsNone(self.keeper.release('inst-1'))

    def test_gpus_forming_no_partition_refuse_the_start(self):
        err = self.assertRaises(fabric.PartitionError, self.keeper.prepare,
                                'inst-1', self.addresses[1:3])
        self.assertIn('form no NVSwitch partition', str(err))
        self.assertEqual({}, self.keeper.held())

    def test_fm_errors_refuse_the_start_and_leave_no_record(self):
        err = self.assertRaises(fabric.PartitionError, self.keeper.prepare,
                                'inst-1', self.addresses[5:8:2])
        self.assertIn('FM_ST_NOT_SUPPORTED', str(err))
        self.keeper.prepare('inst-1', self.addresses[0:3:2])
        err = self.assertRaises(fabric.PartitionError, self.keeper.prepare,
                                'inst-2', self.addresses[0:4])
        self.assertIn('FM_ST_IN_USE', str(err))
        self.fm.fail_next['activate'] = fabric.FM_ST_TIMEOUT
        err = self.assertRaises(fabric.PartitionError, self.keeper.prepare,
                                'inst-3', self.addresses[4:7:2])
        self.assertIn('FM_ST_TIMEOUT', str(err))
        self.assertEqual({'inst-1': 3}, self.keeper.held())
        self.fm.down = True
        err = self.assertRaises(fabric.PartitionError, self.keeper.prepare,
                                'inst-4', self.addresses[4:7:2])
        self.assertIn('FM_ST_CONNECTION_NOT_VALID', str(err))

    def test_crash_between_activate_and_guest_start(self):
        # The hook activated, then died before marking the record active
        # (and the guest never started): the next start of the same guest
        # adopts the activation; a guest that never comes is deactivated.
        self.fm.activate(5)
        with self.store().change() as held:
            held['inst-1'] = {'partition': 5, 'state': fabric.ACTIVATING,
                              'gpus': self.addresses[4:7:2], 'time': 1000.0}
        self.assertEqual(5, self.keeper_again().prepare(
            'inst-1', self.addresses[4:7:2]))
        self.assertEqual({5}, self.fm.active)
        # Another crash leaves it held; the guest is not running.
        keeper = self.keeper_again()
        self.assertEqual([], keeper.recover(running=set()))  # within grace
        self.now[0] += 600
        self.assertEqual([], keeper.recover(running={'inst-1'}))
        self.assertEqual([5], keeper.recover(running=set()))
        self.assertEqual(set(), self.fm.active)
        self.assertEqual({}, keeper.held())

    def test_recover_keeps_record_when_fm_fails(self):
        self.keeper.prepare('inst-1', self.addresses[0:3:2])
        self.now[0] += 600
        self.fm.fail_next['deactivate'] = fabric.FM_ST_GENERIC_ERROR
        self.assertEqual([], self.keeper.recover(running=set()))
        self.assertEqual({'inst-1': 3}, self.keeper.held())
        self.assertEqual([3], self.keeper.recover(running=set()))

    def test_restore_after_fabric_manager_restart(self):
        self.keeper.prepare('inst-1', self.addresses[0:3:2])
        self.keeper.prepare('inst-2', self.addresses[4:8])
        self.fm.restart()
        err = self.assertRaises(fabric.PartitionError, self.keeper.prepare,
                                'inst-3', self.addresses[1:4:2])
        self.assertIn('FM_ST_NOT_CONFIGURED', str(err))
        self.assertEqual([2, 3], self.keeper_again().restore())
        self.assertEqual({2, 3}, self.fm.active)
        self.assertFalse(self.fm.awaiting_list)
        self.assertIsNone(self.keeper.restore())   # nothing to do now
        self.assertEqual(4, self.keeper.prepare('inst-3',
                                                self.addresses[1:4:2]))
