"""The all-in-one demo, both policies, on the real in-process cloud.

One test boots the demo's whole request sequence once with nova-gpu and
once with stock Nova (about 25 s each) and checks what the demo prints.
"""

import testtools

from nova_gpu.demo import aio
from nova_gpu.demo import render
from nova_gpu.demo import scenario


class DemoTest(testtools.TestCase):

    def test_same_requests_nova_gpu_against_stock(self):
        ours = aio.run(stock=False)
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
