"""The view with gpu:rdma: Placement's candidates kept only where each
GPU's NIC VF comes from a NIC under its PCIe switch (``core.rdma``), on
the HGX H100 layout of ``tests/unit/agent/hgx_pcie.py``.
"""

from nova_gpu.core import report as report_mod
from nova_gpu.scheduler import gpu_spec
from nova_gpu.tests.unit.agent import hgx_pcie
from nova_gpu.tests.unit.core import test_rdma
from nova_gpu.tests.unit.scheduler import base

RDMA = gpu_spec.parse({'gpu:kind': 'whole', 'gpu:rdma': 'true',
                       'pci_passthrough:alias': 'nvidia-gpu:1,rdma-vf:1'},
                      base.CATALOG)
PLAIN = gpu_spec.parse({'gpu:kind': 'whole',
                        'pci_passthrough:alias': 'nvidia-gpu:1'},
                       base.CATALOG)


class SpecObj:
    """What the view reads of a Nova RequestSpec."""

    instance_uuid = 'i0'
    num_instances = 1


class RdmaViewTest(base.TestCase):

    def add_hgx(self, nodename, **tree_kw):
        host = test_rdma.hgx(base.CATALOG, nodename=nodename, **tree_kw)
        host.name = nodename
        data = report_mod.host_to_dict(host, nodename, 1, providers={
            i: [report_mod.provider_dict(
                report_mod.pci_provider_name(nodename, g.address),
                report_mod.PCI_DEVICE, g.address,
                report_mod.WHOLE_GPU_RC)] for i, g in enumerate(host.gpus)})
        asked = []

        def resolver(node, names):
            asked.extend(names)
            return {n: 'rp-' + n for n in names}
        self.view.resolver = resolver
        entry = self.view.ingest(data)
        self.asked = asked
        return entry

    def candidate(self, nodename, gpu, nic):
        return {'allocations': {
            'rp-' + report_mod.pci_provider_name(
                nodename, hgx_pcie.GPUS[gpu]): {
                    'resources': {report_mod.WHOLE_GPU_RC: 1}},
            'rp-' + report_mod.pci_provider_name(
                nodename, hgx_pcie.NICS[nic]): {
                    'resources': {'CUSTOM_RDMA_NIC_VF': 1}},
            'root-' + nodename: {'resources': {'VCPU': 2}}}}

    def decide(self, nodename, spec, candidates):
        request = self.view.request(SpecObj(), spec)
        return self.view.decide(request, nodename, 0, None, candidates)

    def test_nic_providers_resolved(self):
        entry = self.add_hgx('h1')
        for nic in hgx_pcie.NICS:
            name = report_mod.pci_provider_name('h1', nic)
            self.assertIn(name, self.asked)
            self.assertEqual(nic, entry.nic_uuids['rp-' + name])
        self.assertEqual({hgx_pcie.NICS[2]: 1}, entry.nic_vfs(
            self.candidate('h1', 0, 2)))

    def test_only_candidates_pairing_gpu_and_nic_are_kept(self):
        self.add_hgx('h1')
        # GPU 0 with a NIC of switch 1, GPU 3 with one of switch 1 (its
        # own), GPU 0 with one of switch 0 (its own).
        candidates = [self.candidate('h1', 0, 2), self.candidate('h1', 3, 2),
                      self.candidate('h1', 0, 1)]
        decision = self.decide('h1', RDMA, candidates)
        self.assertIsNone(decision.why)
        self.assertEqual([1, 2], sorted(decision.order))
        # Without gpu:rdma every candidate serves.
        self.assertEqual(3, len(self.decide('h1', PLAIN, candidates).order))

    def test_no_candidate_pairs_says_why(self):
        self.add_hgx('h1')
        decision = self.decide('h1', RDMA, [self.candidate('h1', 0, 2),
                                            self.candidate('h1', 7, 0)])
        self.assertEqual((), decision.order)
        self.assertIn('Placement offered no candidate whose RDMA NIC VFs '
                      'sit under the same PCIe switch as its GPUs',
                      decision.why)

    def test_hosts_alike_but_for_their_nics_do_not_share_a_ranking(self):
        # Same GPUs in the same state; on 'far' every VF is held. The
        # ranking of one must not stand for the other.
        far = self.add_hgx('far', used={n: 8 for n in range(8)})
        near = self.add_hgx('near')
        self.assertEqual((), self.view.ranking(far, RDMA).items)
        self.assertIn('unpaired GPUs', self.view.ranking(far, RDMA).why)
        self.assertTrue(self.view.ranking(near, RDMA).items)

    def test_nic_providers_asked_again_until_placement_has_them(self):
        asked = []

        def resolver(node, names):
            asked.append(names)
            # At first Placement has the GPUs' providers, not the NICs'.
            return {n: 'rp-' + n for n in names
                    if len(asked) > 1 or n in entry.providers}
        entry = self.add_hgx('h1')
        self.view.resolver = resolver
        data = report_mod.host_to_dict(entry.host, 'h1', 2, providers={
            i: [report_mod.provider_dict(name, report_mod.PCI_DEVICE,
                                         entry.host.gpus[i].address,
                                         report_mod.WHOLE_GPU_RC)]
            for name, i in entry.providers.items()})
        self.view.remove('h1')
        entry = self.view.ingest(data)
        self.assertIsNone(entry.nic_uuids)
        data['generation'] = 3
        entry = self.view.ingest(data)
        self.assertEqual(2, len(asked))
        self.assertEqual(8, len(entry.nic_uuids))
