"""GPUDirect RDMA pairing (core.rdma) in the core, the engine, the report
and the flavor grammar, on the HGX H100 8-GPU layout (4 PCIe switches, 2
GPUs and 2 ConnectX-7 NICs each: ``tests/unit/agent/hgx_pcie.py``).
"""

from nova_gpu.core import engine as engine_mod
from nova_gpu.core import exceptions
from nova_gpu.core import flavor
from nova_gpu.core import host as H
from nova_gpu.core import notification
from nova_gpu.core import rdma
from nova_gpu.core import report
from nova_gpu.core import request as R
from nova_gpu.tests.unit.agent import hgx_pcie
from nova_gpu.tests.unit.core import base

SWITCH = rdma.PCIE_SWITCH
ROOT = rdma.ROOT_COMPLEX


def hgx(catalog, **tree_kw):
    """The HGX H100 board with its PCIe tree (``hgx_pcie.tree``)."""
    model = catalog.model('H100-80GB')
    gpus = [H.Gpu(i, model, address=a, numa_node=i // 4,
                  pcie_switch=hgx_pcie.switch_of(a).upstream)
            for i, a in enumerate(hgx_pcie.GPUS)]
    return H.Host('hgx', gpus, 224000, 2 ** 21,
                  pcie=hgx_pcie.tree(**tree_kw))


def whole(count=1, scope=SWITCH):
    return R.GpuRequest(H.WHOLE, count=count, rdma=scope)


def take(host, *indices):
    host.allocate(H.Assignment(host.name, tuple(
        H.Slot(i, H.WHOLE) for i in indices)))


# Both NICs of switch 0 (GPUs 0, 1) with every VF held.
SWITCH0_FULL = {0: 8, 1: 8}


class PairingTest(base.TestCase):

    def test_each_gpu_pairs_under_its_switch(self):
        host = hgx(self.catalog)
        for i in range(8):
            self.assertTrue(rdma.pairable(host, [i], SWITCH))
        self.assertTrue(rdma.pairable(host, range(8), SWITCH))
        self.assertEqual(8, rdma.free_pairs(host.pcie, SWITCH, range(8)))

    def test_vfs_counted_per_switch(self):
        # One VF left under switch 0: one of its GPUs pairs, not both.
        host = hgx(self.catalog, used={0: 8, 1: 7})
        self.assertTrue(rdma.pairable(host, [0], SWITCH))
        self.assertFalse(rdma.pairable(host, [0, 1], SWITCH))
        self.assertTrue(rdma.pairable(host, [0, 2], SWITCH))
        self.assertEqual(7, rdma.free_pairs(host.pcie, SWITCH, range(8)))

    def test_root_complex_scope_pairs_across_switches(self):
        host = hgx(self.catalog, used=SWITCH0_FULL)
        self.assertFalse(rdma.pairable(host, [0], SWITCH))
        # Switch 1's NICs share socket 0's root complex.
        self.assertTrue(rdma.pairable(host, [0, 1], ROOT))
        self.assertEqual('pci0000:10', host.pcie.gpu_domain(0, ROOT))

    def test_acs_redirect_pairs_nothing_under_the_switch(self):
        host = hgx(self.catalog, acs_redirect=True)
        self.assertFalse(rdma.pairable(host, [0], SWITCH))
        self.assertTrue(rdma.pairable(host, [0], ROOT))
        why = rdma.why_not(host, 1, SWITCH)
        self.assertIn('ACS redirects peer-to-peer', why)

    def test_match_names_the_nic_of_each_gpu(self):
        tree = hgx_pcie.tree()
        nic0, nic2 = hgx_pcie.NICS[0], hgx_pcie.NICS[2]
        self.assertEqual(([(0, nic0), (2, nic2)], []),
                         rdma.match(tree, [0, 2], {nic0: 1, nic2: 1},
                                    SWITCH))
        # A VF of switch 1's NIC cannot serve GPU 0 at switch scope...
        self.assertEqual(([(2, nic2)], [0]),
                         rdma.match(tree, [0, 2], {nic2: 2}, SWITCH))
        # ... but can at root-complex scope.
        self.assertEqual(([(0, nic2), (2, nic2)], []),
                         rdma.match(tree, [0, 2], {nic2: 2}, ROOT))

    def test_no_tree_or_no_nics(self):
        host = hgx(self.catalog, without_nics=True)
        self.assertFalse(rdma.pairable(host, [0], SWITCH))
        self.assertIn('no RDMA NIC reported', rdma.why_not(host, 1, SWITCH))
        host.pcie = None
        self.assertFalse(rdma.pairable(host, [0], SWITCH))
        self.assertIn('no PCIe tree reported',
                      rdma.why_not(host, 1, SWITCH))

    def test_bad_trees_are_named(self):
        nic = rdma.Nic('0000:15:00.0', '0000:11:00.0', 'pci0000:10', 8, 9)
        sw = rdma.Switch('0000:11:00.0')
        for args, words in (
                (([(None, None)], [nic], [sw]), '9 of 8 VFs used'),
                (([('0000:99:00.0', None)], [], [sw]),
                 'GPU 0: switch 0000:99:00.0'),
                (([], [nic._replace(vfs_used=0)] * 2, [sw]), 'listed twice'),
                (([], [], [sw, sw]), 'switch 0000:11:00.0 listed twice'),
                (([], [nic._replace(vfs_used=0, switch='0000:aa:00.0')],
                  [sw]), 'switch 0000:aa:00.0 is not among')):
            err = self.assertRaises(exceptions.InvalidRequest,
                                    rdma.PcieTree, *args)
            self.assertIn(words, str(err))


class EngineTest(base.TestCase):

    def setUp(self):
        super().setUp()
        self.engine = engine_mod.PlacementEngine()

    def test_rdma_gpu_goes_where_a_nic_vf_is_free(self):
        host = hgx(self.catalog, used=SWITCH0_FULL)
        for choice in self.engine.rank(host, whole()):
            self.assertNotIn(choice.placement.gpus[0], (0, 1))
        self.assertIsNone(self.engine.evaluate(host, whole(), (0,)))
        self.assertIsNotNone(self.engine.evaluate(host, whole(), (2,)))
        # At root-complex scope GPU 0 pairs with switch 1's NICs.
        self.assertIsNotNone(self.engine.evaluate(host, whole(1, ROOT),
                                                  (0,)))

    def test_refusal_names_the_unpaired_gpus(self):
        host = hgx(self.catalog, used={n: 8 for n in range(8)})
        self.assertEqual([], self.engine.rank(host, whole()))
        why = self.engine.why_not(host, whole())
        self.assertIn('0 GPU(s) can be paired with a free NIC VF under the '
                      'same PCIe switch, 1 needed', why)
        self.assertIn('unpaired GPUs: 0, 1, 2, 3, 4, 5, 6, 7', why)
        err = self.assertRaises(exceptions.NoFit, self.engine.best, host,
                                whole())
        self.assertIn('unpaired GPUs', str(err))
        # Counted as a topology refusal in gpu.placement.refused.
        for text in (why, rdma.why_not(hgx(self.catalog, without_nics=True),
                                       1, SWITCH)):
            self.assertEqual(notification.TOPOLOGY,
                             notification.reason_of(text))

    def test_eight_gpus_need_eight_pairs(self):
        host = hgx(self.catalog)
        best = self.engine.best(host, whole(8))
        self.assertEqual(tuple(range(8)), best.placement.gpus)
        host = hgx(self.catalog, used={7: 8})
        # Switch 3 has one NIC's VFs left: still 8 pairs.
        self.assertIsNotNone(self.engine.evaluate(host, whole(8),
                                                  tuple(range(8))))
        host = hgx(self.catalog, used={6: 8, 7: 7})
        self.assertIsNone(self.engine.evaluate(host, whole(8),
                                               tuple(range(8))))
        self.assertIn('7 GPU(s) can be paired',
                      self.engine.why_not(host, whole(8)))

    def test_plain_request_keeps_pairs_free(self):
        # Switch 3's NICs are full: GPUs 6 and 7 pair with nothing, so a
        # request without RDMA takes one of them and breaks no pair.
        host = hgx(self.catalog, used={6: 8, 7: 8})
        best = self.engine.best(host, R.GpuRequest(H.WHOLE))
        self.assertIn(best.placement.gpus[0], (6, 7))
        self.assertEqual(0, rdma.lost_pairs(host, SWITCH, range(8), (6,),
                                            False))
        self.assertEqual(1, rdma.lost_pairs(host, SWITCH, range(8), (0,),
                                            False))
        # Without the NICs every GPU is alike (lowest index first).
        host = hgx(self.catalog, without_nics=True)
        self.assertEqual(
            (0,), self.engine.best(host, R.GpuRequest(H.WHOLE))
            .placement.gpus)

    def test_rdma_request_costs_only_its_own_pairs(self):
        host = hgx(self.catalog)
        take(host, 0)
        # GPU 1 is the last free GPU beside switch 0's NICs: an RDMA
        # request takes its pair and breaks no other.
        self.assertEqual(0, rdma.lost_pairs(
            host, SWITCH, [i for i in range(8) if i != 0], (1,), True))

    def test_root_complex_engine_scope_for_plain_requests(self):
        engine = engine_mod.PlacementEngine(rdma_scope=ROOT)
        host = hgx(self.catalog, used={4: 8, 5: 8, 6: 8, 7: 8})
        best = engine.best(host, R.GpuRequest(H.WHOLE))
        # Socket 1's root complex has no free VF: its GPUs break no pair.
        self.assertIn(best.placement.gpus[0], (4, 5, 6, 7))


class ReportTest(base.TestCase):

    def report(self, host):
        return report.host_to_dict(host, generation=1)

    def test_round_trip(self):
        host = hgx(self.catalog, used={3: 2}, acs_redirect=False)
        parsed = report.parse(self.report(host), self.catalog)
        self.assertEqual(host.pcie, parsed.host.pcie)
        self.assertEqual(2, parsed.host.pcie.nics[3].vfs_used)

    def test_absent_is_none(self):
        host = hgx(self.catalog)
        host.pcie = None
        data = self.report(host)
        self.assertNotIn('pcie', data)
        self.assertIsNone(report.parse(data, self.catalog).host.pcie)

    def test_bad_fields_are_named(self):
        host = hgx(self.catalog)
        for change, field, words in (
                (lambda p: p['nics'][0].update(vfs=300), 'pcie.nics[0].vfs',
                 'must be in 0..256'),
                (lambda p: p['nics'][0].update(vfs_used=9), 'pcie',
                 '9 of 8 VFs used'),
                (lambda p: p['nics'][0].update(address='nic0'),
                 'pcie.nics[0].address', 'not a valid PCI address'),
                (lambda p: p['nics'][0].update(device='15B3:1021'),
                 'pcie.nics[0].device', 'must be vendor:device'),
                (lambda p: p['switches'][0].update(acs_redirect='yes'),
                 'pcie.switches[0].acs_redirect', 'true or false'),
                (lambda p: p['gpus'][1].update(index=0),
                 'pcie.gpus[1].index', 'listed twice'),
                (lambda p: p['gpus'][0].update(index=9),
                 'pcie.gpus[0].index', 'not in the report'),
                (lambda p: p['nics'].extend([p['nics'][0]] * 64),
                 'pcie.nics', 'more than 64 entries'),
                (lambda p: p.pop('gpus'), 'pcie.gpus', 'missing'),
                (lambda p: p['nics'][0].update(switch='0000:ee:00.0'),
                 'pcie', 'switch 0000:ee:00.0 is not among')):
            data = self.report(host)
            change(data['pcie'])
            err = self.assertRaises(report.ReportError, report.parse, data,
                                    self.catalog)
            self.assertIn(field, str(err))
            self.assertIn(words, str(err))

    def test_fuzzed_trees_are_refused_naming_the_field(self):
        # The reliability suite's bad trees (bench.reliability_reports).
        import copy
        import random

        from nova_gpu.bench import reliability_reports
        valid = reliability_reports._valid(self.catalog, 'h3', 3, 5)
        report.parse(valid, self.catalog)
        rng = random.Random(28)
        for _ in range(300):
            data = copy.deepcopy(valid)
            reliability_reports._bad_pcie(rng, data)
            err = self.assertRaises(report.ReportError, report.parse, data,
                                    self.catalog)
            self.assertTrue(err.field.startswith('pcie'), err)


class FlavorTest(base.TestCase):

    def parse(self, **specs):
        specs = {k.replace('__', ':'): v for k, v in specs.items()}
        return flavor.parse(specs, self.catalog)

    def test_rdma_true_asks_the_configured_locality(self):
        spec = self.parse(gpu__kind='whole', gpu__count='2',
                          gpu__rdma='true', pci_passthrough__alias=(
                              'nvidia-gpu-set2-0:1,nvidia-gpu-set2-1:1,'
                              'rdma-vf:2'))
        self.assertIsNone(spec.problem)
        self.assertEqual(SWITCH, spec.alternatives[0].rdma)
        names = flavor.PathNames(rdma_locality=ROOT, rdma_alias='cx7')
        spec = flavor.parse({'gpu:kind': 'whole', 'gpu:rdma': 'true',
                             'pci_passthrough:alias': 'nvidia-gpu:1,cx7:1'},
                            self.catalog, names=names)
        self.assertEqual(ROOT, spec.alternatives[0].rdma)
        self.assertIsNone(spec.problem)

    def test_placement_keys_add_one_nic_function_per_gpu(self):
        spec = self.parse(gpu__kind='whole', gpu__count='2',
                          gpu__rdma='true', pci_passthrough__alias='x:1')
        keys = flavor.placement_extra_specs(spec, flavor.PathNames())
        self.assertEqual('nvidia-gpu-set2-0:1,nvidia-gpu-set2-1:1,rdma-vf:2',
                         keys['pci_passthrough:alias'])
        spec = self.parse(gpu__profile='H100XM-80C', gpu__rdma='true')
        keys = flavor.placement_extra_specs(spec, flavor.PathNames())
        self.assertEqual({'resources:VGPU': '1',
                          'pci_passthrough:alias': 'rdma-vf:1'}, keys)

    def test_nic_count_must_match_the_gpus(self):
        spec = self.parse(gpu__kind='whole', gpu__rdma='true',
                          pci_passthrough__alias='nvidia-gpu:1')
        self.assertIn('one RDMA NIC function each, but 0 NIC function(s)',
                      spec.problem)
        self.assertIn('rdma-vf:1', spec.problem)

    def test_false_asks_nothing(self):
        spec = self.parse(gpu__rdma='false',
                          pci_passthrough__alias='nvidia-gpu:1')
        self.assertIsNone(spec.alternatives[0].rdma)
        self.assertFalse(spec.explicit)

    def test_bad_values_are_refused_naming_the_key(self):
        for value in ('True', 'yes', '1', 'pcie-switch', ''):
            err = self.assertRaises(flavor.ExtraSpecError,
                                    flavor.validate_value, 'gpu:rdma',
                                    value, self.catalog)
            self.assertIn('gpu:rdma=', str(err))
            self.assertIn('allowed: true, false', str(err))
        self.assertIn('gpu:rdma', flavor.KEYS)

    def test_request_refuses_unknown_locality(self):
        err = self.assertRaises(exceptions.InvalidRequest, R.GpuRequest,
                                H.WHOLE, rdma='socket')
        self.assertIn('unknown RDMA locality', str(err))
