"""Vendor-VFIO VFs reach the guest unmanaged, through real Nova.

Issue 23, finding 2: a vendor-VFIO VF stays bound to NVIDIA's VFIO variant
driver, so its ``[pci] device_spec`` entry needs ``"managed": "no"``
(Nova's "Attaching physical PCI devices to guests" guide, the ``managed``
tag); with Nova's default libvirt would detach it from that driver and
bind ``vfio-pci``. This boots through the Nova API on a cloud configured
as ``doc/source/generations.rst`` says and checks what Nova 34 made of
it: the entries as ``nova.pci.devspec.PciDeviceSpec`` parses them, and
the ``<hostdev>`` of the domain XML its libvirt driver wrote
(``LibvirtDriver._get_guest_pci_device``). Whole GPUs keep the managed
default (their PF is bound to ``vfio-pci``).
"""

from lxml import etree
from oslo_serialization import jsonutils

from nova_gpu.core import report
from nova_gpu.tests.harness import cloud

HOSTS = (
    cloud.GpuHost('h100', 'H100-80GB', 'H100-20C', gpus=1, path=cloud.VFIO),
    cloud.GpuHost('h200', 'H200-141GB', gpus=1, path=cloud.PASSTHROUGH),
)


def _pci_hostdevs(domain_xml):
    """``{PCI address: managed attribute}`` of a domain's PCI hostdevs."""
    found = {}
    for hostdev in etree.fromstring(domain_xml.encode()).iter('hostdev'):
        addr = hostdev.find('source/address')
        if hostdev.get('type') != 'pci' or addr is None:
            continue
        found['%04x:%02x:%02x.%x' % tuple(
            int(addr.get(k), 0)
            for k in ('domain', 'bus', 'slot', 'function'))] = hostdev.get(
                'managed')
    return found


class VendorVfioUnmanagedTest(cloud.GpuCloudTestCase):
    HOSTS = HOSTS

    def test_device_spec_tags_as_nova_parses_them(self):
        from nova import conf as nova_conf
        from nova.pci import devspec

        managed = {}
        for entry in nova_conf.CONF.pci.device_spec:
            tags = devspec.PciDeviceSpec(jsonutils.loads(entry)).get_tags()
            managed.setdefault(tags.get('resource_class'), set()).add(
                tags.get('managed'))
        self.assertEqual({'false'}, managed[report.VFIO_VGPU_RC])
        self.assertNotIn('false', managed[report.WHOLE_GPU_RC])

    def test_vf_hostdev_is_unmanaged_whole_gpu_managed(self):
        vgpu = self.boot(self.create_gpu_flavor(
            {'gpu:profile': 'H100-20C', 'gpu:backend': 'vfio'}))
        (vf, attr), = _pci_hostdevs(self.domain_xml(vgpu)).items()
        self.assertIn(vf, self.gpu_states('h100')[0].vfs)
        self.assertEqual('no', attr)
        whole = self.boot(self.create_gpu_flavor({'gpu:kind': 'whole'}))
        self.assertEqual({self.gpu_states('h200')[0].address: 'yes'},
                         _pci_hostdevs(self.domain_xml(whole)))
