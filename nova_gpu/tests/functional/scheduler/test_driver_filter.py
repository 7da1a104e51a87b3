"""GpuDriverFilter: the image's guest driver branch against each host."""


import fixtures
from nova import objects
from nova.tests import fixtures as nova_fixtures
from nova.tests.unit.scheduler import fakes
from oslo_utils import uuidutils

from nova_gpu.core import drivers
from nova_gpu.core import report as report_mod
from nova_gpu.scheduler import driver_filter
from nova_gpu.tests.harness import cloud
from nova_gpu.tests.harness import service_conf
from nova_gpu.tests.unit.scheduler import base

objects.register_all()


class TestGpuDriverFilter(base.TestCase):

    def setUp(self):
        super().setUp()
        self.glance = self.useFixture(nova_fixtures.GlanceFixture(self))
        self.reports = {}
        self.filter = driver_filter.GpuDriverFilter(
            drivers_of=self.drivers_of)
        for name, version in (('old', '535.183.04'), ('new', '550.54.14'),
                              ('bare', None)):
            data = base.gpu_report(name, 'T4', count=1, vgpu_type='T4-4C')
            if version:
                data['nvidia'] = {'driver_version': version}
            self.reports[name] = report_mod.parse(data, base.CATALOG)

    def stub_out(self, old, new):  # what GlanceFixture asks of a test
        self.useFixture(fixtures.MonkeyPatch(old, new))

    def drivers_of(self, nodename):
        return self.reports[nodename].drivers

    def spec(self, branch=None):
        props = {} if branch is None else {drivers.IMAGE_PROPERTY: branch}
        image = uuidutils.generate_uuid()
        self.glance.create(None, {'id': image, 'name': 'guest',
                                  'properties': props})
        return objects.RequestSpec(
            image=objects.ImageMeta.from_dict({'id': image,
                                               'properties': {}}))

    def passing(self, spec):
        return sorted(n for n in self.reports if self.filter.host_passes(
            fakes.FakeHostState(n, n, {}), spec))

    def test_branch_keeps_compatible_hosts_and_unknown_ones(self):
        self.assertEqual(['bare', 'new'], self.passing(self.spec('R550')))

    def test_previous_branch_runs_on_both(self):
        self.assertEqual(['bare', 'new', 'old'],
                         self.passing(self.spec('535')))

    def test_no_branch_no_check(self):
        self.assertEqual(['bare', 'new', 'old'], self.passing(self.spec()))

    def test_refusal_is_logged_with_the_reason(self):
        log = self.useFixture(fixtures.FakeLogger())
        self.passing(self.spec('R550'))
        self.assertIn('host old (old) refused: guest driver branch R550 '
                      'is not supported by the vGPU manager 535.183.04',
                      log.output)

    def test_malformed_branch_refused_everywhere_with_a_clear_error(self):
        log = self.useFixture(fixtures.FakeLogger())
        self.assertEqual([], self.passing(self.spec('newest')))
        self.assertIn('nvidia_guest_driver_branch: NVIDIA driver branch '
                      "must look like R550 or 550, got 'newest'", log.output)

    def test_unreadable_image_is_not_checked_nor_cached(self):
        spec = objects.RequestSpec(image=objects.ImageMeta.from_dict(
            {'id': 'c0ffee00-0000-4000-8000-000000000000'}))
        self.assertEqual(['bare', 'new', 'old'], self.passing(spec))
        self.glance.create(None, {
            'id': 'c0ffee00-0000-4000-8000-000000000000',
            'properties': {drivers.IMAGE_PROPERTY: 'R550'}})
        self.assertEqual(['bare', 'new'], self.passing(spec))

    def test_a_failing_host_lookup_only_affects_that_host(self):
        def drivers_of(nodename):
            if nodename == 'old':
                raise RuntimeError('boom')
            return self.reports[nodename].drivers
        self.filter.drivers_of = drivers_of
        self.assertEqual(['bare', 'new', 'old'],
                         self.passing(self.spec('R550')))

    def test_reads_the_view_by_default(self):
        # The view's host entries carry no driver info yet: every host
        # passes (see driver_filter.view_drivers).
        self.view.ingest(base.gpu_report('v1', 'T4', count=1,
                                         vgpu_type='T4-4C'))
        plain = driver_filter.GpuDriverFilter(view=self.view)
        self.assertTrue(plain.host_passes(fakes.FakeHostState('v1', 'v1', {}),
                                          self.spec('R550')))
        self.assertIsNone(driver_filter.view_drivers(self.view, 'nobody'))


# -- in a real Nova ----------------------------------------------------------

# Two T4 hosts: one runs the R535 vGPU manager, one R550.
DRIVERS = {'t4-old': '535.183.04', 't4-new': '550.54.14'}


class DriverAwarePlacementTest(cloud.GpuCloudTestCase):
    HOSTS = tuple(cloud.GpuHost(name, 'T4', 'T4-16C', gpus=1)
                  for name in sorted(DRIVERS))
    SCHEDULER_FILES = service_conf.DRIVER_FILTER_FILES

    def setUp(self):
        super().setUp()
        hm = self.schedulers[0].manager.host_manager
        (self.filter,) = [f for f in hm.enabled_filters
                          if isinstance(f, driver_filter.GpuDriverFilter)]
        # The view's host entries do not keep the report's driver info
        # yet (scheduler/hosts.py); until they do, the filter reads the
        # same reports, parsed by the same contract, from here.
        self.filter.drivers_of = lambda nodename: report_mod.parse(
            self.gpu_report(nodename), base.CATALOG).drivers

    def gpu_report(self, hostname):
        data = super().gpu_report(hostname)
        data['nvidia'] = {'driver_version': DRIVERS[hostname]}
        return data

    def boot_image(self, branch, expected_state='ACTIVE'):
        image = uuidutils.generate_uuid()
        self.glance.create(None, {
            'id': image, 'name': 'guest-%s' % branch, 'status': 'active',
            'container_format': 'bare', 'disk_format': 'raw',
            'properties': {drivers.IMAGE_PROPERTY: branch}})
        flavor = self.create_gpu_flavor({'resources:VGPU': '1'})
        return self._create_server(image_uuid=image, flavor_id=flavor,
                                   networks='none',
                                   expected_state=expected_state)

    def host_of(self, server):
        return self.admin_api.get_server(server['id'])[
            'OS-EXT-SRV-ATTR:host']

    def test_new_guest_driver_only_on_the_new_manager(self):
        log = self.useFixture(fixtures.FakeLogger())
        first = self.boot_image('R550')
        self.assertEqual('t4-new', self.host_of(first))
        self.assertIn('host t4-old (t4-old) refused: guest driver branch '
                      'R550 is not supported by the vGPU manager '
                      '535.183.04 (supports R470, R525, R535)', log.output)
        # The one T4 that runs R550 is full: no valid host, although
        # t4-old has a free GPU.
        self.boot_image('R550', expected_state='ERROR')

    def test_previous_branch_runs_on_either(self):
        hosts = {self.host_of(self.boot_image('R535')) for _ in range(2)}
        self.assertEqual(set(DRIVERS), hosts)
