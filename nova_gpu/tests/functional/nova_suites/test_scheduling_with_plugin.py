"""Nova's own scheduling tests, run with nova-gpu added to every filter
and weigher list they configure.

An operator adds GpuFilter and the GPU weighers to whatever filters and
weighers a cloud already runs: server groups, NUMA, aggregates, flavor
extra specs of other namespaces, availability zones, cold migration. None
of these tests asks for a GPU; Nova must behave exactly as without the
plugin. These classes are Nova 34's own (``nova.tests.functional``),
unchanged: ``WithPlugin`` appends the plugin to the scheduler options
each test sets (``self.flags``) or leaves at their default, and makes
``all_filters`` / ``all_weighers`` list the plugin's classes, as though
Nova shipped them, so that tests naming their own available filters
still find GpuFilter.

Left out, because they fail the same way without the plugin on these
machines (their Neutron fixtures): ``test_pci_sriov_servers``' SR-IOV,
remote-managed and vDPA port classes, and
``NUMAServersWithNetworksTest``.
"""

import os
import sys

import fixtures
from nova.scheduler import filters as nova_filters
from nova.scheduler import weights as nova_weights
from nova.tests.functional.libvirt import test_numa_servers
from nova.tests.functional import test_aggregates
from nova.tests.functional import test_cold_migrate
from nova.tests.functional import test_flavor_extraspecs
from nova.tests.functional import test_json_filter
from nova.tests.functional import test_scheduler
from nova.tests.functional import test_server_group
from oslo_config import cfg

from nova_gpu.scheduler import filters as gpu_filters
from nova_gpu.scheduler import weighers as gpu_weighers

CONF = cfg.CONF
FILTER = 'GpuFilter'
WEIGHERS = ('nova_gpu.scheduler.weighers.GpuFragmentationWeigher',
            'nova_gpu.scheduler.weighers.GpuTopologyWeigher')
_ALL_FILTERS = nova_filters.all_filters
_ALL_WEIGHERS = nova_weights.all_weighers


def _with_filter(names):
    names = list(names)
    return names if FILTER in names else names + [FILTER]


def _with_weighers(names):
    names = list(names)
    if 'nova.scheduler.weights.all_weighers' in names:
        return names  # all_weighers lists them (``WithPlugin``)
    return names + [w for w in WEIGHERS if w not in names]


class WithPlugin:
    """GpuFilter and the GPU weighers in every scheduler the test starts."""

    def setUp(self):
        self.gpu_filters = []
        loaded = self.gpu_filters
        real_init = gpu_filters.GpuFilter.__init__

        def init(f, *args, **kwargs):
            loaded.append(f)
            real_init(f, *args, **kwargs)

        self.useFixture(fixtures.MonkeyPatch(
            'nova_gpu.scheduler.filters.GpuFilter.__init__', init))
        self.useFixture(fixtures.MonkeyPatch(
            'nova.scheduler.filters.all_filters',
            lambda: _ALL_FILTERS() + [gpu_filters.GpuFilter]))
        self.useFixture(fixtures.MonkeyPatch(
            'nova.scheduler.weights.all_weighers',
            lambda: _ALL_WEIGHERS() + [gpu_weighers.GpuFragmentationWeigher,
                                       gpu_weighers.GpuTopologyWeigher]))
        # Before Nova's setUp, which starts the services; Nova's config
        # fixture resets overrides at cleanup, and so does this one if
        # setUp fails before it.
        for group, name, value in (
                ('filter_scheduler', 'enabled_filters',
                 _with_filter(CONF.filter_scheduler.enabled_filters)),
                ('filter_scheduler', 'weight_classes',
                 _with_weighers(CONF.filter_scheduler.weight_classes)),
                # Nova's paste file, where the wheel installs it (as
                # test_vgpu_with_plugin and the cloud harness find it).
                ('wsgi', 'api_paste_config', os.path.join(
                    sys.prefix, 'etc', 'nova', 'api-paste.ini'))):
            CONF.set_override(name, value, group)
            self.addCleanup(CONF.clear_override, name, group)
        super().setUp()

    def flags(self, **kw):
        group = kw.get('group')
        if group == 'filter_scheduler':
            if 'enabled_filters' in kw:
                kw['enabled_filters'] = _with_filter(kw['enabled_filters'])
            if 'weight_classes' in kw:
                kw['weight_classes'] = _with_weighers(kw['weight_classes'])
        return super().flags(**kw)

    def test_plugin_loaded(self):
        # The scheduler setUp started runs GpuFilter.
        self.assertTrue(self.gpu_filters)


class NUMAServersTest(WithPlugin, test_numa_servers.NUMAServersTest):
    pass


class NUMAServersRebuildTests(WithPlugin,
                              test_numa_servers.NUMAServersRebuildTests):
    pass


class ReshapeForPCPUsTest(WithPlugin, test_numa_servers.ReshapeForPCPUsTest):
    pass


class ServerGroupTestV21(WithPlugin, test_server_group.ServerGroupTestV21):
    pass


class ServerGroupAffinityConfTest(
        WithPlugin, test_server_group.ServerGroupAffinityConfTest):
    pass


class TestAggregateFiltersTogether(
        WithPlugin, test_aggregates.TestAggregateFiltersTogether):
    pass


class IsolateAggregateFilterTest(
        WithPlugin, test_aggregates.IsolateAggregateFilterTest):
    pass


class AggregateInstanceExtraSpecsFilterTestCase(
        WithPlugin, test_scheduler.AggregateInstanceExtraSpecsFilterTestCase):
    pass


class AggregateImagePropertiesIsolationTestCase(
        WithPlugin, test_scheduler.AggregateImagePropertiesIsolationTestCase):
    pass


class FlavorExtraSpecsV286Test(
        WithPlugin, test_flavor_extraspecs.FlavorExtraSpecsV286Test):
    pass


class JsonFilterTestCase(WithPlugin, test_json_filter.JsonFilterTestCase):
    pass


class ColdMigrationDisallowSameHost(
        WithPlugin, test_cold_migrate.ColdMigrationDisallowSameHost):
    pass
