"""GPU and NIC together for GPUDirect RDMA, end to end through Nova.

Two HGX H100 hosts of whole GPUs (passthrough) with eight ConnectX-7 NICs
each, four VFs per NIC in ``[pci] device_spec`` (PCI in Placement: one
provider per NIC PF holding its VFs), the PCIe layout of the agent's fake
sysfs (``tests/unit/agent/hgx_pcie.py``: four switches, two GPUs and two
NICs each). On ``hgx-far`` the NICs hang below the other socket's
switches (2 and 3), the GPUs below switches 0 and 1 only: no GPU pairs
with a NIC under its switch. A flavor with ``gpu:rdma=true`` asks one GPU
and one VF of the ``rdma-vf`` alias; the guest's GPU and VF are read from
the domain XML Nova wrote.
"""

from nova_gpu.tests.harness import cloud

NEAR = cloud.RdmaLayout.hgx_h100()
FAR = cloud.RdmaLayout(gpu_switches=(0, 0, 0, 0, 1, 1, 1, 1),
                       nic_switches=(2, 2, 2, 2, 3, 3, 3, 3),
                       roots=NEAR.roots)
HOSTS = (
    cloud.GpuHost('hgx', 'H100-80GB', gpus=8, path=cloud.PASSTHROUGH,
                  rdma=NEAR),
    cloud.GpuHost('hgx-far', 'H100-80GB', gpus=8, path=cloud.PASSTHROUGH,
                  rdma=FAR),
)


class RdmaPairsTest(cloud.GpuCloudTestCase):
    HOSTS = HOSTS

    def setUp(self):
        super().setUp()
        self.flavor = self.create_gpu_flavor({'gpu:kind': 'whole',
                                              'gpu:rdma': 'true'})

    def pair(self, server):
        """(host, GPU index, switch of the GPU, switch of the guest's VF)."""
        host = self.admin_api.get_server(server['id'])[
            'OS-EXT-SRV-ATTR:host']
        (gpu,) = self.gpus_of(server)
        _uuids, addresses = cloud.hostdev_refs(self.domain_xml(server))
        layout = {h.name: h for h in HOSTS}[host].rdma
        nics = [s for _pf, vfs, s in self.rdma_nics(host)
                if addresses & set(vfs)]
        self.assertEqual(1, len(nics), 'the guest has one NIC VF')
        return host, gpu, layout.gpu_switches[gpu], nics[0]

    def test_each_gpu_gets_a_vf_under_its_switch(self):
        seen = set()
        for _ in range(3):
            server = self.boot(self.flavor, host='hgx')
            host, gpu, gpu_switch, nic_switch = self.pair(server)
            self.assertEqual('hgx', host)
            self.assertEqual(gpu_switch, nic_switch,
                             'GPU %d is under switch %d, its VF under %d'
                             % (gpu, gpu_switch, nic_switch))
            seen.add(gpu)
        self.assertEqual(3, len(seen))

    def test_host_without_pairable_nics_is_refused_with_the_reason(self):
        server = self.boot(self.flavor, host='hgx-far',
                           expected_state='ERROR')
        self.assertIn('No valid host', server['fault']['message'])
        self.assertIn('0 GPU(s) can be paired with a free NIC VF under the '
                      'same PCIe switch, 1 needed; unpaired GPUs: 0, 1, 2, '
                      '3, 4, 5, 6, 7', self.stdlog.logger.output)

    def test_the_chosen_host_is_the_one_that_pairs(self):
        # Placement offers both hosts (each has GPUs and NIC VFs); only
        # hgx pairs them.
        for _ in range(2):
            host, _gpu, gpu_switch, nic_switch = self.pair(
                self.boot(self.flavor))
            self.assertEqual(('hgx', gpu_switch), (host, nic_switch))

    def test_two_gpus_each_with_a_vf_under_its_switch(self):
        # Two GPUs, two VFs: 49 GPU pairs (set traits) times 64 NIC PF
        # pairs per host in Placement, every GPU's switch among the VFs'.
        flavor = self.create_gpu_flavor({'gpu:kind': 'whole',
                                         'gpu:count': '2',
                                         'gpu:rdma': 'true'})
        for _ in range(2):
            server = self.boot(flavor, host='hgx')
            gpus = self.gpus_of(server)
            _uuids, addresses = cloud.hostdev_refs(self.domain_xml(server))
            nic_switches = sorted(s for _pf, vfs, s in self.rdma_nics('hgx')
                                  for vf in vfs if vf in addresses)
            self.assertEqual(sorted(NEAR.gpu_switches[g] for g in gpus),
                             nic_switches)
