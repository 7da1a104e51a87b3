"""The scheduler cost benchmark gives the plugin what nova-scheduler gives
it, request after request: its figures are only as true as that.
"""

import io
from unittest import mock

from nova import objects
from nova.scheduler import host_manager

from nova_gpu.bench import scheduler_cost
from nova_gpu.core import report as report_mod
from nova_gpu.scheduler import filters
from nova_gpu.scheduler import view as view_mod
from nova_gpu.scheduler import weighers
from nova_gpu.tests.unit.scheduler import base

HOSTS = 12


class BenchmarkRequestsTest(base.TestCase):

    def setUp(self):
        super().setUp()
        objects.register_all()
        self.conf.set_override('demand_publish_interval', 0,
                               'gpu_scheduler')
        self.view, self.states, flavor, _bytes = scheduler_cost._ours(
            HOSTS, objects, host_manager, view_mod, report_mod)
        self.spec = scheduler_cost._request(objects, flavor)

    def _requests(self, rounds, weigher_list):
        return scheduler_cost._time([filters.GpuFilter(self.view)],
                                    weigher_list, self.states, self.spec,
                                    rounds)

    def test_every_request_gets_new_numa_objects_of_the_same_update(self):
        # As HostManager._get_host_states + HostState.
        # _update_from_compute_node do before every request.
        before = [(s.numa_topology, s.updated) for s in self.states]
        self._requests(1, [])
        for state, (topo, updated) in zip(self.states, before):
            self.assertIsNot(topo, state.numa_topology)
            self.assertEqual(topo._to_json(), state.numa_topology._to_json())
            self.assertEqual(updated, state.updated)
            self.assertIsNotNone(updated)

    def test_both_configurations_pass_every_host(self):
        for label, names in scheduler_cost.CONFIGS:
            _times, passed = self._requests(
                2, [getattr(weighers, name)() for name in names])
            self.assertEqual(HOSTS, passed, label)

    def test_warm_requests_read_no_numa_cells(self):
        # The compute nodes' last update is a minute old: after the first
        # request, the cells read with it stand for its later copies.
        self._requests(1, [weighers.GpuWeigher()])
        with mock.patch.object(filters, '_cell_usage',
                               wraps=filters._cell_usage) as read:
            self._requests(2, [weighers.GpuWeigher()])
        self.assertEqual(0, read.call_count)


class FloorBesideEachConfigurationTest(base.TestCase):

    def test_each_configuration_is_compared_with_a_floor_on_its_hosts(self):
        # The floor's passes alternate with each configuration's warm
        # passes on the same hosts: a floor measured on other hosts, at
        # another moment, moved the figures above it by microseconds.
        calls = []
        real = scheduler_cost._time

        def recorded(filter_list, weigher_list, states, spec, rounds,
                     original=None):
            # The hosts themselves, kept: ids of freed lists are reused.
            calls.append((type(filter_list[0]).__name__, states, rounds))
            return real(filter_list, weigher_list, states, spec, rounds,
                        original)

        out = io.StringIO()
        with mock.patch.object(scheduler_cost, '_time', recorded), \
                mock.patch.object(scheduler_cost, 'COLD_ROUNDS', 1):
            scheduler_cost.run(sizes=(4,), out=out, in_tree=False)
        floors = [c for c in calls if c[0] == 'AllHostsFilter']
        self.assertEqual(len(scheduler_cost.CONFIGS) *
                         scheduler_cost.WARM_PASSES, len(floors))
        timed = [c for c in calls if c[0] == 'GpuFilter' and c[2] == 1]
        floor_hosts = list({id(c[1]): c[1] for c in floors}.values())
        self.assertEqual(len(scheduler_cost.CONFIGS), len(floor_hosts))
        for hosts in floor_hosts:
            self.assertEqual(scheduler_cost.WARM_PASSES + 1, len(
                [c for c in timed if c[1] is hosts]))
        self.assertIn('4 hosts, one weigher  : warm', out.getvalue())
