"""GpuWeigher (``etc/nova/nova-scheduler-large-cloud.conf``): the weights
of GpuFragmentationWeigher and GpuTopologyWeigher in one weigher.
"""

import logging

import fixtures
from nova import objects
from nova.scheduler import weights as nova_weights

from nova_gpu.scheduler import filters
from nova_gpu.scheduler import weighers
from nova_gpu.tests.functional.scheduler import (
    test_filter_handlers as handlers)
from nova_gpu.tests.functional.scheduler import test_gpu_paths
from nova_gpu.tests.harness import service_conf

candidate = handlers.candidate


class GpuWeigherTest(handlers.FilterCase):
    """GpuWeigher gives Nova's weighing the sum of the two weighers."""

    def weigh(self, weigher_list, states, spec_obj):
        return {w.obj.nodename: w.weight for w in
                nova_weights.HostWeightHandler().get_weighed_objects(
                    weigher_list, states, spec_obj)}

    def states(self):
        self.add_host('h1', 'A100-40GB', vgpu_type='A100-10C')
        self.add_host('h2', 'A100-40GB', vgpu_type='A100-10C', used={0: 2})
        self.add_host('h3', 'A100-40GB', vgpu_type='A100-10C', per_numa=2,
                      used={1: 3})
        self.add_host('h4', 'H100-80GB', vgpu_type='H100-10C')
        return [self.host_state(name, [candidate(name + '-rp%d' % i)
                                       for i in range(4)])
                for name in ('h1', 'h2', 'h3', 'h4')]

    def assert_same_weights(self, states, spec_obj):
        self.run_filter(states, spec_obj)
        two = self.weigh(self.weighers, states, spec_obj)
        one = self.weigh([weighers.GpuWeigher()], states, spec_obj)
        self.assertEqual(sorted(two), sorted(one))
        for name in two:
            self.assertAlmostEqual(two[name], one[name], places=12)
        return one

    def test_same_weights_as_both_weighers(self):
        states = self.states()
        spec_obj = self.request(resources__VGPU='1')
        one = self.assert_same_weights(states, spec_obj)
        self.assertNotEqual(1, len(set(one.values())), one)

    def test_multipliers_and_aggregate_overrides(self):
        self.conf.set_override('fragmentation_weight_multiplier', 2.5,
                               'gpu_scheduler')
        self.conf.set_override('topology_weight_multiplier', -1.0,
                               'gpu_scheduler')
        self.weighers = [weighers.GpuFragmentationWeigher(),
                         weighers.GpuTopologyWeigher()]
        states = self.states()
        states[1].aggregates = [objects.Aggregate(
            id=1, name='a', hosts=['h2'],
            metadata={'gpu_fragmentation_weight_multiplier': '-4',
                      'gpu_topology_weight_multiplier': '3'})]
        self.assert_same_weights(states, self.request(resources__VGPU='1'))

    def test_ties_stay_ties(self):
        self.add_host('h1', 'A100-40GB', vgpu_type='A100-10C', used={0: 1})
        self.add_host('h2', 'A100-40GB', vgpu_type='A100-10C', used={0: 1})
        states = [self.host_state('h1', [candidate('h1-rp0')]),
                  self.host_state('h2', [candidate('h2-rp0')])]
        spec_obj = self.request(resources__VGPU='1')
        self.run_filter(states, spec_obj)
        self.assertEqual({'h1': 0.0, 'h2': 0.0},
                         self.weigh([weighers.GpuWeigher()], states,
                                    spec_obj))

    def test_error_on_one_host_weighs_it_neutral(self):
        log = self.useFixture(fixtures.FakeLogger(level=logging.WARNING))
        states = self.states()
        spec_obj = self.request(resources__VGPU='1')
        self.run_filter(states, spec_obj)
        bad = getattr(states[1], filters.DECISION).ranked
        real = weighers.GpuTopologyWeigher._weight

        def weight(weigher, ranked):
            if ranked is bad:
                raise ValueError('boom')
            return real(weigher, ranked)
        self.useFixture(fixtures.MonkeyPatch(
            'nova_gpu.scheduler.weighers.GpuTopologyWeigher._weight',
            weight))
        weights = self.weigh([weighers.GpuWeigher()], states, spec_obj)
        self.assertEqual(4, len(weights))
        self.assertIn('GpuWeigher contained an error on host h2 ',
                      log.output)
        self.assertIn('weighed neutral: ValueError: boom', log.output)
        # Not from this pass (or another filter dropped hosts since): read
        # host by host, from each HostState, and contained the same way.
        self.useFixture(fixtures.MonkeyPatch(
            'nova_gpu.scheduler.filters.decisions_of', lambda *a: None))
        self.useFixture(fixtures.MonkeyPatch(
            'nova_gpu.scheduler.filters.decision_of',
            lambda *a: (_ for _ in ()).throw(KeyError('gone'))))
        self.add_host('h1', 'A100-40GB', vgpu_type='A100-10C',
                      generation=2)  # a new report: logged again
        weights = self.weigh([weighers.GpuWeigher()], states, spec_obj)
        self.assertEqual({'h1': 0.0, 'h2': 0.0, 'h3': 0.0, 'h4': 0.0},
                         weights)
        self.assertIn('GpuWeigher contained an error on host h1 ',
                      log.output)
        self.assertIn("weighed neutral: KeyError: 'gone'", log.output)

    def test_weighs_this_passs_decisions(self):
        states = self.states()
        spec_obj = self.request(resources__VGPU='1')
        self.run_filter(states, spec_obj)
        expected = self.weigh([weighers.GpuWeigher()], states, spec_obj)
        # Another request filters the same HostStates meanwhile: its
        # decisions replace this one's there, not in this pass's record.
        self.run_filter(states, self.request(resources__VGPU='1'))
        self.assertEqual(expected, self.weigh([weighers.GpuWeigher()],
                                              states, spec_obj))
        # A filter after GpuFilter dropped a host: host by host.
        self.assertIsNone(filters.decisions_of(states[1:], spec_obj))
        self.assertIsNotNone(filters.decisions_of(states, spec_obj))


class LargeCloudPathsTest(test_gpu_paths.PluginPathsTest):
    """Every GPU path, booted with the large clouds' scheduler files."""

    SCHEDULER_FILES = service_conf.LARGE_CLOUD_FILES


class LargeCloudTopologyTest(test_gpu_paths.PluginTopologyTest):

    SCHEDULER_FILES = service_conf.LARGE_CLOUD_FILES
