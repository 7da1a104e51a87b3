import copy
import json

from nova_gpu.core import exceptions
from nova_gpu.core import fixtures
from nova_gpu.core import host as H
from nova_gpu.core import report
from nova_gpu.tests.unit.core import base


def _v2(catalog, **changes):
    """A valid version 2 report of a 4-GPU A100 host, MIG on GPU 1."""
    model = catalog.model('A100-40GB')
    host = fixtures.hgx_host('c1', model, gpus=4)
    host.gpus[1].mig_enabled = True
    providers = {
        0: [report.provider_dict('c1_pci_0000_18_00_0', report.PF_MDEV,
                                 '0000:18:00.0', vgpu_type='A100-10C')],
        1: [report.provider_dict('c1_pci_0000_38_00_4', report.VF_MDEV,
                                 '0000:38:00.4', vgpu_type='A100-3-20C',
                                 mig=('3g.20gb', 4))],
        2: [report.provider_dict(
            'c1_0000:58:00.0', report.PCI_POOL, '0000:58:00.0',
            'CUSTOM_PCI_10DE_20B0', 'A100-10C',
            vfs=['0000:58:00.4', '0000:58:00.5'])],
        3: [report.provider_dict('c1_0000:78:00.0', report.PCI_DEVICE,
                                 '0000:78:00.0', 'CUSTOM_PCI_10DE_20B0')],
    }
    data = report.host_to_dict(host, generation=3, providers=providers,
                               boot_id='run-1')
    data = json.loads(json.dumps(data))
    for path, value in changes.items():
        _set(data, path, value)
    return data


def _set(data, path, value):
    *parents, last = path.split('.')
    for part in parents:
        data = data[int(part)] if part.isdigit() else data[part]
    if value is _DELETE:
        del data[int(last) if last.isdigit() else last]
    else:
        data[int(last) if last.isdigit() else last] = value


_DELETE = object()


class ReportTest(base.TestCase):

    def test_round_trip_keeps_topology_and_allocations(self):
        host = fixtures.hgx_host('c1', self.model('A100-40GB'), gpus=4,
                                 mig=True)
        slots = [H.Slot(0, H.MIG, ('3g.20gb', 4, None)),
                 H.Slot(1, H.MIG, ('1g.5gb', 6, None))]
        host.allocate(H.Assignment('c1', tuple(slots)))
        devices = {0: [{'kind': 'mig', 'detail': ['3g.20gb', 4, None]}],
                   1: [{'kind': 'mig', 'detail': ['1g.5gb', 6, None]}]}
        data = report.host_to_dict(
            host, generation=3, devices=devices,
            providers={0: 'c1_pci_0000_18_00_0'})
        data = json.loads(json.dumps(data))
        self.assertEqual(2, data['version'])
        parsed = report.parse(data, self.catalog)
        back = parsed.host
        self.assertEqual(host.snapshot(), back.snapshot())
        for a, b in zip(host.gpus, back.gpus):
            self.assertEqual((a.address, a.numa_node, a.pcie_switch,
                              a.nvlink_peers, a.mig_enabled),
                             (b.address, b.numa_node, b.pcie_switch,
                              b.nvlink_peers, b.mig_enabled))
        # A single name is one PF mdev provider of class VGPU.
        self.assertEqual(
            (report.Provider('c1_pci_0000_18_00_0', report.PF_MDEV, 0,
                             '0000:18:00.0', 'VGPU'),), parsed.providers)

    def test_v2_lists_every_provider_kind(self):
        parsed = report.parse(_v2(self.catalog), self.catalog)
        self.assertEqual('run-1', parsed.boot_id)
        by_name = parsed.provider_map()
        self.assertEqual(
            [(0, 'pf_mdev'), (1, 'vf_mdev'), (2, 'pci_pool'),
             (3, 'pci_device')],
            [(p.gpu, p.kind) for p in parsed.providers])
        vf = by_name['c1_pci_0000_38_00_4']
        self.assertEqual(('3g.20gb', 4), vf.mig)
        self.assertEqual('A100-3-20C', vf.vgpu_type)
        pool = by_name['c1_0000:58:00.0']
        self.assertEqual(('0000:58:00.4', '0000:58:00.5'), pool.vfs)
        self.assertEqual('CUSTOM_PCI_10DE_20B0', pool.resource_class)

    def test_version_1_still_read(self):
        host = fixtures.pcie_host('old', self.model('T4'), gpus=2)
        data = report.host_to_dict(host, generation=7,
                                   providers={0: 'old_pci_0000_3b_00_0'},
                                   version=1)
        self.assertEqual('old_pci_0000_3b_00_0', data['gpus'][0]['provider'])
        self.assertNotIn('providers', data['gpus'][0])
        parsed = report.parse(data, self.catalog)
        self.assertEqual(1, parsed.version)
        self.assertEqual([('old_pci_0000_3b_00_0', 'pf_mdev', 0)],
                         [(p.name, p.kind, p.gpu) for p in parsed.providers])

    def test_gpus_may_come_in_any_order(self):
        data = _v2(self.catalog)
        data['gpus'].reverse()
        host = report.host_from_dict(data, self.catalog)
        self.assertEqual([0, 1, 2, 3], [g.index for g in host.gpus])

    def test_gpus_left_out(self):
        # GPUs the agent could not read: not in gpus, their providers
        # named for the scheduler to drop.
        data = _v2(self.catalog)
        self.assertEqual((), report.parse(data, self.catalog).left_out)
        names = report.left_out_providers('c1', '0000:98:00.0',
                                          ['0000:98:00.4', '0000:98:00.5'])
        self.assertEqual(['c1_pci_0000_98_00_0', 'c1_pci_0000_98_00_4',
                          'c1_pci_0000_98_00_5', 'c1_0000:98:00.0'], names)
        data['left_out'] = [{'address': '0000:98:00.0',
                             'reason': 'GPU is lost', 'providers': names}]
        parsed = report.parse(json.loads(json.dumps(data)), self.catalog)
        self.assertEqual((report.LeftOutGpu('0000:98:00.0', 'GPU is lost',
                                            tuple(names)),),
                         parsed.left_out)
        self.assertEqual(4, len(parsed.host.gpus))

    def test_extra_keys_are_ignored(self):
        data = _v2(self.catalog)
        data['agent'] = {'sources': {}}
        data['gpus'][0]['traits'] = ['CUSTOM_X']
        report.parse(data, self.catalog)

    def test_bad_reports_are_named(self):
        err = self.assertRaises(exceptions.InvalidRequest,
                                report.host_from_dict, {'version': 99},
                                self.catalog)
        self.assertIn('version', str(err))
        err = self.assertRaises(exceptions.InvalidRequest,
                                report.host_from_dict,
                                {'version': 1, 'host': 'c9', 'generation': 1,
                                 'gpus': [{'index': 0}]}, self.catalog)
        self.assertIn("'c9'", str(err))
        self.assertIn('gpus[0].model', str(err))
        err = self.assertRaises(exceptions.InvalidRequest,
                                report.host_from_dict,
                                {'version': 1, 'host': 'c9', 'generation': 1,
                                 'gpus': [{'index': 0, 'model': 'Z80'}]},
                                self.catalog)
        self.assertIn('gpus[0].model', str(err))
        self.assertIn('Z80', str(err))

    # Each of these was accepted (or raised a bare AttributeError /
    # TypeError / ValueError) before the schema; each names its field now.
    BAD = [
        ('gpus.0.pcie_switch', {}, 'gpus[0].pcie_switch'),
        ('gpus.0.numa_node', [0], 'gpus[0].numa_node'),
        ('gpus.0.numa_node', 7, 'gpus[0].numa_node'),
        ('gpus.0.numa_node', True, 'gpus[0].numa_node'),
        ('generation', float('inf'), 'generation'),
        ('generation', 1.5, 'generation'),
        ('generation', -1, 'generation'),
        ('generation', 2 ** 60, 'generation'),
        ('generation', '12', 'generation'),
        ('generation', _DELETE, 'generation'),
        ('host', 'h' * 300, 'host'),
        ('host', 5, 'host'),
        ('nodename', ['x'], 'nodename'),
        ('cpu_milli', None, 'cpu_milli'),
        ('numa_cells', {}, 'numa_cells'),
        ('numa_cells.0', 'x', 'numa_cells[0]'),
        ('numa_cells.1.id', 0, 'numa_cells[1].id'),
        ('gpus', {'index': 0}, 'gpus'),
        ('gpus.0', [], 'gpus[0]'),
        ('gpus.1.index', 0, 'gpus[1].index'),
        ('gpus.1.index', 4, 'gpus[1].index'),
        ('gpus.0.model', {'a': 1}, 'gpus[0].model'),
        ('gpus.0.address', 'not an address', 'gpus[0].address'),
        ('gpus.0.address', '0000:18:00.0\n', 'gpus[0].address'),
        ('gpus.0.nvlink_peers', [9], 'gpus[0].nvlink_peers[0]'),
        ('gpus.0.nvlink_peers', [0], 'gpus[0].nvlink_peers'),
        ('gpus.0.nvlink_peers', [1, 1], 'gpus[0].nvlink_peers'),
        ('gpus.0.nvlink_peers', 'x', 'gpus[0].nvlink_peers'),
        ('gpus.0.mig_enabled', 'yes', 'gpus[0].mig_enabled'),
        ('gpus.0.vgpu_types', 'A100-10C', 'gpus[0].vgpu_types'),
        ('gpus.0.vgpu_types', ['T4-4Q'], 'gpus[0].vgpu_types[0]'),
        ('gpus.0.vgpu_types', [['x']], 'gpus[0].vgpu_types[0]'),
        ('gpus.0.devices', [{'kind': 'vgpu', 'detail': ['x']}],
         'gpus[0].devices[0].detail'),
        ('gpus.0.devices', [{'kind': 'laser'}], 'gpus[0].devices[0].kind'),
        ('gpus.0.devices', [{'kind': ['vgpu']}], 'gpus[0].devices[0].kind'),
        ('gpus.0.devices', ['whole'], 'gpus[0].devices[0]'),
        ('gpus.0.devices', [{'kind': 'whole'}, {'kind': 'whole'}],
         'gpus[0].devices[1]'),
        ('gpus.0.devices', [{'kind': 'share', 'detail': 1001}],
         'gpus[0].devices[0].detail'),
        ('gpus.1.devices', [{'kind': 'mig', 'detail': ['3g.20gb', 5, None]}],
         'gpus[1].devices[0].detail[1]'),
        ('gpus.1.devices', [{'kind': 'mig', 'detail': ['3g.20gb', 4]}],
         'gpus[1].devices[0].detail'),
        ('gpus.1.devices', [{'kind': 'mig', 'detail': [{}, 0, None]}],
         'gpus[1].devices[0].detail[0]'),
        ('gpus.0.providers', 'c1_pci_0000_18_00_0', 'gpus[0].providers'),
        ('gpus.0.providers.0.kind', 'mdev', 'gpus[0].providers[0].kind'),
        ('gpus.0.providers.0.name', '', 'gpus[0].providers[0].name'),
        ('gpus.0.providers.0.name', _DELETE, 'gpus[0].providers[0].name'),
        ('gpus.0.providers.0.resource_class', 'vgpu-lower',
         'gpus[0].providers[0].resource_class'),
        ('gpus.0.providers.0.vgpu_type', 'H100-10C',
         'gpus[0].providers[0].vgpu_type'),
        ('gpus.1.providers.0.mig', ['3g.20gb', 1],
         'gpus[1].providers[0].mig[1]'),
        ('gpus.2.providers.0.vfs', ['0000:58:00.4', 7],
         'gpus[2].providers[0].vfs[1]'),
        ('gpus.3.providers.0.name', 'c1_0000:58:00.0', 'gpus[3].providers'),
        ('left_out', {}, 'left_out'),
        ('left_out', [[]], 'left_out[0]'),
        ('left_out', [{'reason': 'GPU is lost'}], 'left_out[0].address'),
        ('left_out', [{'address': '0000:18:00.0', 'reason': 'GPU is lost'}],
         'left_out[0].address'),
        ('left_out', [{'address': '0000:98:00.0'}], 'left_out[0].reason'),
        ('left_out', [{'address': '0000:98:00.0', 'reason': 'x' * 256}],
         'left_out[0].reason'),
        ('left_out', [{'address': '0000:98:00.0', 'reason': 'x',
                       'providers': 'c1_0000:98:00.0'}],
         'left_out[0].providers'),
        ('left_out', [{'address': '0000:98:00.0', 'reason': 'x',
                       'providers': [7]}], 'left_out[0].providers[0]'),
        ('left_out', [{'address': '0000:98:00.0', 'reason': 'x',
                       'providers': ['c1_pci_0000_18_00_0']}],
         'left_out[0].providers[0]'),
    ]

    def test_each_malformed_field_is_named(self):
        for path, value, field in self.BAD:
            data = _v2(self.catalog, **{path: copy.deepcopy(value)})
            try:
                report.parse(data, self.catalog)
            except report.ReportError as e:
                self.assertEqual(field, e.field, (path, value, str(e)))
                self.assertIn("'c1'" if path != 'host' else 'GPU report',
                              str(e))
                self.assertIsInstance(e, exceptions.InvalidRequest)
            else:
                self.fail('accepted %s = %r' % (path, value))

    def test_non_mig_model_cannot_be_in_mig_mode(self):
        host = fixtures.pcie_host('c2', self.model('T4'), gpus=1)
        data = report.host_to_dict(host, generation=1)
        data['gpus'][0]['mig_enabled'] = True
        err = self.assertRaises(report.ReportError, report.parse, data,
                                self.catalog)
        self.assertEqual('gpus[0].mig_enabled', err.field)

    def test_not_a_dict(self):
        for junk in (None, [], 'report', 3, float('nan')):
            err = self.assertRaises(report.ReportError, report.parse, junk,
                                    self.catalog)
            self.assertEqual('report', err.field)


class ProviderNamesTest(base.TestCase):
    """The names Nova 34 gives the providers (see the docstrings)."""

    def test_mdev_parent(self):
        self.assertEqual('cn1_pci_0000_3b_00_4',
                         report.mdev_provider_name('cn1', '0000:3B:00.4'))

    def test_pci_in_placement(self):
        self.assertEqual('cn1_0000:3B:00.0',
                         report.pci_provider_name('cn1', '0000:3b:00.0'))

    def test_default_resource_class(self):
        self.assertEqual('CUSTOM_PCI_10DE_2331',
                         report.pci_default_resource_class('10de', '2331'))
        self.assertEqual('CUSTOM_PCI_10DE_20B0',
                         report.pci_default_resource_class('0x10de',
                                                           '0x20b0'))


class PresentDevicesTest(base.TestCase):

    def test_in_use_and_idle_devices(self):
        raw = {'devices': [{'kind': 'whole'}],
               'idle_mdevs': [{'uuid': 'u1', 'detail': 'A100-10C'}],
               'idle_gpu_instances': [{'detail': ['3g.20gb', 4, None]}]}
        self.assertEqual(
            [{'kind': 'whole'},
             {'kind': 'vgpu', 'uuid': 'u1', 'detail': 'A100-10C'},
             {'kind': 'mig', 'detail': ['3g.20gb', 4, None]}],
            report.present_devices(raw))

    def test_malformed_lists_are_skipped(self):
        raw = {'devices': 'nope', 'idle_mdevs': 7,
               'idle_gpu_instances': [None, 'x', {'detail': ['1g.5gb', 0,
                                                             None]}]}
        self.assertEqual([{'kind': 'mig', 'detail': ['1g.5gb', 0, None]}],
                         report.present_devices(raw))
