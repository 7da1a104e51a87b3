"""The agent's planning loop and its demand (faked NVML: A100s in MIG)."""

import json
import os

import fixtures
import oslo_messaging as messaging
import pynvml
import testtools

from nova_gpu.agent import carver as carver_mod
from nova_gpu.agent import devices
from nova_gpu.agent import discovery
from nova_gpu.agent import errors
from nova_gpu.agent import nvml
from nova_gpu.agent import planning
from nova_gpu.agent import sysfs
from nova_gpu.core import catalog
from nova_gpu.core import exceptions
from nova_gpu.core import fragmentation
from nova_gpu.core import host as host_mod
from nova_gpu.core import layout as L
from nova_gpu.core import notification
from nova_gpu.core import request as request_mod
from nova_gpu.tests.unit.agent import fakenvml

CATALOG = catalog.load_catalog()
A100 = CATALOG.model('A100-40GB')
SMALL = [[{'kind': 'mig', 'profile': '1g.5gb'}, 1.0]]
LARGE = [[{'kind': 'mig', 'profile': '7g.40gb'}, 1.0]]


def payload(items, version=1):
    return notification.DemandPayload(items=items, publisher='sched-1',
                                      version=version, requests=10)


class FakeLibvirt:
    def __init__(self, refs=(), fails=False):
        self.refs = set(refs)
        self.fails = fails

    def domain_refs(self):
        if self.fails:
            raise RuntimeError('libvirtd is restarting')
        return set(self.refs)


class Clock:
    def __init__(self, now=1000.0):
        self.now = now

    def __call__(self):
        return self.now


class StaticDemandTest(testtools.TestCase):

    def test_items(self):
        demand = planning.parse_static_demand(
            ['vgpu:A100-10C=3', ' mig:1g.10gb = 1', 'whole:2=1'])
        self.assertEqual(
            [(request_mod.GpuRequest('vgpu', profile='A100-10C'), 0.6),
             (request_mod.GpuRequest('mig', profile='1g.10gb'), 0.2),
             (request_mod.GpuRequest('whole', count=2), 0.2)],
            [(i.request, round(i.weight, 6)) for i in demand.items])
        self.assertIsNone(planning.parse_static_demand([]))

    def test_bad_items_are_named(self):
        for bad in ('vgpu=1', 'share:100=1', 'mig:1g.5gb', 'mig:1g.5gb=-1',
                    'whole:0=1', 'whole:x=1'):
            e = self.assertRaises(exceptions.InvalidRequest,
                                  planning.parse_static_demand, [bad])
            self.assertIn(repr(bad), str(e))


class DemandSourceTest(testtools.TestCase):

    def setUp(self):
        super().setUp()
        self.dir = self.useFixture(fixtures.TempDir()).path
        self.clock = Clock()
        self.static = planning.parse_static_demand(['whole:1=1'])

    def source(self, **kw):
        kw.setdefault('static', self.static)
        kw.setdefault('max_age', 600)
        return planning.DemandSource(state_dir=self.dir, clock=self.clock,
                                     **kw)

    def test_static_until_published_then_static_when_stale(self):
        src = self.source()
        demand, origin = src.current()
        self.assertIs(self.static, demand)
        self.assertIn('no demand published yet', origin)
        src.update(payload(SMALL, version=4))
        demand, origin = src.current()
        self.assertEqual('1g.5gb', demand.items[0].request.profile)
        self.assertIn('sched-1 (window version 4', origin)
        self.clock.now += 601
        demand, origin = src.current()
        self.assertIs(self.static, demand)
        self.assertIn('is 601 s old', origin)

    def test_an_older_window_of_the_same_scheduler_is_ignored(self):
        src = self.source()
        self.assertTrue(src.update(payload(LARGE, version=5)))
        self.assertFalse(src.update(payload(SMALL, version=4)))
        self.assertEqual('7g.40gb', src.current()[0].items[0].request.profile)
        other = notification.DemandPayload(items=SMALL, publisher='sched-2',
                                           version=1)
        self.assertTrue(src.update(other))

    def test_survives_a_restart(self):
        self.source().update(payload(LARGE))
        demand, _origin = self.source().current()
        self.assertEqual('7g.40gb', demand.items[0].request.profile)

    def test_a_bad_saved_file_is_ignored(self):
        with open(os.path.join(self.dir, planning.DEMAND_FILE), 'w') as f:
            json.dump({'received': 1, 'payload': {'x': 1}}, f)
        self.assertIs(self.static, self.source().current()[0])

    def test_static_source_ignores_published(self):
        src = self.source(use_published=False)
        src.update(payload(LARGE))
        self.assertIs(self.static, src.current()[0])

    def test_nothing_without_either(self):
        demand, origin = self.source(static=None).current()
        self.assertIsNone(demand)


class DemandEndpointTest(testtools.TestCase):

    def test_valid_replaces_invalid_is_dropped(self):
        src = planning.DemandSource()
        ep = planning.DemandEndpoint(src)
        self.assertEqual(messaging.NotificationResult.HANDLED, ep.info(
            {}, 'sched', notification.DEMAND_EVENT,
            payload(SMALL).to_primitive(), {}))
        bad = payload(SMALL).to_primitive()
        bad['nova_object.data']['items'] = [[{'kind': 'mig'}, 1]]
        self.assertEqual(messaging.NotificationResult.HANDLED, ep.info(
            {}, 'sched', notification.DEMAND_EVENT, bad, {}))
        self.assertEqual('1g.5gb',
                         src.current()[0].items[0].request.profile)

    def test_filter_takes_only_the_demand(self):
        rule = planning.DemandEndpoint.filter_rule
        self.assertTrue(rule.match({}, 'p', 'gpu.demand.updated', {}, {}))
        self.assertFalse(rule.match({}, 'p', 'gpu.host.report', {}, {}))


def two_a100s():
    gpus = [fakenvml.FakeGpu('00000000:%s:00.0' % bus,
                             'NVIDIA A100-SXM4-40GB', 40960, mig=True)
            for bus in ('07', '0f')]
    return fakenvml.FakePynvml(gpus)


class PlanningLoopTest(testtools.TestCase):

    def setUp(self):
        super().setUp()
        self.dir = self.useFixture(fixtures.TempDir()).path
        self.lib = two_a100s()
        self.nvml = nvml.Nvml(lib=self.lib)
        self.manager = devices.DeviceManager(None, nvml=self.nvml)
        self.carver = carver_mod.Carver(self.manager,
                                        carver_mod.LayoutStore(self.dir))
        self.source = planning.DemandSource()
        self.libvirt = FakeLibvirt()
        self.clock = Clock()
        self.loop = planning.PlanningLoop(
            self.carver, self.source, 'cmp1', min_hold=0,
            libvirt=self.libvirt, clock=self.clock)

    def inventory(self):
        return discovery.Discovery(sysfs.Sysfs('/nonexistent'), self.nvml,
                                   CATALOG, host='cmp1').discover()

    def shapes(self, index):
        return sorted(self.carver.mig_state(index, A100))

    def test_carves_idle_gpus_then_recarves_on_a_shift(self):
        self.source.update(payload(SMALL))
        result = self.loop.run(self.inventory())
        self.assertEqual([0, 1], result['changed'])
        self.assertEqual(7, len(self.shapes(0)))
        self.assertIn('idle, not set up: carved MIG 1g.5gb',
                      result['decisions'][0])
        # A guest starts on GPU 0's instance at slice 3.
        gi = self.carver.mig_state(0, A100)[('1g.5gb', 3)]
        self.lib.start_vgpu_on(self.lib.gpus[0], gi)
        before = self.shapes(0)
        self.source.update(payload(LARGE, version=2))
        result = self.loop.run(self.inventory())
        self.assertEqual([1], result['changed'])
        self.assertEqual([('7g.40gb', 0)], self.shapes(1))
        self.assertEqual(before, self.shapes(0))
        self.assertIn('in use: kept', result['decisions'][0])
        self.assertEqual(L.Layout(L.MIG, instances=(
            ('7g.40gb', 0, None),)),
            self.carver.store.load()['0000:0f:00.0'])

    def test_carves_by_nvml_index_past_a_gpu_left_out(self):
        # GPU 0 fell off the bus: the report's GPU 0 is NVML's GPU 1.
        self.lib.lose('0000:07:00.0')
        self.source.update(payload(SMALL))
        inventory = self.inventory()
        self.assertEqual(['0000:0f:00.0'],
                         [g.address for g in inventory.gpus])
        result = self.loop.run(inventory)
        self.assertEqual([0], result['changed'])
        self.assertEqual(7, len(self.shapes(1)))
        self.assertEqual({}, self.lib.gpus[0].gis)
        self.assertEqual(['0000:0f:00.0'],
                         sorted(self.carver.store.load()))
        # A guest on NVML GPU 1's instance keeps it (its use is read
        # from NVML's GPU 1, not the lost GPU 0).
        gi = self.carver.mig_state(1, A100)[('1g.5gb', 3)]
        self.lib.start_vgpu_on(self.lib.gpus[1], gi)
        self.source.update(payload(LARGE, version=2))
        result = self.loop.run(self.inventory())
        self.assertEqual([], result['changed'])
        self.assertIn('in use: kept', result['decisions'][0])

    def test_hold_time_and_hysteresis_keep_layouts(self):
        self.loop.planner.min_hold = 600
        self.source.update(payload(SMALL))
        self.loop.run(self.inventory())
        self.source.update(payload(LARGE, version=2))
        self.clock.now += 60
        result = self.loop.run(self.inventory())
        self.assertEqual([], result['changed'])
        self.assertIn('held 60 s of the 600 s minimum',
                      result['decisions'][1])

    def test_plans_nothing_when_use_cannot_be_told(self):
        self.source.update(payload(SMALL))
        self.libvirt.fails = True
        result = self.loop.run(self.inventory())
        self.assertIn('libvirt cannot list the domains', result['skipped'])
        self.assertEqual([], self.shapes(0))
        self.libvirt.fails = False
        self.loop.run(self.inventory())
        gi = self.carver.mig_state(1, A100)[('1g.5gb', 6)]
        self.lib.start_vgpu_on(self.lib.gpus[1], gi)
        self.lib.vgpu_listing_fails = True
        self.source.update(payload(LARGE, version=2))
        result = self.loop.run(self.inventory())
        self.assertEqual([], result['changed'])
        self.assertEqual(7, len(self.shapes(1)))

    def test_a_gpu_passed_through_is_busy(self):
        self.libvirt.refs = {'0000:07:00.0'}
        self.source.update(payload(SMALL))
        result = self.loop.run(self.inventory())
        self.assertEqual([1], result['changed'])
        self.assertEqual([], self.shapes(0))

    def test_a_gpu_in_mig_mode_gets_only_mig_layouts(self):
        self.source.update(payload(
            [[{'kind': 'whole', 'count': 1}, 1.0],
             [{'kind': 'mig', 'profile': '3g.20gb'}, 1.0]]))
        result = self.loop.run(self.inventory())
        for index in (0, 1):
            self.assertEqual(L.MIG, self.carver.store.load()[
                self.nvml.address(index)].kind, result['decisions'])

    def test_no_demand_no_nvml(self):
        self.assertIn('no demand', self.loop.run(self.inventory())[
            'skipped'])
        self.source.update(payload(SMALL))
        self.manager.nvml = None
        self.assertEqual('carving needs NVML',
                         self.loop.run(self.inventory())['skipped'])

    def test_interval(self):
        self.loop.interval = 300
        self.assertTrue(self.loop.due())
        self.loop.run(self.inventory())
        self.clock.now += 299
        self.assertFalse(self.loop.due())
        self.clock.now += 1
        self.assertTrue(self.loop.due())


class DemandContractTest(testtools.TestCase):

    def test_round_trip(self):
        demand = fragmentation.Demand([
            fragmentation.DemandItem(request_mod.GpuRequest(
                host_mod.VGPU, profile='A100-10C',
                models=['A100-40GB']), 3),
            fragmentation.DemandItem(request_mod.GpuRequest(
                host_mod.WHOLE, count=2), 1)])
        p = notification.DemandPayload(
            items=notification.demand_to_items(demand), version=3)
        wire = json.loads(json.dumps(p.to_primitive()))
        back = notification.parse(notification.DEMAND_EVENT, wire)
        self.assertEqual([(i.request, i.weight) for i in demand.items],
                         [(i.request, i.weight)
                          for i in back.demand().items])

    def test_bad_payloads_are_named(self):
        for items, words in (
                ('x', 'items must be a list'),
                ([[{'kind': 'vgpu'}]], 'items[0] must be [request, weight]'),
                ([[{'kind': 'nope'}, 1]], 'unknown request kind'),
                ([[{'kind': 'whole', 'count': 0}, 1]], 'count'),
                ([[{'kind': 'mig', 'profile': '1g.5gb'}, -1]],
                 'weight must be a number'),
                ([[{'kind': 'mig', 'profile': '1g.5gb'}, True]],
                 'weight must be a number')):
            p = notification.DemandPayload(items=items)
            e = self.assertRaises(notification.PayloadError,
                                  notification.parse,
                                  notification.DEMAND_EVENT,
                                  p.to_primitive())
            self.assertIn(words, str(e))


# Keep pynvml imported: fakenvml copies its constants.
assert pynvml


class ClearVfTypesTest(testtools.TestCase):
    """A time-sliced re-carve clears the idle VFs typed otherwise."""

    PF = '0000:86:00.0'
    TYPES = {1061: 'NVIDIA H100-10C', 1062: 'NVIDIA H100-20C'}

    def setUp(self):
        super().setUp()
        from nova_gpu.agent import privsep
        from nova_gpu.tests.unit.agent import fakesys
        privsep.use_in_process()
        root = self.useFixture(fixtures.TempDir()).path
        self.fs = fakesys.FakeSysfs(root)
        self.fs.add_pci(self.PF, '0x2330')
        self.vfs = self.fs.add_vfs(self.PF, 3, self.TYPES)
        self.refs = {}
        lib = fakenvml.FakePynvml([fakenvml.FakeGpu(
            '00000000:86:00.0', 'NVIDIA H100 PCIe', 81920)])
        self.manager = devices.DeviceManager(
            sysfs.Sysfs(root), libvirt=self, nvml=nvml.Nvml(lib=lib))
        self.carver = carver_mod.Carver(
            self.manager, carver_mod.LayoutStore(
                self.useFixture(fixtures.TempDir()).path))
        self.model = CATALOG.model('H100-80GB')

    def domain_refs(self):  # the device manager's libvirt
        return dict(self.refs)

    def types(self):
        return [self.manager.sysfs.pci_function(v).current_vgpu_type
                for v in self.vfs]

    def test_other_types_cleared_same_type_and_used_kept(self):
        self.fs.set_vgpu_type(self.vfs[0], 1061)
        self.fs.set_vgpu_type(self.vfs[1], 1062)
        self.carver.apply(0, self.model, L.Layout(L.TIME_SLICED, 'H100-10C'))
        self.assertEqual([1061, 0, 0], self.types())
        self.carver.apply(0, self.model, L.Layout(L.PASSTHROUGH))
        self.assertEqual([0, 0, 0], self.types())
        # A VF a domain uses: refused, the layout not recorded.
        self.fs.set_vgpu_type(self.vfs[2], 1062)
        self.refs = {self.vfs[2]: ['guest']}
        self.assertRaises(errors.InUse, self.carver.apply, 0, self.model,
                          L.Layout(L.TIME_SLICED, 'H100-10C'))
        self.assertEqual([0, 0, 1062], self.types())
        self.assertEqual(L.Layout(L.PASSTHROUGH),
                         self.carver.store.load()[self.PF])
