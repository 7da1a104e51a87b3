"""The demo's picture of its GPUs (nova_gpu.demo.plot), without Nova.

An DemoRun as the demo builds it, with a host of each path (vendor-VFIO
VFs, MIG-backed VFs, VF mdev, PF mdev, passthrough), an idle GPU and a
refused server: which unit each server is drawn on, and the PNG.
"""

import os
import struct
import sys
import types
from unittest import mock

import fixtures
import testtools

from nova_gpu.demo import aio
from nova_gpu.demo import plot

try:
    import matplotlib  # noqa: F401
    HAVE_MATPLOTLIB = True
except ImportError:
    HAVE_MATPLOTLIB = False

PNG_SIGNATURE = b'\x89PNG\r\n\x1a\n'


def pci(bus, slot=0, function=0):
    return '0000:%02x:%02x.%x' % (bus, slot, function)


def vf(bus, n):
    """The n-th VF of the GPU on ``bus`` (the first is function 4)."""
    return pci(bus, (4 + n) // 8, (4 + n) % 8)


LAYOUTS = (
    plot.HostLayout('h100-1', 'H100-80GB', plot.VFIO, 4, 2, 'H100-40C'),
    plot.HostLayout('a100-1', 'A100-40GB', plot.VF_MDEV, 2, 8,
                    'A100-2-10C', mig=True),
    plot.HostLayout('l40s-1', 'L40S', plot.VF_MDEV, 1, 6, 'L40S-8C'),
    plot.HostLayout('t4-1', 'T4', plot.PF_MDEV, 2, 2, 'T4-8C'),
    plot.HostLayout('h200-1', 'H200-141GB', plot.PASSTHROUGH, 2, 1),
)


def server(name, host, gpus, functions, devices, path, result='ACTIVE'):
    return aio.ServerResult(name, 'flavor', 'asks', result, host=host,
                            gpus=tuple(gpus), functions=tuple(functions),
                            devices=tuple(devices), path=path)


def use(name, per_gpu, of):
    return aio.HostUse(name, 'model', len(per_gpu.split()), 0.0, 0.0, 0,
                       0.0, '%s (of %d each)' % (per_gpu, of))


def outcome():
    servers = [
        # Four GPUs: VF 1 of GPU 0 and 2, VF 0 of GPU 3; GPU 1 idle.
        server('x4', 'h100-1', [pci(0x10), pci(0x12), pci(0x13)],
               [vf(0x10, 1), vf(0x12, 1), vf(0x13, 0)],
               ['H100-40C'] * 3, 'vendor-VFIO VF'),
        server('one', 'h100-1', [pci(0x12)], [vf(0x12, 0)], ['H100-40C'],
               'vendor-VFIO VF'),
        server('mig-a', 'a100-1', [pci(0x30)], [vf(0x30, 0)],
               ['A100-2-10C 2g.10gb@2'], 'MIG-backed VF'),
        server('mig-b', 'a100-1', [pci(0x30), pci(0x31)],
               [vf(0x30, 1), vf(0x31, 0)],
               ['A100-2-10C 2g.10gb@0',
                'A100-2-10C 2g.10gb@4'], 'MIG-backed VF'),
        # The fifth VF is function 1 of the next slot.
        server('l40s', 'l40s-1', [pci(0x40)], [vf(0x40, 5)], ['L40S-8C'],
               'VF mdev'),
        server('t4-a', 't4-1', [pci(0x51)], [pci(0x51)], ['T4-8C'],
               'PF mdev'),
        server('t4-b', 't4-1', [pci(0x51)], [pci(0x51)], ['T4-8C'],
               'PF mdev'),
        server('h200', 'h200-1', [pci(0x60), pci(0x61)],
               [pci(0x60), pci(0x61)], ['whole GPU'] * 2, 'passthrough'),
        server('refused', None, [], [], [], None, result='NoValidHost'),
    ]
    hosts = [use('h100-1', '1 0 2 1', 2), use('a100-1', '2 1', 3),
             use('l40s-1', '1', 6), use('t4-1', '0 2', 2),
             use('h200-1', '1 1', 1)]
    return aio.DemoRun('nova-gpu', servers, hosts)


def held(units):
    """{GPU index: [(start, width, server)]} of the units servers hold."""
    return {gpu.index: [(u.start, u.width, u.server) for u in gpu.units
                        if u.server]
            for gpu in units.gpus}


class TestHostUnits(testtools.TestCase):

    def setUp(self):
        super().setUp()
        self.units = {h.layout.name: h
                      for h in plot.host_units(outcome(), LAYOUTS)}

    def test_vendor_vfio_vfs_on_their_gpu_and_vf(self):
        h100 = self.units['h100-1']
        # GPU 1 is idle: the used addresses go to the busy indices.
        self.assertEqual([pci(0x10), None, pci(0x12), pci(0x13)],
                         [g.address for g in h100.gpus])
        self.assertEqual({0: [(1, 1, 'x4')], 1: [],
                          2: [(0, 1, 'one'), (1, 1, 'x4')],
                          3: [(0, 1, 'x4')]}, held(h100))
        self.assertEqual('12:00.4', h100.gpus[2].units[0].label)

    def test_mig_slices(self):
        a100 = self.units['a100-1']
        self.assertEqual({0: [(0, 2, 'mig-b'), (2, 2, 'mig-a')],
                          1: [(4, 2, 'mig-b')]}, held(a100))
        idle = [u.start for u in a100.gpus[0].units if u.server is None]
        self.assertEqual([4, 5, 6, 7], idle)
        self.assertEqual(8, sum(u.width for u in a100.gpus[1].units))

    def test_vf_mdev_on_its_vf(self):
        l40s = self.units['l40s-1']
        self.assertEqual({0: [(5, 1, 'l40s')]}, held(l40s))
        self.assertEqual(6, len(l40s.gpus[0].units))

    def test_pf_mdev_fills_instances(self):
        t4 = self.units['t4-1']
        self.assertEqual([None, pci(0x51)], [g.address for g in t4.gpus])
        self.assertEqual({0: [], 1: [(0, 1, 't4-a'), (1, 1, 't4-b')]},
                         held(t4))

    def test_passthrough_whole_gpus(self):
        self.assertEqual({0: [(0, 1, 'h200')], 1: [(0, 1, 'h200')]},
                         held(self.units['h200-1']))

    def test_refused_server_drawn_nowhere(self):
        names = {u.server for h in self.units.values() for g in h.gpus
                 for u in g.units}
        self.assertNotIn('refused', names)

    def test_without_allocation_counts_used_gpus_come_first(self):
        result = outcome()
        result.hosts = []
        h100 = plot.host_units(result, LAYOUTS[:1])[0]
        self.assertEqual([pci(0x10), pci(0x12), pci(0x13), None],
                         [g.address for g in h100.gpus])

    def test_more_gpus_than_the_host_has(self):
        small = plot.HostLayout('h100-1', 'H100-80GB', plot.VFIO, 2, 2,
                                'H100-40C')
        self.assertRaises(plot.LayoutError, plot.host_units, outcome(),
                          [small])

    def test_more_devices_than_units(self):
        one = plot.HostLayout('t4-1', 'T4', plot.PF_MDEV, 2, 1, 'T4-8C')
        self.assertRaises(plot.LayoutError, plot.host_units, outcome(),
                          [one])


class TestLayoutOf(testtools.TestCase):

    def spec(self, **kwargs):
        values = dict(name='h', model='A100-40GB', gpus=4, path='vf_mdev',
                      vgpu_type='A100-2-10C', mig=True, vfs=None)
        values.update(kwargs)
        spec = types.SimpleNamespace(**values)
        spec.vf_count = lambda: spec.vfs or 3
        return spec

    def test_units_per_path(self):
        self.assertEqual(8, plot.layout_of(self.spec()).units)
        self.assertEqual(3, plot.layout_of(self.spec(mig=False)).units)
        self.assertEqual(2, plot.layout_of(self.spec(
            model='T4', path='pf_mdev', vgpu_type='T4-8C',
            mig=False)).units)
        self.assertEqual(1, plot.layout_of(self.spec(
            model='H200-141GB', path='passthrough', vgpu_type=None,
            mig=False)).units)

    def test_title_names_model_and_path(self):
        title = plot.layout_of(self.spec()).title
        self.assertIn('A100-40GB', title)
        self.assertIn('SR-IOV, mdev on VFs', title)
        self.assertIn('8 MIG slices per GPU', title)

    def test_file_name(self):
        self.assertEqual('nova-gpu-demo-stock-nova.png',
                         plot.file_name('stock Nova'))
        self.assertEqual('nova-gpu-demo-nova-gpu.png',
                         plot.file_name('nova-gpu'))


def png_size(path):
    with open(path, 'rb') as f:
        head = f.read(24)
    if head[:8] != PNG_SIGNATURE or head[12:16] != b'IHDR':
        return None
    return struct.unpack('>II', head[16:24])


class TestWithoutMatplotlib(testtools.TestCase):

    def test_report_says_how_to_install_it(self):
        # None in sys.modules makes the import fail, as when not installed.
        patch = mock.patch.dict(sys.modules, {'matplotlib': None})
        patch.start()
        self.addCleanup(patch.stop)
        target = self.useFixture(fixtures.TempDir()).path
        line = plot.report(outcome(), target, [])
        self.assertIn('pip install matplotlib', line)
        self.assertEqual([], os.listdir(target))


@testtools.skipUnless(HAVE_MATPLOTLIB, 'matplotlib is not installed')
class TestDraw(testtools.TestCase):

    def setUp(self):
        super().setUp()
        self.dir = self.useFixture(fixtures.TempDir()).path

    def test_png_written(self):
        path = os.path.join(self.dir, 'out.png')
        hosts = plot.draw(outcome(), LAYOUTS, path)
        size = png_size(path)
        self.assertIsNotNone(size, 'not a PNG')
        width, height = size
        # A row per host, four GPUs wide at most.
        self.assertGreater(width, 600)
        self.assertGreater(height, 100 * len(LAYOUTS))
        self.assertLess(width * height, 4000 * 4000)
        self.assertEqual([h.name for h in LAYOUTS],
                         [h.layout.name for h in hosts])

    def test_report_names_the_file(self):
        target = os.path.join(self.dir, 'plots')
        specs = [types.SimpleNamespace(
            name='h200-1', model='H200-141GB', gpus=2, path='passthrough',
            vgpu_type=None, mig=False)]
        line = plot.report(outcome(), target, specs)
        path = os.path.join(target, 'nova-gpu-demo-nova-gpu.png')
        self.assertIn(path, line)
        self.assertIsNotNone(png_size(path))

    def test_report_does_not_stop_the_demo(self):
        # A host with fewer GPUs than its servers use: one line, no PNG.
        specs = [types.SimpleNamespace(
            name='h200-1', model='H200-141GB', gpus=1, path='passthrough',
            vgpu_type=None, mig=False)]
        line = plot.report(outcome(), self.dir, specs)
        self.assertIn('no plot of nova-gpu drawn', line)
        self.assertEqual([], os.listdir(self.dir))
