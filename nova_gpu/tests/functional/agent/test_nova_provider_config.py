"""nova-compute's own code keeps the agent's topology traits.

At every periodic update nova-compute updates the GPU providers (the
libvirt driver's ``update_provider_tree`` only adds ``OWNER_NOVA`` to
mdev providers; PCI-in-Placement providers get their ``device_spec``
traits, replacing others after ``[compute]
resource_provider_association_refresh``), then merges the provider config
files it read at start (``ResourceTracker._merge_provider_configs``). The
simulation below replaces the traits each time, the harsher of the two
(``test_nova_traits`` runs Nova's own code for both); this drives those
real Nova functions over the file the agent writes.
"""

import os
import tempfile
from unittest import mock
import uuid

import testtools

from nova_gpu.agent import discovery
from nova_gpu.agent import provider_config
from nova_gpu.agent import sysfs
from nova_gpu.tests.unit.agent import fakesys


class TestNovaKeepsTraits(testtools.TestCase):

    def setUp(self):
        super().setUp()
        import nova.conf
        self.nova_conf = nova.conf.CONF
        tmp = tempfile.mkdtemp()
        fs = fakesys.FakeSysfs(os.path.join(tmp, 'sys'))
        fs.add_pci('0000:3b:00.0', '0x1eb8', numa_node=1)
        fs.add_mdev_type('0000:3b:00.0', 'nvidia-222', 'GRID T4-1Q', 16)
        # an H100 with vendor VFIO VFs (PCI in Placement, one pool) and a
        # whole L40S for passthrough
        fs.add_pci('0000:86:00.0', '0x2330', numa_node=0)
        for vf in fs.add_vfs('0000:86:00.0', 2, {1062: 'NVIDIA H100-20C'}):
            fs.set_vgpu_type(vf, 1062)
        fs.add_pci('0000:c1:00.0', '0x26b9', numa_node=1, driver='vfio-pci')
        self.inv = discovery.Discovery(sysfs.Sysfs(fs.root), host='cmp1',
                                       nodename='cmp1').discover()
        self.config_dir = os.path.join(tmp, 'provider_config')
        self.assertTrue(provider_config.write(
            self.inv, os.path.join(self.config_dir, 'nova-gpu.yaml')))
        self.assertFalse(provider_config.write(
            self.inv, os.path.join(self.config_dir, 'nova-gpu.yaml')))

    def test_traits_survive_periodic_updates(self):
        from nova.compute import provider_config as nova_provider_config
        from nova.compute import provider_tree
        from nova.compute import resource_tracker
        import os_traits

        # nova-compute validates the file with its own schema at start
        configs = nova_provider_config.get_provider_configs(self.config_dir)
        self.assertEqual({'cmp1_pci_0000_3b_00_0', 'cmp1_0000:86:00.0',
                          'cmp1_0000:C1:00.0'}, set(configs))

        self.nova_conf.set_override('provider_config_location',
                                    self.config_dir, group='compute')
        self.addCleanup(self.nova_conf.clear_override,
                        'provider_config_location', group='compute')
        # Placement is not involved in merging: no report client needed.
        rt = resource_tracker.ResourceTracker('cmp1', mock.Mock(),
                                              reportclient=mock.Mock())
        tree = provider_tree.ProviderTree()
        root = str(uuid.uuid4())
        child = str(uuid.uuid4())
        tree.new_root('cmp1', root)
        tree.update_traits('cmp1', [os_traits.COMPUTE_NODE])
        tree.new_child('cmp1_pci_0000_3b_00_0', root, uuid=child)
        # PCI in Placement providers, as pci_placement_translator names
        # them: the pool of the H100's VFs and the whole L40S
        pool = tree.new_child('cmp1_0000:86:00.0', root)
        whole = tree.new_child('cmp1_0000:C1:00.0', root)
        expected = {child: {'CUSTOM_GPU_MODEL_T4', 'CUSTOM_GPU_NUMA_1'},
                    pool: {'CUSTOM_GPU_MODEL_H100_80GB',
                           'CUSTOM_GPU_NUMA_0'},
                    whole: {'CUSTOM_GPU_MODEL_L40S', 'CUSTOM_GPU_NUMA_1'}}
        for _periodic in range(3):
            # the virt driver replaces the child's traits ...
            tree.update_traits(child, ['CUSTOM_NVIDIA_222'])
            for rp in (pool, whole):
                tree.update_traits(rp, [])
            self.assertFalse(expected[child] & tree.data(child).traits)
            # ... then the resource tracker merges the provider configs
            rt._merge_provider_configs(rt.provider_configs, tree)
            for rp, traits in expected.items():
                self.assertEqual(traits, traits & tree.data(rp).traits)
            self.assertIn('CUSTOM_NVIDIA_222', tree.data(child).traits)
