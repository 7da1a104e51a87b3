"""The privileged entry points: fixed paths, validated arguments."""

import os

from nova_gpu.agent import privsep
from nova_gpu.tests.unit.agent import test_discovery

VF = '0000:86:00.4'


class TestPrivsepEntryPoints(test_discovery.SysfsCase):

    def setUp(self):
        super().setUp()
        privsep.use_in_process()
        self.fs.add_pci('0000:86:00.0', '0x2330')
        self.vfs = self.fs.add_vfs('0000:86:00.0', 2, {1061: 'H100XM-10C'})

    def current(self, vf=VF):
        with open(self.fs.path(self.fs.dev_rel(vf), 'nvidia',
                               'current_vgpu_type')) as f:
            return f.read()

    def test_set_and_clear(self):
        privsep.set_vgpu_type(self.root, VF, 1061)
        self.assertEqual('1061\n', self.current())
        privsep.clear_vgpu_type(self.root, VF)
        self.assertEqual('0\n', self.current())

    def test_trailing_newline_and_other_addresses_refused(self):
        for bad in (VF + '\n', '0000:8A:00.4', '0000:86:00.4/../../x',
                    '../../etc', '', None, 4, VF + '\0'):
            e = self.assertRaises(ValueError, privsep.set_vgpu_type,
                                  self.root, bad, 1061)
            self.assertIn('not a PCI address', str(e))
        self.assertEqual('0\n', self.current())

    def test_type_id_bounded_int(self):
        for bad in (0, -1, 2 ** 31, '1061', '1061\n', 1061.0, True, None):
            e = self.assertRaises(ValueError, privsep.set_vgpu_type,
                                  self.root, VF, bad)
            self.assertIn('vGPU type id must be an integer', str(e))
        self.assertEqual('0\n', self.current())

    def test_root_validated(self):
        for bad in ('relative/sys', self.root + '/../sys', '/', None,
                    os.path.dirname(self.root)):
            self.assertRaises(PermissionError, privsep.clear_vgpu_type,
                              bad, VF)

    def test_missing_device_or_not_a_vf(self):
        e = self.assertRaises(FileNotFoundError, privsep.clear_vgpu_type,
                              self.root, '0000:99:00.0')
        self.assertIn('no PCI device 0000:99:00.0', str(e))
        e = self.assertRaises(FileNotFoundError, privsep.clear_vgpu_type,
                              self.root, '0000:86:00.0')
        self.assertIn('not a VF', str(e))

    def test_device_link_escaping_the_tree_refused(self):
        link = self.fs.path('bus/pci/devices/0000:99:00.0')
        os.symlink('/tmp', link)
        self.assertRaises(FileNotFoundError, privsep.bind_vfio_pci,
                          self.root, '0000:99:00.0')

    def test_bind_vfio_pci(self):
        privsep.bind_vfio_pci(self.root, VF)
        base = self.fs.path(self.fs.dev_rel(VF))
        with open(os.path.join(base, 'driver_override')) as f:
            self.assertEqual('vfio-pci\n', f.read())
        with open(self.fs.path('bus/pci/drivers/nvidia/unbind')) as f:
            self.assertEqual(VF, f.read())
        with open(self.fs.path('bus/pci/drivers_probe')) as f:
            self.assertEqual(VF, f.read())

    def test_entry_points_say_what_they_do(self):
        for fn in (privsep.set_vgpu_type, privsep.clear_vgpu_type,
                   privsep.bind_vfio_pci):
            func = fn.args[0]  # the entrypoint wraps the function
            self.assertGreater(len(func.__doc__ or ''), 40, func.__name__)
