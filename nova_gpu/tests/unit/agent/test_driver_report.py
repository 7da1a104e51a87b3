"""The agent reports the vGPU manager's version (NVML, faked)."""

from nova_gpu.agent import discovery
from nova_gpu.agent import nvml
from nova_gpu.core import report
from nova_gpu.tests.unit.agent import fakenvml
from nova_gpu.tests.unit.agent import test_discovery

CATALOG = test_discovery.CATALOG


class TestDriverReport(test_discovery.SysfsCase):

    def setUp(self):
        super().setUp()
        fakenvml.hgx_h100_sysfs(self.fs)
        self.lib = fakenvml.hgx_h100()

    def report(self):
        inv = discovery.Discovery(self.sysfs, nvml.Nvml(lib=self.lib),
                                  CATALOG, host='hgx1').discover()
        return inv.report(generation=1)

    def test_version_and_branches_reported(self):
        data = self.report()
        self.assertEqual({'driver_version': '550.54.14',
                          'guest_driver_branches': ['R535', 'R550'],
                          'vgpu_version_range': [0x10000, 0x110000]},
                         data['nvidia'])
        info = report.parse(data, CATALOG).drivers
        self.assertEqual('R550', info.branch)

    def test_driver_without_vgpu_versions(self):
        self.lib.vgpu_versions = None
        info = report.parse(self.report(), CATALOG).drivers
        self.assertIsNone(info.vgpu_versions)
        self.assertEqual(('R535', 'R550'), info.guest_branches)

    def test_no_driver_answer_no_field(self):
        self.lib.driver_version = None
        data = self.report()
        self.assertNotIn('nvidia', data)
        self.assertIsNone(report.parse(data, CATALOG).drivers)

    def test_unparseable_version_is_not_reported(self):
        self.lib.driver_version = b'unknown'
        self.assertNotIn('nvidia', self.report())

    def test_no_nvml_no_field(self):
        inv = discovery.Discovery(self.sysfs, None, CATALOG).discover()
        self.assertNotIn('nvidia', inv.report())
