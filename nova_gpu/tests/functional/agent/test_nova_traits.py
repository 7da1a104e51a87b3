"""What Nova 34 does to the traits of GPU providers, run on Nova's code.

Issue 23, finding 4: nova-compute does not reset the traits of every GPU
provider at every periodic update. On mdev (VGPU) providers the libvirt
driver only adds ``OWNER_NOVA`` (``LibvirtDriver._ensure_pgpu_providers``)
and keeps a trait set through the Placement API; on PCI in Placement
providers ``PciResourceProvider.update_provider_tree`` replaces the traits
with the device_spec's (plus ``OWNER_NOVA``). The traits of the agent's
provider config file are merged in after both
(``ResourceTracker._merge_provider_configs``) and stay on both kinds.
"""

import collections
import os
from unittest import mock
import uuid

import fixtures
import testtools

from nova_gpu.agent import provider_config

MDEV = 'cmp1_pci_0000_3b_00_0'
POOL = 'cmp1_0000:86:00.0'
API_TRAIT = 'CUSTOM_SET_THROUGH_THE_API'
VGPU_INVENTORY = {'pci_0000_3b_00_0': {
    'total': 16, 'min_unit': 1, 'max_unit': 16, 'step_size': 1,
    'reserved': 0, 'allocation_ratio': 1.0}}


class _Gpu:
    index = 0

    def __init__(self, traits):
        self._traits = traits

    def traits(self):
        return self._traits


class _Inventory:
    """What ``provider_config.document`` reads of a HostInventory."""

    gpus = [_Gpu({'CUSTOM_GPU_MODEL_T4', 'CUSTOM_GPU_NUMA_1'})]

    def providers(self):
        return {0: [{'name': MDEV}, {'name': POOL}]}


class TestNovaTraits(testtools.TestCase):

    def setUp(self):
        super().setUp()
        from nova.compute import provider_tree
        from nova import objects
        import os_traits

        objects.register_all()
        self.objects = objects
        self.tree = provider_tree.ProviderTree()
        root = str(uuid.uuid4())
        self.tree.new_root('cmp1', root)
        self.mdev = self.tree.new_child(MDEV, root)
        self.pool = self.tree.new_child(POOL, root)
        # As nova-compute's provider cache holds them once it has read
        # them back from Placement (resource_provider_association_refresh)
        self.tree.update_traits(self.mdev, [API_TRAIT, os_traits.OWNER_NOVA])
        self.tree.update_traits(self.pool, [
            API_TRAIT, os_traits.OWNER_NOVA,
            os_traits.COMPUTE_MANAGED_PCI_DEVICE])

    def periodic(self):
        """The trait-writing steps of one ``_update_to_placement``."""
        from nova.compute import pci_placement_translator as translator
        from nova.virt.libvirt import driver as libvirt_driver

        # LibvirtDriver.update_provider_tree -> _update_provider_tree_for_vgpu
        driver = mock.Mock()
        driver._get_resource_class_for_device.return_value = 'VGPU'
        libvirt_driver.LibvirtDriver._ensure_pgpu_providers(
            driver, VGPU_INVENTORY, self.tree, 'cmp1')
        # update_provider_tree_for_pci -> PciResourceProvider
        rp = translator.PciResourceProvider(POOL)
        for vf in ('0000:86:00.4', '0000:86:00.5'):
            rp.add_child(self.objects.PciDevice(
                address=vf, dev_type='type-VF', parent_addr='0000:86:00.0',
                vendor_id='10de', product_id='2330', status='available',
                instance_uuid=None, extra_info={}, compute_node_id=1,
                dev_id='pci_' + vf, label='label_10de_2330', numa_node=0),
                {'resource_class': 'CUSTOM_NVIDIA_VGPU', 'managed': 'false'})
        rp.update_provider_tree(self.tree, 'cmp1',
                                collections.defaultdict(collections.Counter))

    def traits(self, uuid_):
        return set(self.tree.data(uuid_).traits)

    def test_api_trait_kept_on_mdev_replaced_on_pci(self):
        self.periodic()
        self.assertIn(API_TRAIT, self.traits(self.mdev))
        self.assertEqual({'OWNER_NOVA', 'COMPUTE_MANAGED_PCI_DEVICE'},
                         self.traits(self.pool))

    def test_provider_config_traits_stay_on_both(self):
        from nova.compute import provider_config as nova_provider_config
        from nova.compute import resource_tracker
        import nova.conf

        conf_dir = self.useFixture(fixtures.TempDir()).path
        provider_config.write(_Inventory(),
                              os.path.join(conf_dir, 'nova-gpu.yaml'))
        nova.conf.CONF.set_override('provider_config_location', conf_dir,
                                    group='compute')
        self.addCleanup(nova.conf.CONF.clear_override,
                        'provider_config_location', group='compute')
        self.assertEqual(
            {MDEV, POOL},
            set(nova_provider_config.get_provider_configs(conf_dir)))
        rt = resource_tracker.ResourceTracker('cmp1', mock.Mock(),
                                              reportclient=mock.Mock())
        topology = {'CUSTOM_GPU_MODEL_T4', 'CUSTOM_GPU_NUMA_1'}
        for _periodic in range(3):
            self.periodic()
            rt._merge_provider_configs(rt.provider_configs, self.tree)
            for rp in (self.mdev, self.pool):
                self.assertEqual(topology, topology & self.traits(rp))
        self.assertIn(API_TRAIT, self.traits(self.mdev))
        self.assertNotIn(API_TRAIT, self.traits(self.pool))
