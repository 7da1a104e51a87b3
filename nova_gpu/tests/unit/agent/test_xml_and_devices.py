"""XML builders (checked by libvirt's test driver) and device operations
that do not need libvirtd: NVIDIA vendor VFIO vGPUs, passthrough checks.
"""

import os

import libvirt
from lxml import etree
import testtools

from nova_gpu.agent import devices
from nova_gpu.agent import errors
from nova_gpu.agent import privsep
from nova_gpu.agent import xmlbuild
from nova_gpu.tests.unit.agent import test_discovery

UUID = '4b20d080-1b54-4048-85b3-a6a62d165c01'
HOSTILE = [
    "nvidia-222'/><hostdev type='pci'",
    'x"><evil/>',
    '../../../etc/passwd',
    'nvidia-222\n<devices/>',
    '',
    None,
]


class TestXmlBuilders(testtools.TestCase):

    def test_mdev_nodedev(self):
        doc = etree.fromstring(xmlbuild.mdev_nodedev('0000:3b:00.0',
                                                     'nvidia-222', UUID))
        self.assertEqual('pci_0000_3b_00_0', doc.findtext('parent'))
        self.assertEqual('nvidia-222', doc.find('capability/type').get('id'))
        self.assertEqual(UUID, doc.findtext('capability/uuid'))

    def test_hostile_names_rejected(self):
        for bad in HOSTILE:
            e = self.assertRaises(errors.InvalidName, xmlbuild.mdev_nodedev,
                                  '0000:3b:00.0', bad, UUID)
            self.assertIn('invalid mdev type', str(e))
            self.assertRaises(errors.InvalidName, xmlbuild.mdev_nodedev,
                              bad, 'nvidia-222', UUID)
            self.assertRaises(errors.InvalidName, xmlbuild.mdev_hostdev,
                              bad)
            self.assertRaises(errors.InvalidName, xmlbuild.pci_hostdev, bad)

    def test_structure_cannot_change_even_unchecked(self):
        # The builders place values through lxml, which escapes them: the
        # checks are for clear errors, not what keeps the XML sound.
        dev = etree.Element('device')
        etree.SubElement(dev, 'parent').text = HOSTILE[1]
        etree.SubElement(dev, 'capability', type=HOSTILE[0])
        parsed = etree.fromstring(etree.tostring(dev))
        self.assertEqual(['parent', 'capability'],
                         [c.tag for c in parsed])
        self.assertEqual(HOSTILE[0], parsed.find('capability').get('type'))

    def test_refs_from_domain_xml(self):
        xml = ('<domain><devices>%s%s</devices></domain>'
               % (xmlbuild.mdev_hostdev(UUID.upper()),
                  xmlbuild.pci_hostdev('0000:3b:00.1')))
        self.assertEqual(({UUID}, {'0000:3b:00.1'}),
                         xmlbuild.hostdev_refs(xml))

    def test_malformed_domain_xml(self):
        e = self.assertRaises(errors.AgentError, xmlbuild.hostdev_refs,
                              '<domain>')
        self.assertIn('malformed domain XML', str(e))


class TestLibvirtAcceptsHostdevs(testtools.TestCase):
    """libvirt's own parser and validator (test:///default driver)."""

    def setUp(self):
        super().setUp()
        self.conn = libvirt.open('test:///default')
        self.addCleanup(self.conn.close)

    def domain(self, name, hostdevs):
        dom = etree.Element('domain', type='test')
        etree.SubElement(dom, 'name').text = name
        etree.SubElement(dom, 'memory').text = '65536'
        os_el = etree.SubElement(dom, 'os')
        etree.SubElement(os_el, 'type').text = 'hvm'
        devs = etree.SubElement(dom, 'devices')
        for h in hostdevs:
            devs.append(etree.fromstring(h))
        return etree.tostring(dom, encoding='unicode')

    def test_mdev_and_pci_hostdevs_define(self):
        xml = self.domain('gpu-guest', [
            xmlbuild.mdev_hostdev(UUID),
            xmlbuild.pci_hostdev('0000:3b:00.0'),
            xmlbuild.pci_hostdev('0000:3b:00.1')])
        dom = self.conn.defineXMLFlags(
            xml, libvirt.VIR_DOMAIN_DEFINE_VALIDATE)
        self.assertEqual(({UUID}, {'0000:3b:00.0', '0000:3b:00.1'}),
                         xmlbuild.hostdev_refs(dom.XMLDesc(0)))

    def test_hostile_domain_name_stays_a_name(self):
        # libvirt refuses '/' in names; everything else must stay text
        name = "evil' \"><devices><hostdev type='pci'>&amp;<name>x"
        dom = self.conn.defineXML(self.domain(name, [
            xmlbuild.mdev_hostdev(UUID)]))
        self.assertEqual(name, dom.name())
        self.assertEqual(({UUID}, set()),
                         xmlbuild.hostdev_refs(dom.XMLDesc(0)))

    def test_node_devices_listed(self):
        names = [d.name() for d in self.conn.listAllDevices(0)]
        self.assertIn('computer', names)


class TestVendorVfioVgpu(test_discovery.SysfsCase):

    def setUp(self):
        super().setUp()
        privsep.use_in_process()
        self.fs.add_pci('0000:86:00.0', '0x2330', numa_node=1)
        self.vfs = self.fs.add_vfs('0000:86:00.0', 2,
                                   {1061: 'NVIDIA H100XM-10C'})
        self.manager = devices.DeviceManager(self.sysfs, libvirt=None)

    def test_type_id_written_to_free_vf(self):
        vf = self.manager.create_vf_vgpu('0000:86:00.0', 1061)
        self.assertEqual(self.vfs[0], vf)
        self.assertEqual(1061,
                         self.sysfs.pci_function(vf).current_vgpu_type)
        vf2 = self.manager.create_vf_vgpu('0000:86:00.0', 1061)
        self.assertEqual(self.vfs[1], vf2)
        e = self.assertRaises(errors.NoCapacity,
                              self.manager.create_vf_vgpu,
                              '0000:86:00.0', 1061)
        self.assertIn('no free VF of 0000:86:00.0', str(e))
        self.manager.remove_vf_vgpu(vf, refs={})
        self.assertEqual(0, self.sysfs.pci_function(vf).current_vgpu_type)

    def test_unknown_type_id(self):
        e = self.assertRaises(errors.NotFound, self.manager.create_vf_vgpu,
                              '0000:86:00.0', 999)
        self.assertIn('vGPU type id 999 cannot be created', str(e))
        self.assertIn('1061 (NVIDIA H100XM-10C)', str(e))

    def test_in_use_vf_kept(self):
        vf = self.manager.create_vf_vgpu('0000:86:00.0', 1061)
        e = self.assertRaises(errors.InUse, self.manager.remove_vf_vgpu, vf,
                              refs={vf: ['guest-a']})
        self.assertIn('guest-a', str(e))
        self.assertEqual(1061,
                         self.sysfs.pci_function(vf).current_vgpu_type)

    def test_privsep_has_no_generic_write(self):
        # the old entry point wrote any listed file below any root
        self.assertFalse(hasattr(privsep, 'write_sysfs'))
        self.assertRaises(ValueError, privsep.set_vgpu_type, self.root,
                          '../../../etc/x', 1061)
        self.assertRaises(PermissionError, privsep.clear_vgpu_type,
                          'relative', self.vfs[0])

    def test_remove_on_missing_or_plain_function(self):
        e = self.assertRaises(errors.NotFound, self.manager.remove_vf_vgpu,
                              '0000:86:07.7', refs={})
        self.assertIn('0000:86:07.7 does not exist', str(e))
        e = self.assertRaises(errors.NotFound, self.manager.remove_vf_vgpu,
                              '0000:86:00.0', refs={})
        self.assertIn('not an SR-IOV VF', str(e))

    def test_operations_journaled_and_done(self):
        seen = []
        begin = self.manager.journal.begin

        def spy(op, **args):
            seen.append((op, args, self.sysfs.pci_function(
                self.vfs[0]).current_vgpu_type))
            return begin(op, **args)
        self.manager.journal.begin = spy
        vf = self.manager.create_vf_vgpu('0000:86:00.0', 1061)
        self.manager.remove_vf_vgpu(vf, refs={})
        # each intent recorded before the device changed
        self.assertEqual([('vf_create', {'vf': vf, 'type_id': 1061}, 0),
                          ('vf_remove', {'vf': vf}, 1061)], seen)
        self.assertEqual({}, self.manager.journal.intents())


class TestPassthrough(test_discovery.SysfsCase):

    def setUp(self):
        super().setUp()
        privsep.use_in_process()
        self.fs.add_pci('0000:3b:00.0', '0x20b5', iommu_group=40,
                        driver='vfio-pci')
        self.fs.add_pci('0000:3b:00.1', '0x10f0', pci_class='0x040300',
                        iommu_group=40, driver='snd_hda_intel',
                        parent_rel=self.fs.dev_rel('0000:3b:00.0').rsplit(
                            '/', 1)[0])
        self.manager = devices.DeviceManager(self.sysfs)

    def test_every_function_of_group_must_be_vfio(self):
        e = self.assertRaises(errors.AgentError,
                              self.manager.passthrough_hostdevs,
                              '0000:3b:00.0')
        self.assertIn('IOMMU group 40', str(e))
        self.assertIn('0000:3b:00.1 (snd_hda_intel)', str(e))
        self.fs.bind_driver('0000:3b:00.1', 'vfio-pci')
        xml = self.manager.passthrough_hostdevs('0000:3b:00.0')
        self.assertEqual(2, len(xml))
        self.assertEqual(
            (set(), {'0000:3b:00.0', '0000:3b:00.1'}),
            xmlbuild.hostdev_refs('<domain><devices>%s</devices></domain>'
                                  % ''.join(xml)))

    def test_bind_writes_driver_override(self):
        self.assertRaises(errors.AgentError,
                          self.manager.passthrough_hostdevs, '0000:3b:00.0',
                          bind=True)  # nothing in a fake tree rebinds
        with open(self.fs.path(self.fs.dev_rel('0000:3b:00.1'),
                               'driver_override')) as f:
            self.assertEqual('vfio-pci\n', f.read())

    def test_no_iommu(self):
        self.fs.add_pci('0000:5e:00.0', '0x20b5')
        os.unlink(self.fs.path(self.fs.dev_rel('0000:5e:00.0'),
                               'iommu_group'))
        e = self.assertRaises(errors.AgentError,
                              self.manager.passthrough_hostdevs,
                              '0000:5e:00.0')
        self.assertIn('no IOMMU group', str(e))
