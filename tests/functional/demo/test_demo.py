"""The all-in-one demo, both policies, on the real in-process cloud.

One test boots the demo's whole request sequence once with nova-gpu and
once with stock Nova (about 25 s each) and checks what the demo prints.
"""

import collections
import types

import fixtures
import testtools

from nova_gpu.core import host as host_mod
from nova_gpu.demo import aio
from nova_gpu.demo import render
from nova_gpu.demo import scenario
from nova_gpu.testing import cloud as cloud_mod


class DemoTest(testtools.TestCase):

    def _record_view_choices(self):
        """(server UUID, GPU index) -> MIG slots the view chose, per vGPU
        the harness placed on a MIG GPU.
        """
        record = {}
        choices = cloud_mod.GpuCloudTestCase._view_choices

        def chosen(case, hostname, consumer, index):
            found = record[consumer, index] = choices(case, hostname,
                                                      consumer, index)
            return found
        self.useFixture(fixtures.MonkeyPatch(
            'nova_gpu.testing.cloud.GpuCloudTestCase._view_choices',
            chosen))
        return record

    def test_same_requests_nova_gpu_against_stock(self):
        record = self._record_view_choices()
        ours = aio.run(stock=False)
        ours_choices = dict(record)
        record.clear()
        stock = aio.run(stock=True)
        names = [name for name, _flavor in scenario.requests()]
        self.assertEqual(names, [s.name for s in ours.servers])
        self.assertEqual(names, [s.name for s in stock.servers])

        # nova-gpu serves every request with the topology it asks for.
        self.assertEqual([], [s.name for s in ours.servers
                              if s.result != 'ACTIVE'])
        multi = [s for s in ours.servers if len(s.gpus) > 1]
        self.assertEqual(8, len(multi))
        for server in multi:
            self.assertTrue(server.topology_kept, server)
            self.assertEqual(int(scenario.flavors_by_name()[
                server.flavor].extra_specs['gpu:count']), len(server.gpus))
        for server in ours.servers:
            host = {h.name: h for h in scenario.HOSTS}[server.host]
            self.assertEqual(scenario.model_of(
                scenario.flavors_by_name()[server.flavor]), host.model)

        # Stock Nova ignores gpu:topology: the same multi-GPU servers land
        # across NUMA nodes or on GPUs without NVLink between them.
        kept = dict(ours.metrics())['  of them with the topology asked']
        stock_kept = dict(stock.metrics())[
            '  of them with the topology asked']
        self.assertLess(stock_kept, kept)
        self.assertTrue(any(len(s.numa) > 1 for s in stock.servers
                            if s.flavor == 'h100.40c.x4'))

        # What the demo prints.
        table = render.placements(ours.servers, 'ours')
        for server in ours.servers:
            self.assertIn(server.name, table)
        self.assertIn('4x H100-40C, one NUMA node', table)
        self.assertIsNotNone(ours.hostdev_xml)
        hostdevs = render.hostdevs(ours.hostdev_xml)
        self.assertIn('type="mdev"', hostdevs)
        self.assertIn('<address uuid=', hostdevs)
        shown = [s for s in ours.servers if s.name == ours.hostdev_server][0]
        self.assertEqual(1, len(ours.hostdev_devices))
        parent = 'pci_' + shown.gpus[0].replace(':', '_').replace('.', '_')
        self.assertIn('on GPU %s' % parent, ours.hostdev_devices[0])
        self.assertIn('(%s)' % shown.devices[0], ours.hostdev_devices[0])
        comparison = render.comparison(ours.metrics(), stock.metrics(), 'c')
        self.assertIn('with the topology asked', comparison)
        self.assertIn('+%d' % (kept - stock_kept), comparison)
        usage = {h.name: h for h in ours.hosts}
        self.assertEqual(sum(h.gpus for h in scenario.HOSTS),
                         sum(h.gpus for h in ours.hosts))
        # Every vGPU booted is accounted for on some GPU.
        vgpus = sum(len(s.gpus) for s in ours.servers)
        self.assertEqual(vgpus, sum(
            sum(int(n) for n in h.layout.split(' (')[0].split())
            for h in usage.values()))

        # The A100 host runs MIG: every vGPU there sits on a MIG 2g.10gb
        # instance at a valid start slice, no two on the same slice of one
        # GPU, and the slice is the one nova-gpu's scheduler chose.
        mig = [s for s in ours.servers if s.host == 'a100-1']
        self.assertEqual(7, sum(len(s.gpus) for s in mig))
        starts = collections.Counter()
        for server in mig:
            for gpu, device in zip(server.gpus, server.devices):
                prefix = 'A100-2-10C@MIG 2g.10gb slice '
                self.assertTrue(device.startswith(prefix), device)
                start = int(device[len(prefix):])
                self.assertIn(start, (0, 2, 4))
                starts[gpu, start] += 1
                # GPU index = PCI slot in the harness.
                found = ours_choices[server.uuid, int(gpu.split(':')[2][:2],
                                                      16)]
                self.assertEqual(start, found[0].detail[1])
        self.assertEqual({1}, set(starts.values()))
        self.assertIn('A100-2-10C@MIG 2g.10gb slice', table)
        self.assertIn('MIG slices', usage['a100-1'].layout)
        self.assertEqual(7, len(ours_choices))
        # Stock Nova's scheduler chooses no slice: the harness takes the
        # first free one.
        self.assertEqual(7, len(record))
        self.assertEqual([], [f for f in record.values() if f])


class MigSlotTest(testtools.TestCase):
    """The harness puts a MIG-backed vGPU where the scheduler chose."""

    def _devices(self, consumers, last=None, pending=()):
        case = type('Cloud', (cloud_mod.GpuCloudTestCase,),
                    {'runTest': lambda self: None})()
        case._mig_slots = collections.defaultdict(dict)
        case._vgpu_consumers = lambda provider: consumers
        entry = types.SimpleNamespace(last=last, pending=list(pending))
        case.gpu_view = types.SimpleNamespace(get=lambda name: entry)
        model = cloud_mod._CATALOG.model('A100-40GB')
        return [s.detail for s in case._mig_devices('a100', 'a100_pci', 1,
                                                    model, 'A100-2-10C')]

    @staticmethod
    def _placement(*starts):
        return host_mod.Placement('a100', tuple(
            host_mod.Slot(1, host_mod.MIG, ('2g.10gb', s, 'A100-2-10C'))
            for s in starts))

    def test_first_free_slice_without_a_choice(self):
        self.assertEqual([('2g.10gb', 0, 'A100-2-10C'),
                          ('2g.10gb', 2, 'A100-2-10C')],
                         self._devices({'a': 1, 'b': 1}))

    def test_slice_of_the_view_decision(self):
        ranked = types.SimpleNamespace(choice=types.SimpleNamespace(
            placement=self._placement(4)))
        last = types.SimpleNamespace(ranked=ranked, instance_uuid='b')
        self.assertEqual([('2g.10gb', 0, 'A100-2-10C'),
                          ('2g.10gb', 4, 'A100-2-10C')],
                         self._devices({'a': 1, 'b': 1}, last=last))

    def test_slice_of_a_pending_claim(self):
        self.assertEqual([('2g.10gb', 2, 'A100-2-10C')],
                         self._devices({'a': 1}, pending=[
                             (0, self._placement(2))]))

    def test_no_slice_left(self):
        self.assertRaisesRegex(RuntimeError, 'no MIG slot left',
                               self._devices, {'a': 1, 'b': 1, 'c': 1,
                                               'd': 1})
