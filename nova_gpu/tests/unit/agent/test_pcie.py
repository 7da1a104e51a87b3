"""The PCIe tree read from a fake sysfs of an HGX H100 8-GPU server."""

import os

import fixtures
import testtools

from nova_gpu.agent import discovery
from nova_gpu.agent import pcie
from nova_gpu.agent import sysfs
from nova_gpu.core import rdma
from nova_gpu.core import report
from nova_gpu.tests.unit.agent import fakesys
from nova_gpu.tests.unit.agent import hgx_pcie

NODE = 'hgx-1'
# ACS P2P Request Redirect + Completion Redirect + Source Validation, as
# a kernel with ACS enabled for isolation sets them; and the same with
# Direct Translated P2P on.
ACS_REDIRECT = 0x0001 | 0x0004 | 0x0008
ACS_DIRECT = ACS_REDIRECT | 0x0040


class HgxTreeTest(testtools.TestCase):

    def make(self, **kw):
        root = os.path.join(self.useFixture(fixtures.TempDir()).path, 'sys')
        fs = fakesys.FakeSysfs(root)
        self.nic_vfs = hgx_pcie.build(fs, **kw)
        self.fs = fs
        return sysfs.Sysfs(root)

    def tree(self, **kw):
        return pcie.read_tree(self.make(**kw), hgx_pcie.GPUS, NODE)

    def test_four_switches_each_with_two_gpus_and_two_nics(self):
        tree = self.tree()
        self.assertEqual(sorted(sw.upstream for sw in hgx_pcie.SWITCHES),
                         [s.id for s in tree.switches])
        for i, gpu in enumerate(hgx_pcie.GPUS):
            sw = hgx_pcie.switch_of(gpu)
            self.assertEqual((sw.upstream, sw.root), tree.gpus[i])
        self.assertEqual(list(hgx_pcie.NICS), [n.address for n in tree.nics])
        for nic in tree.nics:
            sw = hgx_pcie.switch_of(nic.address)
            self.assertEqual((sw.upstream, sw.root), (nic.switch, nic.root))
            self.assertEqual((8, 0), (nic.vfs, nic.vfs_used))
            self.assertEqual('15b3:1021', nic.device)
            self.assertEqual(report.pci_provider_name(NODE, nic.address),
                             nic.provider)
        self.assertEqual({'1000:c030'}, {s.device for s in tree.switches})
        # Two root complexes (one per socket), two switches each.
        self.assertEqual({'pci0000:10', 'pci0000:90'},
                         {s.root for s in tree.switches})

    def test_the_tree_is_the_layout(self):
        # What the core tests and the functional harness use.
        self.assertEqual(hgx_pcie.tree(NODE), self.tree())
        self.assertEqual(hgx_pcie.tree(NODE, without_nics=True),
                         self.tree(without_nics=True))

    def test_gpu_switch_agrees_with_the_gpu_entries(self):
        fs = self.make()
        tree = pcie.read_tree(fs, hgx_pcie.GPUS, NODE)
        for i, gpu in enumerate(hgx_pcie.GPUS):
            self.assertEqual(fs.pci_function(gpu).pcie_switch,
                             tree.gpus[i][0])

    def test_vfs_bound_to_vfio_pci_are_held(self):
        fs = self.make()
        nic = hgx_pcie.NICS[3]
        for vf in self.nic_vfs[nic][:3]:
            self.fs.bind_driver(vf, 'vfio-pci')
        tree = pcie.read_tree(fs, hgx_pcie.GPUS, NODE)
        held = {n.address: n.vfs_used for n in tree.nics}
        self.assertEqual(3, held[nic])
        self.assertEqual(3, sum(held.values()))

    def test_acs_unreadable_without_privileges(self):
        # The 64-byte header an unprivileged reader gets: unknown.
        self.assertEqual({None},
                         {s.acs_redirect for s in self.tree().switches})

    def test_acs_redirect_read_from_the_downstream_ports(self):
        tree = self.tree(acs_control=ACS_REDIRECT)
        self.assertEqual({True}, {s.acs_redirect for s in tree.switches})
        # Redirecting switches pair nothing at switch scope.
        self.assertIsNone(tree.gpu_domain(0, rdma.PCIE_SWITCH))
        self.assertEqual('pci0000:10', tree.gpu_domain(0, rdma.ROOT_COMPLEX))
        tree = self.tree(acs_control=ACS_DIRECT)
        self.assertEqual({False}, {s.acs_redirect for s in tree.switches})
        tree = self.tree(acs_control=0)
        self.assertEqual({False}, {s.acs_redirect for s in tree.switches})

    def test_acs_capability_walk(self):
        self.assertEqual(0x45, pcie.acs_control(fakesys.acs_config(0x45)))
        self.assertIsNone(pcie.acs_control(bytes(64)))
        self.assertIsNone(pcie.acs_control(bytes(4096)))
        # ACS second in the list, after an AER capability (ID 1).
        config = bytearray(4096)
        config[0x100:0x104] = (0x0001 | 1 << 16 | 0x148 << 20).to_bytes(
            4, 'little')
        config[0x148:0x150] = fakesys.acs_config(ACS_REDIRECT)[0x100:0x108]
        self.assertEqual(ACS_REDIRECT, pcie.acs_control(bytes(config)))
        self.assertTrue(pcie.redirects(ACS_REDIRECT))
        self.assertFalse(pcie.redirects(ACS_DIRECT))

    def test_board_without_nics(self):
        tree = self.tree(without_nics=True)
        self.assertEqual((), tree.nics)
        self.assertEqual(4, len(tree.switches))

    def test_gpus_without_a_switch(self):
        root = os.path.join(self.useFixture(fixtures.TempDir()).path, 'sys')
        fs = fakesys.FakeSysfs(root)
        # A GPU right on a root port: a root complex, no switch.
        fs.add_pci('0000:41:00.0', '0x2330', driver='vfio-pci')
        tree = pcie.read_tree(sysfs.Sysfs(root), ['0000:41:00.0'], NODE)
        self.assertEqual(((None, 'pci0000:40'),), tree.gpus)
        self.assertEqual((), tree.switches)

    def test_the_report_carries_the_tree(self):
        fs = self.make()
        inventory = discovery.Discovery(fs, host=NODE,
                                        pcie_tree=True).discover()
        data = inventory.report(generation=1)
        self.assertEqual(8, len(data['pcie']['gpus']))
        self.assertEqual(8, len(data['pcie']['nics']))
        parsed = report.parse(data, discovery.catalog_mod.load_catalog())
        self.assertEqual(pcie.read_tree(fs, hgx_pcie.GPUS, NODE),
                         parsed.host.pcie)
        without = discovery.Discovery(fs, host=NODE).discover().report()
        self.assertNotIn('pcie', without)
