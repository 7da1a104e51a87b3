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
                wanted = 'VF' if path in ('vendor-vfio',
                                          'mixed-size') else 'PF'
                gpu_functions = {a for g in host.gpus
                                 for a in g.functions()}
                self.assertEqual(
                    sorted(a for a, t in functions.items()
                           if t == wanted and a in gpu_functions),
                    sorted(s['address'] for s in specs
                           if s['resource_class'] != 'CUSTOM_RDMA_NIC_VF'),
                    path)
                # The HGX host's NIC VFs: every one, and only on it.
                nic_vfs = sorted(a for a, t in functions.items()
                                 if t == 'VF' and a not in gpu_functions)
                self.assertEqual(nic_vfs, sorted(
                    s['address'] for s in specs
                    if s['resource_class'] == 'CUSTOM_RDMA_NIC_VF'), path)
                self.assertEqual(path == 'hgx', bool(nic_vfs), path)
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

    def test_only_the_mig_and_mixed_size_hosts_have_a_fake_nvml(self):
        # MIG mode and mixed-size vGPU mode are NVML's alone: without it
        # the agent reports the GPUs out of MIG mode (no host can take a
        # MIG-backed type) and in equal-size mode.
        gpus = fake_compute.fake_nvml('mig-vgpu', 'x')
        self.assertEqual(['0000:10:00.0', '0000:11:00.0'],
                         [g['address'] for g in gpus])
        self.assertTrue(all(g['mig'] for g in gpus))
        self.assertTrue(fake_compute.agent_options('mig-vgpu',
                                                   'x')['use_nvml'])
        (gpu,) = fake_compute.fake_nvml('mixed-size', 'x')
        self.assertEqual(1, gpu['heterogeneous'])
        self.assertNotIn('mig', gpu)
        for path in ('pf-mdev', 'vf-mdev', 'vendor-vfio', 'whole-gpu',
                     'hgx'):
            self.assertIsNone(fake_compute.fake_nvml(path, 'x'), path)
            self.assertFalse(fake_compute.agent_options(
                path, 'x', '/fake')['use_nvml'])

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


def _domain_xml(name, addresses, profile=None):
    """A domain as Nova's libvirt driver writes it: its PCI hostdevs and,
    with ``profile``, the flavor's ``gpu:profile`` in Nova's metadata.
    """
    metadata = (
        "<metadata><nova:instance xmlns:nova='http://openstack.org/xmlns/"
        "libvirt/nova/1.1'><nova:flavor name='f'><nova:extraSpecs>"
        "<nova:extraSpec name='gpu:profile'>%s</nova:extraSpec>"
        "</nova:extraSpecs></nova:flavor></nova:instance></metadata>"
        % profile) if profile else ''
    hostdevs = ''.join(
        "<hostdev mode='subsystem' type='pci' managed='yes'><source>"
        "<address domain='0x%s' bus='0x%s' slot='0x%s' function='0x%s'/>"
        "</source></hostdev>" % tuple(a.replace('.', ':').split(':'))
        for a in addresses)
    return ("<domain type='kvm'><name>%s</name>%s<vcpu>1</vcpu>"
            "<memory>131072</memory><os><type>hvm</type></os><devices>%s"
            "</devices></domain>" % (name, metadata, hostdevs))


class FakeHgxAndMixedSizeHostTest(test.NoDBTestCase):
    """The HGX and mixed-size hosts as their agent and the qemu hook see
    them: partitions from the fake Fabric Manager activated for a guest,
    the PCIe tree pairing each GPU with the NICs of its switch, a VF
    typed on demand on a GPU NVML shows in mixed-size mode.
    """

    def start_host(self, path):
        tmp = self.useFixture(fixtures.TempDir()).path
        host = fake_compute.FakeGpuHost(path, 'ds-' + path,
                                        os.path.join(tmp, 'sys'), tmp)
        host.start()
        self.addCleanup(host.stop)
        return host

    def discover(self, host, nvml=None):
        from nova_gpu.agent import discovery
        from nova_gpu.agent import fabric
        from nova_gpu.agent import sysfs as sysfs_mod
        options = fake_compute.agent_options(host.path, host.spec.name,
                                             host.host_dir)
        fm = (fabric.FmpmClient(options['fmpm_path'])
              if options.get('nvswitch_mode') == 'shared' else None)
        return discovery.Discovery(
            sysfs_mod.Sysfs(host.sysfs_dir), nvml=nvml,
            host=host.spec.name, fabric=fm,
            pcie_tree=bool(options.get('report_pcie_tree')),
            vf_types_on_demand=bool(options.get('vf_types_on_demand')),
            resource_classes=options['pci_resource_classes'].split(',')
        ).discover()

    def test_hgx_partitions_come_from_fabric_manager_and_the_hook(self):
        import itertools
        host = self.start_host('hgx')
        described = fake_compute.describe('hgx', 'ds-hgx')
        table = self.discover(host).host.partitions
        self.assertEqual(
            {int(k): (v['gpus'], v['supported'])
             for k, v in described['partitions'].items()},
            {p.id: (sorted(p.gpus), p.supported) for p in table.partitions})
        self.assertFalse(any(p.active for p in table.partitions))
        pair = next(p for p in table.partitions if len(p.gpus) == 2)
        # Started and destroyed as Nova's driver does: the host runs the
        # hook around the fake domain, as libvirtd would.
        dom = host.connection.defineXML(_domain_xml(
            'guest', [host.gpus[i].address for i in sorted(pair.gpus)]))
        dom.createWithFlags(0)
        active = [p.id for p in self.discover(host).host.partitions
                  .partitions if p.active]
        self.assertEqual([pair.id], active)
        # GPUs forming no partition: the guest does not start.
        from nova.tests.fixtures import libvirt as fakelibvirt
        apart = next(set(c) for c in itertools.combinations(range(8), 2)
                     if table.find(set(c)) is None)
        bad = host.connection.defineXML(_domain_xml(
            'bad', [host.gpus[i].address for i in sorted(apart)]))
        e = self.assertRaises(fakelibvirt.libvirtError,
                              bad.createWithFlags, 0)
        self.assertIn('form no NVSwitch partition', str(e))
        self.assertFalse(bad.isActive())
        dom.destroy()
        self.assertFalse(any(p.active for p in self.discover(host).host
                             .partitions.partitions))

    def test_hgx_pcie_tree_pairs_each_gpu_with_its_switchs_nics(self):
        host = self.start_host('hgx')
        described = fake_compute.describe('hgx', 'ds-hgx')
        tree = self.discover(host).host.pcie
        gpu_switch = [switch for switch, _root in tree.gpus]
        for nic in tree.nics:
            s = described['nic_switches'][nic.address]
            gpus = [i for i, gs in enumerate(described['gpu_switches'])
                    if gs == s]
            self.assertEqual(2, len(gpus))
            self.assertEqual({nic.switch}, {gpu_switch[i] for i in gpus})
            self.assertEqual(4, nic.vfs)
            self.assertEqual('ds-hgx_%s' % nic.address.upper(),
                             nic.provider)
        self.assertEqual(8, len(tree.nics))
        self.assertEqual(4, len(set(gpu_switch)))
        # A VF a guest holds is bound to vfio-pci while the guest runs.
        pair = next(p for p in self.discover(host).host.partitions
                    .partitions if len(p.gpus) == 1)
        vf = host.spec.rdma.nics(0)[0][1][0]
        dom = host.connection.defineXML(_domain_xml(
            'guest', [host.gpus[min(pair.gpus)].address, vf]))
        run = host.run_qemu_hook(dom, 'prepare', 'begin')
        self.assertEqual(0, run.returncode, run.stderr)
        used = {n.address: n.vfs_used for n in self.discover(host)
                .host.pcie.nics}
        self.assertEqual(1, sum(used.values()))
        host.run_qemu_hook(dom, 'release', 'end')
        used = {n.address: n.vfs_used for n in self.discover(host)
                .host.pcie.nics}
        self.assertEqual(0, sum(used.values()))

    def test_mixed_size_vf_typed_on_demand_by_the_hook(self):
        from nova_gpu.agent import mixed_size_mode
        from nova_gpu.agent import sysfs as sysfs_mod
        host = self.start_host('mixed-size')
        state = os.path.join(host.host_dir, fake_compute.AGENT_STATE)
        os.makedirs(state, exist_ok=True)
        # What the agent writes once NVML says the GPU is in the mode.
        mixed_size_mode.write(state, [host.gpus[0].address])
        fs = sysfs_mod.Sysfs(host.sysfs_dir)
        vfs = host.gpus[0].vfs
        self.assertEqual([0] * len(vfs), [
            fs.pci_function(vf).current_vgpu_type for vf in vfs])
        for name, vf, profile in (('large', vfs[0], 'L40S-24C'),
                                  ('small', vfs[1], 'L40S-8C')):
            dom = host.connection.defineXML(_domain_xml(name, [vf], profile))
            run = host.run_qemu_hook(dom, 'prepare', 'begin')
            self.assertEqual(0, run.returncode, run.stderr)
        typed = [fs.pci_function(vf).current_vgpu_type for vf in vfs[:2]]
        self.assertTrue(all(typed), typed)
        self.assertNotEqual(typed[0], typed[1])
