"""``[gpu_scheduler] candidate_order = selected_host`` with GpuWeigher.

Every test of the filter and weigher modules runs again in this mode: the
order Nova finds when it reads a host's candidates, the weights, the
notifications and the containment must be the same as when every host's
candidates are ordered in the filter. The tests below cover what differs:
when the candidates are read, and a host none of whose candidates can
serve, which Nova skips at claim time instead of the filter refusing it.
"""

import copy
import gc
import logging

import fixtures
from nova import objects
from nova.scheduler import weights as nova_weights
from oslo_utils.fixture import uuidsentinel as uuids

from nova_gpu.scheduler import filters
from nova_gpu.scheduler import weighers
from nova_gpu.tests.functional.scheduler import (
    test_filter_handlers as handlers)
from nova_gpu.tests.functional.scheduler import test_gpu_paths
from nova_gpu.tests.functional.scheduler import test_gpu_scheduling
from nova_gpu.tests.harness import service_conf

candidate = handlers.candidate


class SelectedHostMixin:

    def setUp(self):
        super().setUp()
        self.conf.set_override('candidate_order', 'selected_host',
                               'gpu_scheduler')


class ContainmentTest(SelectedHostMixin, handlers.ContainmentTest):
    pass


class WeigherTiesTest(SelectedHostMixin, handlers.WeigherTiesTest):
    pass


class FilterTest(SelectedHostMixin, handlers.FilterTest):

    def test_weighers_read_the_decision_from_the_host_state(self):
        self.add_host('h1', 'A100-40GB', vgpu_type='A100-10C', used={0: 2})
        state = self.host_state('h1', [candidate('h1-rp1'),
                                       candidate('h1-rp0')])
        spec_obj = self.request(resources__VGPU='1')
        self.run_filter([state], spec_obj)
        decision = getattr(state, filters.DECISION)
        # Weighed by the host's best GPU set; candidates not read yet.
        self.assertIsNone(decision.why)
        self.assertEqual((0,), decision.ranked.gpus)
        self.assertIsNone(decision.order)
        self.assertIsInstance(state.allocation_candidates,
                              filters.OrderedOnRead)
        self.assertNotEqual(0.0, weighers.GpuFragmentationWeigher()
                            ._weigh_object(state, spec_obj))
        # Nova reads candidate 0 of the host it claims on: in order now.
        self.assertEqual(['h1-rp0'],
                         list(state.allocation_candidates[0]['allocations']))
        self.assertEqual((1, 0), decision.order)
        self.assertIsNone(decision.ranking)
        other = self.request(resources__VGPU='1')
        self.assertEqual(0.0, weighers.GpuFragmentationWeigher()
                         ._weigh_object(state, other))

    def test_only_the_hosts_nova_reads_are_ordered(self):
        for name in ('h1', 'h2', 'h3'):
            self.add_host(name, 'A100-40GB', vgpu_type='A100-10C',
                          used={2: 1})
        states = [self.host_state(name, [candidate(name + '-rp0'),
                                         candidate(name + '-rp2')])
                  for name in ('h1', 'h2', 'h3')]
        ordered = []
        real = self.view.order_candidates
        self.useFixture(fixtures.MonkeyPatch(
            'nova_gpu.scheduler.view.GpuView.order_candidates',
            lambda view, decision, candidates: ordered.append(
                decision.entry.nodename) or real(decision, candidates)))
        spec_obj = self.request(resources__VGPU='1')
        self.assertEqual(states, self.run_filter(states, spec_obj))
        weighed = nova_weights.HostWeightHandler().get_weighed_objects(
            [weighers.GpuWeigher()], states, spec_obj)
        self.assertEqual([], ordered)
        # Nova's claim loop: ``if not host.allocation_candidates``, then
        # candidate 0; each read once.
        host = weighed[0].obj
        self.assertTrue(host.allocation_candidates)
        self.assertEqual([host.nodename + '-rp2'],
                         list(host.allocation_candidates[0]['allocations']))
        self.assertEqual(2, len(host.allocation_candidates))
        self.assertEqual([host.nodename], ordered)
        # Copies are plain lists, in order.
        self.assertEqual(list, type(copy.deepcopy(
            host.allocation_candidates)))
        self.assertEqual([host.nodename + '-rp2', host.nodename + '-rp0'],
                         [list(c['allocations'])[0] for c in
                          copy.deepcopy(host.allocation_candidates)])

    def test_host_without_a_candidate_that_serves_is_skipped_by_nova(self):
        log = self.useFixture(fixtures.FakeLogger(level=logging.INFO))
        # Two devices on distinct GPUs, but Placement offered both on two
        # VFs of one GPU (see EveryProviderTest): nothing there serves.
        self.add_host('h1', 'A100-40GB', vgpu_type='A100-10C', per_numa=2)
        state = self.host_state('h1', [candidate('h1-rp1', 'h1-rp2')])
        spec_obj = self.request(
            gpu__count='2', gpu__topology='numa', resources1__VGPU='1',
            resources2__VGPU='1', group_policy='isolate')
        # The host's GPUs can serve: it passes and is weighed.
        self.assertEqual([state], self.run_filter([state], spec_obj))
        decision = getattr(state, filters.DECISION)
        self.assertIsNotNone(decision.ranked)
        # Nova's claim loop finds no candidate and skips the host.
        self.assertFalse(state.allocation_candidates)
        self.assertEqual([], state.allocation_candidates)
        self.assertIsNone(decision.ranked)
        self.assertIn('Placement offered GPU providers that cannot serve',
                      decision.why)
        self.assertIn('GpuFilter: Nova skips host h1 for instance',
                      log.output)

    def test_error_ordering_candidates_skips_the_host_logged(self):
        log = self.useFixture(fixtures.FakeLogger(level=logging.WARNING))
        self.add_host('h1', 'A100-40GB', vgpu_type='A100-10C')
        state = self.host_state('h1', [candidate('h1-rp0')])
        spec_obj = self.request(resources__VGPU='1')
        self.assertEqual([state], self.run_filter([state], spec_obj))
        self.useFixture(fixtures.MonkeyPatch(
            'nova_gpu.scheduler.view.GpuView._ordered',
            lambda *a: (_ for _ in ()).throw(KeyError('gone'))))
        self.assertFalse(state.allocation_candidates)
        self.assertIn('GpuFilter contained an error on host h1', log.output)
        self.assertIn("KeyError: 'gone'", log.output)

    def test_multi_create_orders_every_host(self):
        self.add_host('h1', 'A100-40GB', count=2, vgpu_type='A100-40C')
        spec_obj = self.request(resources__VGPU='1')
        spec_obj.num_instances = 2
        state = self.host_state('h1', [candidate('h1-rp0')])
        self.run_filter([state], spec_obj)
        self.assertIs(list, type(state.allocation_candidates))
        state = self.host_state('h1', [candidate('h1-rp0')])
        self.run_filter([state], self.request(resources__VGPU='1'))
        self.assertIs(filters.OrderedOnRead,
                      type(state.allocation_candidates))

    def test_debug_logs_what_was_kept(self):
        log = self.useFixture(fixtures.FakeLogger(level=logging.DEBUG))
        self.add_host('h1', 'A100-40GB', vgpu_type='A100-10C', used={2: 1})
        state = self.host_state('h1', [candidate('h1-rp0'),
                                       candidate('h1-rp2')])
        self.run_filter([state], self.request(resources__VGPU='1'))
        self.assertIs(filters.OrderedOnRead,
                      type(state.allocation_candidates))
        self.assertNotIn('allocation candidates of host h1', log.output)
        self.assertTrue(state.allocation_candidates)
        self.assertIn('GpuFilter: 2 of the 2 allocation candidates of host '
                      'h1 kept for instance %s, candidate 0 on GPUs (2,)'
                      % uuids.i1, log.output)


class OrderedOnReadTest(SelectedHostMixin, handlers.FilterCase):
    """The list Nova finds behaves as the ordered list, whatever it does
    with it first, and holds no candidate until then.
    """

    def unread(self):
        self.add_host('h1', 'A100-40GB', vgpu_type='A100-10C',
                      used={2: 1, 3: 2})
        placed = [candidate('h1-rp0'), candidate('h1-rp1'),
                  candidate('h1-rp3'), candidate('h1-rp2')]
        state = self.host_state('h1', copy.deepcopy(placed))
        self.run_filter([state], self.request(resources__VGPU='1'))
        self.assertIs(filters.OrderedOnRead,
                      type(state.allocation_candidates))
        return state.allocation_candidates

    def test_unread_candidates_are_one_reference(self):
        # Python's garbage collector reads every object a young object
        # refers to: the unread list refers to Placement's list, not to
        # each candidate.
        unread = self.unread()
        referents = gc.get_referents(unread)
        self.assertEqual(1, sum(type(r) is list for r in referents))
        self.assertFalse([r for r in referents if type(r) is dict])
        self.assertEqual(0, list.__len__(unread))
        self.assertEqual(4, len(unread))
        self.assertEqual(4, list.__len__(unread))

    def test_every_read_and_change_sees_the_order(self):
        expected = list(self.unread())
        self.assertEqual(['h1-rp3', 'h1-rp2', 'h1-rp0', 'h1-rp1'],
                         [list(c['allocations'])[0] for c in expected])
        extra = candidate('h1-rp9')
        operations = {
            'len': len, 'bool': bool, 'first': lambda c: c[0],
            'last': lambda c: c[-1], 'slice': lambda c: c[1:3],
            'iter': list, 'reversed': lambda c: list(reversed(c)),
            'in': lambda c: expected[2] in c, 'eq': lambda c: c == expected,
            'ne': lambda c: c != expected, 'lt': lambda c: c < expected,
            'repr': repr, 'str': str, 'add': lambda c: c + [extra],
            'radd': lambda c: [extra] + c, 'mul': lambda c: c * 2,
            'rmul': lambda c: 2 * c, 'copy': lambda c: c.copy(),
            'deepcopy': copy.deepcopy, 'index': lambda c: c.index(
                expected[1]),
            'count': lambda c: c.count(expected[0]),
            'append': lambda c: c.append(extra) or list(c),
            'extend': lambda c: c.extend([extra]) or list(c),
            'insert': lambda c: c.insert(1, extra) or list(c),
            'pop': lambda c: (c.pop(), list(c)),
            'remove': lambda c: c.remove(expected[0]) or list(c),
            'reverse': lambda c: c.reverse() or list(c),
            'sort': lambda c: c.sort(key=str) or list(c),
            'clear': lambda c: c.clear() or list(c),
            'setitem': lambda c: c.__setitem__(0, extra) or list(c),
            'delitem': lambda c: c.__delitem__(0) or list(c),
            'iadd': lambda c: list(c.__iadd__([extra])),
            'extended by': lambda c: [extra].__iadd__(c),
            'sorted': lambda c: sorted(c, key=str),
            'tuple': tuple, 'max': lambda c: max(c, key=str),
        }
        for name, operation in operations.items():
            self.assertEqual(operation(copy.deepcopy(expected)),
                             operation(self.unread()), name)


class EveryProviderTest(SelectedHostMixin, handlers.EveryProviderTest):

    def test_two_vfs_of_one_gpu_are_not_two_gpus(self):
        vf = self.vfs_by_gpu(self.add_vf_host('h1', used={0: 1}))
        same = candidate(vf[0][0], vf[0][1])
        distinct = candidate(vf[0][1], vf[1][0])
        spec_obj = self.request(
            gpu__profile='A100-10C', gpu__count='2', resources1__VGPU='1',
            resources2__VGPU='1', group_policy='isolate')
        state = self.host_state('h1', [same, distinct])
        self.assertEqual([state], self.run_filter([state], spec_obj))
        self.assertEqual([distinct], state.allocation_candidates)
        # Only such candidates: the host passes (its GPUs can serve), and
        # Nova, reading its candidates, finds none.
        state = self.host_state('h1', [same])
        self.assertEqual([state], self.run_filter([state], spec_obj))
        self.assertEqual(0, len(state.allocation_candidates))


class PlacedNotificationTest(SelectedHostMixin,
                             handlers.PlacedNotificationTest):
    pass


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


class _RealNova:
    """Real boots through Nova's own claim loop, in this mode."""

    SCHEDULER_FILES = service_conf.LARGE_CLOUD_FILES

    def setUp(self):
        super().setUp()
        # Nova's test logging is at DEBUG, where SchedulerManager logs
        # every filtered and weighed HostState, whose repr reads the
        # number of its candidates (and so puts them in order): as in a
        # scheduler without debug, only the hosts Nova claims on (and its
        # alternates) are read here.
        manager_log = logging.getLogger('nova.scheduler.manager')
        self.addCleanup(manager_log.setLevel, manager_log.level)
        manager_log.setLevel(logging.INFO)


class PluginPlacementTest(_RealNova,
                          test_gpu_scheduling.PluginPlacementTest):

    def test_only_the_claimed_hosts_candidates_are_ordered(self):
        # No alternates: Nova reads the candidates of the host it claims
        # on only.
        self.flags(max_attempts=1, group='scheduler')
        server = self.boot(self.create_gpu_flavor({'resources:VGPU': '1'}))
        decisions = self._decisions[server['id']]
        host = self.host_of(server)
        self.assertIsNone(decisions[host].ranking)
        self.assertIsNotNone(decisions[host].order)
        self.assertEqual(self.gpus_of(server), list(self.ranked_first(
            server)))
        others = [d for name, d in decisions.items()
                  if name != host and d.why is None]
        self.assertEqual(2, len(others))
        for decision in others:
            self.assertIsNotNone(decision.ranking)
            self.assertIsNone(decision.order)


class PluginPathsTest(_RealNova, test_gpu_paths.PluginPathsTest):
    pass


class PluginTopologyTest(_RealNova, test_gpu_paths.PluginTopologyTest):
    pass
