"""devstack's fake-hardware mode: the fake GPU host each unit runs on.

``nova_gpu.tests.harness.fake_compute`` builds, for each path, the fake
libvirt host a devstack unit's nova-compute runs on, the nova.conf path
file written for it and its agent's options. What the file names must be
what the fake host has, and the fake sysfs the agent reads must follow
the mdevs Nova's driver makes.
"""

import os

import fixtures
from nova import test
from oslo_config import cfg
from oslo_serialization import jsonutils

from nova_gpu.tests.harness import fake_compute


class FakeComputeTest(test.NoDBTestCase):

    def start_host(self, path, name='ds'):
        sysfs = os.path.join(self.useFixture(
            fixtures.TempDir()).path, 'sys')
        host = fake_compute.FakeGpuHost(path, '%s-%s' % (name, path), sysfs)
        host.start()
        self.addCleanup(host.stop)
        return host

    def conf_of(self, path):
        tmp = self.useFixture(fixtures.TempDir()).path
        conf = os.path.join(tmp, 'nova-compute.conf')
        with open(conf, 'w') as f:
            f.write(fake_compute.path_conf(path, 'ds-' + path))
        sections = {}
        cfg.ConfigParser(conf, sections).parse()
        return {(s, o): v for s, options in sections.items()
                for o, v in options.items()}

    def mdev_type(self, path):
        (type_id,) = self.conf_of(path)[('devices', 'enabled_mdev_types')]
        return type_id

    def libvirt_functions(self, host):
        """{address: dev_type} of the fake host's PCI functions."""
        return {dev.address: dev.dev_type
                for dev in host.pci_info.devices.values()}

    def test_path_file_names_the_fake_hosts_functions(self):
        for path in fake_compute.PATHS:
            host = self.start_host(path)
            functions = self.libvirt_functions(host)
            conf = self.conf_of(path)
            types = conf.get(('devices', 'enabled_mdev_types'))
            if path in ('pf-mdev', 'vf-mdev', 'mig-vgpu'):
                (type_id,) = types
                (addresses,) = conf[('mdev_%s' % type_id,
                                     'device_addresses')]
                wanted = {'pf-mdev': 'MDEV_TYPES'}.get(path, 'VF')
                self.assertEqual(
                    sorted(a for a, t in functions.items() if t == wanted),
                    sorted(addresses.split(',')), path)
                self.assertNotIn(('pci', 'device_spec'), conf, path)
            else:
                self.assertIsNone(types, path)
                specs = [jsonutils.loads(v)
                         for v in conf[('pci', 'device_spec')]]
                wanted = 'VF' if path == 'vendor-vfio' else 'PF'
                self.assertEqual(
                    sorted(a for a, t in functions.items() if t == wanted),
                    sorted(s['address'] for s in specs), path)
            # The fake sysfs holds every GPU function libvirt shows.
            for address in functions:
                self.assertTrue(os.path.isdir(host.tree.fs.path(
                    host.tree.fs.dev_rel(address))), (path, address))
            # One fake host per process, as each devstack unit runs.
            host.stop()

    def test_agent_options_name_the_pci_classes_of_the_path_file(self):
        for path, rc in (('vendor-vfio', 'CUSTOM_NVIDIA_VGPU'),
                         ('whole-gpu', 'CUSTOM_NVIDIA_GPU')):
            options = fake_compute.agent_options(path, 'ds-' + path)
            self.assertEqual('ds-' + path, options['host'])
            self.assertEqual('ds-' + path, options['nodename'])
            self.assertEqual('0000:10:00.0:%s,0000:11:00.0:%s' % (rc, rc),
                             options['pci_resource_classes'])
        self.assertNotIn('pci_resource_classes',
                         fake_compute.agent_options('vf-mdev', 'x'))

    def test_only_the_mig_host_has_a_fake_nvml(self):
        # MIG mode is NVML's alone: without it the agent reports the GPUs
        # out of MIG mode and no host can take a MIG-backed type.
        gpus = fake_compute.fake_nvml('mig-vgpu', 'x')
        self.assertEqual(['0000:10:00.0', '0000:11:00.0'],
                         [g['address'] for g in gpus])
        self.assertTrue(all(g['mig'] for g in gpus))
        self.assertTrue(fake_compute.agent_options('mig-vgpu',
                                                   'x')['use_nvml'])
        for path in ('pf-mdev', 'vf-mdev', 'vendor-vfio', 'whole-gpu'):
            self.assertIsNone(fake_compute.fake_nvml(path, 'x'), path)
            self.assertFalse(fake_compute.agent_options(path,
                                                        'x')['use_nvml'])

    def test_mdev_made_by_novas_driver_appears_in_libvirt_and_sysfs(self):
        host = self.start_host('vf-mdev')
        vf = host.gpus[1].vfs[0]
        dev_name = 'pci_' + vf.replace(':', '_').replace('.', '_')
        uuid = host._create_mdev(dev_name, self.mdev_type('vf-mdev'))
        self.assertEqual([uuid], host.tree.fs.mdevs())
        self.assertEqual(1, len(host.connection.mdev_info.devices))
        # A fresh start is fresh hardware: no mdev left.
        host.stop()
        host.start()
        self.assertEqual([], host.tree.fs.mdevs())

    def test_mdev_no_domain_holds_is_released_when_a_domain_goes(self):
        host = self.start_host('mig-vgpu')
        gpu = host.gpus[0]
        names = ['pci_' + vf.replace(':', '_').replace('.', '_')
                 for vf in gpu.vfs[:2]]
        held, idle = (host._create_mdev(n, self.mdev_type('mig-vgpu'))
                      for n in names)
        xml = ("<domain type='kvm'><name>guest</name><vcpu>1</vcpu>"
               "<memory>131072</memory><os><type>hvm</type></os><devices>"
               "<hostdev mode='subsystem' type='mdev' model='vfio-pci'>"
               "<source><address uuid='%s'/></source></hostdev>"
               "</devices></domain>" % held)
        dom = host.connection.defineXML(xml)
        self.assertEqual(sorted([held, idle]), host.tree.fs.mdevs())
        other = host.connection.defineXML(
            xml.replace('guest', 'other').replace(held, 'x'))
        other.undefine()
        # The idle mdev and its GPU instance went; the held one stayed.
        self.assertEqual([held], host.tree.fs.mdevs())
        self.assertEqual([held], list(gpu.gpu_instances))
        dom.undefine()
        self.assertEqual([], host.tree.fs.mdevs())

    def test_mig_backed_mdev_carves_a_gpu_instance(self):
        host = self.start_host('mig-vgpu')
        gpu = host.gpus[0]
        dev_name = 'pci_' + gpu.vfs[0].replace(':', '_').replace('.', '_')
        uuid = host._create_mdev(dev_name, self.mdev_type('mig-vgpu'))
        self.assertIn(uuid, gpu.gpu_instances)
        self.assertEqual('2g.10gb', gpu.gpu_instances[uuid].detail[0])

    def test_unknown_path_is_refused_by_name(self):
        e = self.assertRaises(ValueError, fake_compute.host_spec,
                              'mdev', 'x')
        self.assertIn("unknown GPU path 'mdev'", str(e))
