"""The all-in-one demo, both policies, on the real in-process cloud.

One test boots the demo's whole request sequence once with nova-gpu and
once with stock Nova and checks what the demo prints.
"""

import collections

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

        # nova-gpu serves every request with the topology it asks for,
        # but for the L40S-16C that no longer fits the mixed-size L40S.
        self.assertEqual(['l40s-16c-mix-1'],
                         [s.name for s in ours.servers
                          if s.result != 'ACTIVE'])
        multi = [s for s in ours.servers if len(s.gpus) > 1]
        self.assertEqual(11, len(multi))
        for server in multi:
            self.assertTrue(server.topology_kept, server)
            self.assertEqual(int(scenario.flavors_by_name()[
                server.flavor].extra_specs['gpu:count']), len(server.gpus))
        for server in ours.booted:
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

        self.check_mixed_size(ours, stock)

        # GPU quota classes (what Nova's unified limits cap): the demo
        # project's whole GPUs and vGPUs per model as Placement counts
        # them, equal to the devices its servers got; none with stock.
        counted = collections.Counter()
        for server in ours.booted:
            model = scenario.model_of(scenario.flavors_by_name()[
                server.flavor]).upper().replace('-', '_')
            for device in server.devices:
                counted['CUSTOM_GPU_QUOTA_%s_%s' % (
                    model, 'WHOLE' if device == 'whole GPU' else 'VGPU')] += 1
        self.assertEqual(dict(counted), {
            rc: n for rc, n in ours.quota_usage.items()
            if rc != 'CUSTOM_GPU_QUOTA_MEMORY_MB'})
        self.assertGreater(ours.quota_usage['CUSTOM_GPU_QUOTA_MEMORY_MB'], 0)
        self.assertEqual({}, stock.quota_usage)

        # What the demo prints.
        table = render.placements(ours.servers, 'ours')
        for server in ours.servers:
            self.assertIn(server.name, table)
        self.assertIn('4x H100-40C, one NUMA node',
                      render.flavors(ours.servers, 'flavors'))
        # A 120-column terminal holds everything the demo prints.
        printed = []
        aio.print_outcome(ours, printed.append)
        aio.print_outcome(stock, printed.append)
        lines = '\n'.join(printed).splitlines()
        self.assertLessEqual(max(len(line) for line in lines), render.WIDTH,
                             [line for line in lines
                              if len(line) > render.WIDTH][:3])
        # Every path shows, each with the hostdev XML Nova wrote for one
        # server of it, and the device behind it.
        self.assertEqual({'vendor-VFIO VF', 'MIG-backed VF', 'VF mdev',
                          'PF mdev', 'passthrough'},
                         {path for _n, path, _x, _l in ours.hostdevs})
        by_name = {s.name: s for s in ours.servers}
        for name, path, xml, lines in ours.hostdevs:
            shown = by_name[name]
            hostdevs = render.hostdevs(xml)
            if path in ('VF mdev', 'PF mdev', 'MIG-backed VF'):
                self.assertIn('type="mdev"', hostdevs)
                self.assertIn('<address uuid=', hostdevs)
            else:
                self.assertIn('type="pci"', hostdevs)
                bus = shown.functions[0].split(':')[1]
                self.assertIn("bus=\"0x%s\"" % bus, hostdevs)
            self.assertEqual(len(shown.gpus), len(lines))
            for line, function in zip(lines, shown.functions):
                self.assertIn(function, line)
        vfio = [s for s in ours.servers if s.path == 'vendor-VFIO VF']
        self.assertTrue(vfio)
        for server in vfio:
            # The VF Nova's PCI tracker picked is under the GPU chosen.
            for gpu, vf in zip(server.gpus, server.functions):
                self.assertEqual(gpu.rsplit(':', 1)[0],
                                 vf.rsplit(':', 1)[0])
                self.assertNotEqual(gpu, vf)
        self.assertIn('vendor-VFIO VF', table)
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

        # The A100 host runs MIG: every vGPU there sits on its own VF and
        # on a MIG 2g.10gb GPU instance the host carved at a valid start
        # slice, no two on the same slice of one GPU.
        for outcome in (ours, stock):
            mig = [s for s in outcome.servers if s.host == 'a100-1']
            starts = collections.Counter()
            for server in mig:
                self.assertEqual('MIG-backed VF', server.path)
                for gpu, device in zip(server.gpus, server.devices):
                    prefix = 'A100-2-10C 2g.10gb@'
                    self.assertTrue(device.startswith(prefix), device)
                    start = int(device[len(prefix):])
                    self.assertIn(start, (0, 2, 4))
                    starts[gpu, start] += 1
            self.assertEqual({1}, set(starts.values()))
        self.assertEqual(7, sum(len(s.gpus) for s in ours.servers
                                if s.host == 'a100-1'))
        self.assertIn('A100-2-10C 2g.10gb@', table)
        self.assertIn('MIG slices', usage['a100-1'].layout)
        # Whole GPUs: both H200s of the NVLinked pair, passed through.
        (whole,) = [s for s in ours.servers if s.flavor == 'h200.x2']
        self.assertEqual('passthrough', whole.path)
        self.assertEqual(2, len(set(whole.gpus)))
        self.assertEqual(list(whole.gpus), list(whole.functions))
        # HGX H100 in Shared NVSwitch mode: each pair of whole H100s is
        # one of Fabric Manager's 2-GPU partitions, never the same one.
        table = {h.name: h for h in scenario.HOSTS}['hgx-1'].partitions
        pairs = [s for s in ours.servers if s.flavor == 'h100.x2']
        self.assertEqual(2, len(pairs))
        sets = []
        for server in pairs:
            self.assertEqual('hgx-1', server.host)
            # The harness numbers GPU g of a host on bus 0x?g.
            indices = frozenset(int(g.split(':')[1], 16) & 0xf
                                for g in server.gpus)
            self.assertIn(indices, {frozenset(p.gpus)
                                    for p in table.partitions
                                    if len(p.gpus) == 2})
            sets.append(indices)
        self.assertTrue(sets[0].isdisjoint(sets[1]))
        # GPUDirect RDMA: the whole H100 and its NIC VF share a PCIe
        # switch (the harness's HGX layout).
        (rdma,) = [s for s in ours.servers if s.flavor == 'h100.rdma']
        self.assertEqual('hgx-1', rdma.host)

    def check_mixed_size(self, ours, stock):
        """Two sizes on the mixed-size L40S, a third refused by its slots."""
        by_name = {s.name: s for s in ours.servers}
        mixed = [s for s in ours.servers if s.flavor.endswith('.mix')]
        self.assertEqual(
            [('l40s-24c-mix-1', 'ACTIVE'), ('l40s-8c-mix-1', 'ACTIVE'),
             ('l40s-16c-mix-1', 'NoValidHost'),
             ('l40s-8c-mix-2', 'ACTIVE')],
            [(s.name, s.result) for s in mixed])
        booted = [s for s in mixed if s.result == 'ACTIVE']
        for server in booted:
            self.assertEqual('l40s-mix', server.host)
            self.assertEqual('vendor-VFIO VF', server.path)
        # One GPU, three VFs, each holding the size its flavor asked (the
        # type given at the guest's start): two sizes side by side, which
        # equal-size mode refuses.
        self.assertEqual(1, len({s.gpus for s in booted}))
        self.assertEqual(3, len({s.functions for s in booted}))
        self.assertEqual([('L40S-24C',), ('L40S-8C',), ('L40S-8C',)],
                         [s.devices for s in booted])
        # The L40S-16C is GpuFilter's refusal, by slots: 16 GB of frame
        # buffer are free (Placement's GPU memory class let it through),
        # but 6 of 8 slots are taken and no 4-slot placement is left.
        self.assertEqual(
            (('l40s-mix', 'mixed-size L40S has no free 4-slot placement '
              'for L40S-16C (holds 1 L40S-24C, 1 L40S-8C: 6 of 8 slots)'),),
            tuple((host, why.rsplit('; GPU 0000:50:00.0: ', 1)[-1])
                  for host, why in by_name['l40s-16c-mix-1'].why))
        printed = []
        aio.print_outcome(ours, printed.append)
        self.assertIn('  l40s-16c-mix-1 (GpuFilter on l40s-mix):',
                      '\n'.join(printed))
        self.assertIn('mixed-size L40S has no free 4-slot placement for '
                      'L40S-16C', ' '.join(' '.join(printed).split()))
        (use,) = [h for h in ours.hosts if h.name == 'l40s-mix']
        self.assertEqual('L40S mixed-size', use.model)
        self.assertEqual('3 (1 L40S-24C, 2 L40S-8C: 8 of 8 slots)',
                         use.layout)
        self.assertEqual(0.0, use.free_gpus)
        # Stock Nova cannot tell: it sends the L40S-16C to the full GPU,
        # where its VF cannot take the type (the qemu hook fails the
        # start) and the build fails.
        results = dict((s.name, s.result) for s in stock.servers
                       if s.flavor.endswith('.mix'))
        self.assertEqual('ERROR', results.pop('l40s-16c-mix-1'))
        self.assertEqual({'ACTIVE'}, set(results.values()))
