"""The driver compatibility rule and its place in the GPU report."""

from nova_gpu.core import drivers
from nova_gpu.core import exceptions
from nova_gpu.core import fixtures
from nova_gpu.core import host as H
from nova_gpu.core import moves
from nova_gpu.core import report
from nova_gpu.tests.unit.core import base

BUILD = drivers.DriverInfo.build
R550 = BUILD('550.54.14', vgpu_versions=(0x10000, 0x110000))
R535 = BUILD('535.183.04', vgpu_versions=(0x10000, 0x100000))
R570 = BUILD('570.86.10', vgpu_versions=(0x120000, 0x130000))


class TestRule(base.TestCase):

    def test_branch_spellings(self):
        self.assertEqual('R550', drivers.parse_branch('550'))
        self.assertEqual('R550', drivers.parse_branch(' r550 '))
        for bad in ('', 'R5', '550.54', 'latest', None, 550):
            e = self.assertRaises(exceptions.InvalidRequest,
                                  drivers.parse_branch, bad)
            self.assertIn('R550 or 550', str(e))

    def test_branch_of_version(self):
        self.assertEqual('R550', drivers.branch_of('550.54.14'))
        self.assertRaises(exceptions.InvalidRequest, drivers.branch_of,
                          'vGPU 17')

    def test_cross_branch_rule(self):
        self.assertEqual(('R535', 'R550'), drivers.guest_branches('R550'))
        self.assertEqual(('R470',), drivers.guest_branches('R470'))
        self.assertEqual(('R999',), drivers.guest_branches('999'))
        self.assertEqual(('R535', 'R550'), R550.guest_branches)

    def test_long_term_support_rule(self):
        # vGPU 19 release notes: a later long-term support manager takes
        # guests of the previous long-term support branch.
        self.assertEqual(('R535', 'R570', 'R580'),
                         drivers.guest_branches('R580'))
        # NVIDIA's branch table: vGPU 13 (R470) is long-term support too,
        # the one before R535.
        self.assertEqual(('R470', 'R525', 'R535'),
                         drivers.guest_branches('R535'))
        self.assertIsNone(drivers.host_problem(R535, 'R470'))
        self.assertIn('R470 is not supported',
                      drivers.host_problem(R550, 'R470'))
        self.assertIn('R535 is not supported',
                      drivers.host_problem(R570, 'R535'))
        self.assertIsNone(drivers.host_problem(
            drivers.DriverInfo.build('580.65.05'), 'R535'))

    def test_newest_branch_takes_the_previous_one(self):
        # vGPU 20 (R595): "a later major release branch with guest VM
        # drivers from the previous branch", R580.
        r595 = BUILD('595.58.03')
        self.assertEqual(('R580', 'R595'), r595.guest_branches)
        self.assertIsNone(drivers.host_problem(r595, 'R580'))
        self.assertIn('R570 is not supported',
                      drivers.host_problem(r595, 'R570'))
        # and a guest newer than the manager is not supported
        self.assertIn('R595 is not supported',
                      drivers.host_problem(
                          drivers.DriverInfo.build('580.65.05'), 'R595'))

    def test_host_problem(self):
        self.assertIsNone(drivers.host_problem(R550, 'R535'))
        self.assertIsNone(drivers.host_problem(R550, 'R550'))
        self.assertIsNone(drivers.host_problem(None, 'R550'))
        self.assertIsNone(drivers.host_problem(R550, None))
        why = drivers.host_problem(R535, 'R550')
        self.assertIn('R550 is not supported by the vGPU manager '
                      '535.183.04 (supports R470, R525, R535)', why)

    def test_migration_needs_overlapping_vgpu_versions(self):
        self.assertIsNone(drivers.migration_problem(R535, R550, 'R535'))
        why = drivers.migration_problem(R550, R570, 'R550')
        self.assertIn('do not overlap', why)
        self.assertIn('guest driver branch R535',
                      drivers.migration_problem(R550, R570, 'R535'))

    def test_bad_driver_info(self):
        for args in (('550.1', None, (3, 2)), ('550.1', None, (-1, 2)),
                     ('550.1', [], None), ('x', None, None)):
            self.assertRaises(exceptions.InvalidRequest,
                              drivers.DriverInfo.build, *args)

    def test_planner_uses_the_rule(self):
        t4 = self.model('T4')
        hosts = {n: fixtures.pcie_host(n, t4, gpus=1, numa_nodes=1)
                 for n in ('old', 'new', 'src')}
        p = H.Assignment('src', (H.Slot(0, H.VGPU, 'T4-8C'),))
        hosts['src'].allocate(p)
        guest = moves.Server('vm', p, movable=True, driver_branch='R550')
        rule = drivers.compatibility_rule({'old': R535, 'src': R550})
        self.assertFalse(rule(guest, 'old'))
        self.assertTrue(rule(guest, 'new'))  # no driver reported
        plan = moves.MovePlanner(compatible=rule).drain(hosts, [guest], 'src')
        self.assertEqual('new', plan.moves[0].destination.host)


class TestReport(base.TestCase):

    def host(self):
        return fixtures.pcie_host('c1', self.model('T4'), gpus=1)

    def test_round_trip_and_old_reports(self):
        data = report.host_to_dict(self.host(), drivers=R550)
        self.assertEqual({'driver_version': '550.54.14',
                          'guest_driver_branches': ['R535', 'R550'],
                          'vgpu_version_range': [0x10000, 0x110000]},
                         data['nvidia'])
        self.assertEqual(R550, report.parse(data, self.catalog).drivers)
        for version in (1, 2):
            old = report.host_to_dict(self.host(), version=version)
            self.assertNotIn('nvidia', old)
            self.assertIsNone(report.parse(old, self.catalog).drivers)

    def test_guest_branches_default_from_the_version(self):
        data = report.host_to_dict(self.host())
        data['nvidia'] = {'driver_version': '535.183.04'}
        info = report.parse(data, self.catalog).drivers
        self.assertEqual(('R470', 'R525', 'R535'), info.guest_branches)
        self.assertIsNone(info.vgpu_versions)

    def test_bad_fields_are_named(self):
        cases = [
            ({'driver_version': 5}, 'nvidia.driver_version'),
            ({}, 'nvidia.driver_version'),
            ({'driver_version': '550.54.14',
              'guest_driver_branches': ['R550', 'newest']}, 'nvidia'),
            ({'driver_version': '550.54.14',
              'vgpu_version_range': [1]}, 'nvidia.vgpu_version_range'),
            ({'driver_version': '550.54.14',
              'vgpu_version_range': [1, 2 ** 40]},
             'nvidia.vgpu_version_range[1]'),
            ('550', 'nvidia'),
        ]
        for raw, field in cases:
            data = report.host_to_dict(self.host())
            data['nvidia'] = raw
            e = self.assertRaises(report.ReportError, report.parse, data,
                                  self.catalog)
            self.assertEqual(field, e.field, raw)
            self.assertIn('c1', str(e))
