"""Nova's own vGPU and PCI functional tests, run with nova-gpu enabled.

An operator adds GpuFilter and the GPU weighers to a cloud whose flavors
know nothing of ``gpu:`` extra specs, and whose hosts may have no
nova-gpu-agent (no GPU report) yet: Nova must behave as before. These
classes are Nova 34's own tests (``nova.tests.functional.libvirt``),
unchanged but for the scheduler's configuration, which enables the plugin
the way ``doc/source/installation.rst`` tells operators to.
"""

import os
import sys

from nova.tests.functional.libvirt import test_pci_in_placement
from nova.tests.functional.libvirt import test_pci_sriov_servers
from nova.tests.functional.libvirt import test_vgpu
from oslo_config import cfg

from nova_gpu.tests.harness import cloud

CONF = cfg.CONF


class PluginEnabled:
    """Enable GpuFilter and the weighers before the scheduler starts."""

    def _setup_scheduler_service(self):
        # Nova's paste file, where the wheel installs it (as the cloud
        # harness finds it).
        self.flags(api_paste_config=os.path.join(
            sys.prefix, 'etc', 'nova', 'api-paste.ini'), group='wsgi')
        # The plugin's classes as nova-scheduler.conf names them, added to
        # the filters Nova's own test enables.
        self.flags(group='filter_scheduler',
                   available_filters=cloud.scheduler_value(
                       'filter_scheduler', 'available_filters'),
                   enabled_filters=list(
                       CONF.filter_scheduler.enabled_filters) + ['GpuFilter'],
                   weight_classes=cloud.scheduler_value(
                       'filter_scheduler', 'weight_classes'))
        return super()._setup_scheduler_service()

    def test_plugin_enabled(self):
        names = [type(f).__name__
                 for f in self.scheduler.manager.host_manager.enabled_filters]
        self.assertIn('GpuFilter', names)
        weighers = [type(w).__name__
                    for w in self.scheduler.manager.host_manager.weighers]
        self.assertIn('GpuFragmentationWeigher', weighers)


class VGPUTests(PluginEnabled, test_vgpu.VGPUTests):
    pass


class VGPUMultipleTypesTests(PluginEnabled, test_vgpu.VGPUMultipleTypesTests):
    pass


class SimpleRCAndTraitBasedPCIAliasTests(
        PluginEnabled,
        test_pci_in_placement.SimpleRCAndTraitBasedPCIAliasTests):
    pass


class RCAndTraitBasedPCIAliasTests(
        PluginEnabled, test_pci_in_placement.RCAndTraitBasedPCIAliasTests):
    pass


class VGPULimitMultipleTypesTests(
        PluginEnabled, test_vgpu.VGPULimitMultipleTypesTests):
    pass


class DifferentMdevClassesTests(
        PluginEnabled, test_vgpu.DifferentMdevClassesTests):
    pass


class VGPULiveMigrationTests(PluginEnabled, test_vgpu.VGPULiveMigrationTests):
    pass


class PCIServersTest(PluginEnabled, test_pci_sriov_servers.PCIServersTest):
    pass


class PCIResourceRequestReschedulingTest(
        PluginEnabled,
        test_pci_sriov_servers.PCIResourceRequestReschedulingTest):
    pass
