import json

from nova_gpu.core import exceptions
from nova_gpu.core import fixtures
from nova_gpu.core import host as H
from nova_gpu.core import report
from tests.unit.core import base


class ReportTest(base.TestCase):

    def test_round_trip_keeps_topology_and_allocations(self):
        host = fixtures.hgx_host('c1', self.model('A100-40GB'), mig=True)
        slots = [H.Slot(0, H.MIG, ('3g.20gb', 4, 'A100-3-20C')),
                 H.Slot(1, H.MIG, ('1g.5gb', 6, None))]
        host.allocate(H.Placement('c1', tuple(slots)))
        devices = {0: [{'kind': 'mig', 'detail': ['3g.20gb', 4,
                                                  'A100-3-20C']}],
                   1: [{'kind': 'mig', 'detail': ['1g.5gb', 6, None]}]}
        data = report.host_to_dict(
            host, generation=3, devices=devices,
            providers={0: 'c1_pci_0000_18_00_0'})
        data = json.loads(json.dumps(data))
        back = report.host_from_dict(data, self.catalog)
        self.assertEqual(host.snapshot(), back.snapshot())
        for a, b in zip(host.gpus, back.gpus):
            self.assertEqual((a.address, a.numa_node, a.pcie_switch,
                              a.nvlink_peers, a.mig_enabled),
                             (b.address, b.numa_node, b.pcie_switch,
                              b.nvlink_peers, b.mig_enabled))
        self.assertEqual('c1_pci_0000_18_00_0',
                         report.providers_of(data)[0])

    def test_bad_reports_are_named(self):
        err = self.assertRaises(exceptions.InvalidRequest,
                                report.host_from_dict, {'version': 99},
                                self.catalog)
        self.assertIn('version', str(err))
        err = self.assertRaises(exceptions.InvalidRequest,
                                report.host_from_dict,
                                {'version': 1, 'host': 'c9',
                                 'gpus': [{'index': 0}]}, self.catalog)
        self.assertIn("'c9'", str(err))
        self.assertIn('model', str(err))
        self.assertRaises(exceptions.UnknownModel, report.host_from_dict,
                          {'version': 1, 'host': 'c9',
                           'gpus': [{'index': 0, 'model': 'Z80'}]},
                          self.catalog)
