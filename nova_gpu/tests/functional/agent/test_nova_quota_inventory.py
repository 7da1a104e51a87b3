"""nova-compute's own code takes the agent's GPU quota inventory.

With ``[gpu_agent] quota_inventory`` the agent's provider config gives the
compute node's root provider the classes of ``core.quota``; Nova's schema
(``nova.compute.provider_config.get_provider_configs``) accepts the file
and ``ResourceTracker._merge_provider_configs`` adds the inventory to the
provider tree at each periodic update, which is what Placement gets.
"""

import os
import tempfile
from unittest import mock
import uuid

import testtools

from nova_gpu.agent import discovery
from nova_gpu.agent import provider_config
from nova_gpu.agent import sysfs
from nova_gpu.core import catalog as catalog_mod
from nova_gpu.core import quota
from nova_gpu.tests.unit.agent import fakesys


class TestNovaTakesQuotaInventory(testtools.TestCase):

    def setUp(self):
        super().setUp()
        import nova.conf
        self.nova_conf = nova.conf.CONF
        tmp = tempfile.mkdtemp()
        fs = fakesys.FakeSysfs(os.path.join(tmp, 'sys'))
        fs.add_pci('0000:3b:00.0', '0x1eb8', numa_node=1)
        fs.add_mdev_type('0000:3b:00.0', 'nvidia-222', 'GRID T4-1Q', 16)
        fs.add_pci('0000:86:00.0', '0x2330', numa_node=0)
        for vf in fs.add_vfs('0000:86:00.0', 2, {1062: 'NVIDIA H100-20C'}):
            fs.set_vgpu_type(vf, 1062)
        fs.add_pci('0000:c1:00.0', '0x26b9', numa_node=1, driver='vfio-pci')
        self.inv = discovery.Discovery(sysfs.Sysfs(fs.root), host='cmp1',
                                       nodename='cmp1').discover()
        self.config_dir = os.path.join(tmp, 'provider_config')
        path = os.path.join(self.config_dir, 'nova-gpu.yaml')
        self.assertTrue(provider_config.write(self.inv, path, quota=True))
        self.assertFalse(provider_config.write(self.inv, path, quota=True))
        # Without it, the file is the traits-only one again.
        self.assertTrue(provider_config.write(self.inv, path))
        self.assertTrue(provider_config.write(self.inv, path, quota=True))

    def test_root_gets_the_quota_classes(self):
        from nova.compute import provider_config as nova_provider_config
        from nova.compute import provider_tree
        from nova.compute import resource_tracker

        configs = nova_provider_config.get_provider_configs(self.config_dir)
        self.assertIn('cmp1', configs)
        self.nova_conf.set_override('provider_config_location',
                                    self.config_dir, group='compute')
        self.addCleanup(self.nova_conf.clear_override,
                        'provider_config_location', group='compute')
        rt = resource_tracker.ResourceTracker('cmp1', mock.Mock(),
                                              reportclient=mock.Mock())
        tree = provider_tree.ProviderTree()
        root = str(uuid.uuid4())
        tree.new_root('cmp1', root)
        tree.update_inventory('cmp1', {'VCPU': {'total': 8}})
        tree.new_child('cmp1_pci_0000_3b_00_0', root)
        tree.new_child('cmp1_0000:86:00.0', root)
        tree.new_child('cmp1_0000:C1:00.0', root)
        rt._merge_provider_configs(rt.provider_configs, tree)
        inventory = tree.data(root).inventory
        catalog = catalog_mod.load_catalog()
        t4, h100, l40s = (catalog.model(m) for m in
                          ('T4', 'H100-80GB', 'L40S'))
        self.assertEqual(8, inventory['VCPU']['total'])
        self.assertEqual(
            max(p.max_instances for p in t4.vgpu_profiles.values()),
            inventory[quota.model_class('T4', quota.VGPU)]['total'])
        self.assertIn(quota.model_class('H100-80GB', quota.VGPU), inventory)
        self.assertEqual(
            1, inventory[quota.model_class('L40S', quota.WHOLE)]['total'])
        self.assertEqual(
            t4.framebuffer_mib + h100.framebuffer_mib + l40s.framebuffer_mib,
            inventory[quota.MEMORY_CLASS]['total'])
