"""GpuFilter and the weighers on real Nova HostState and RequestSpec."""

import logging
import types

import fixtures
from nova import objects
from nova.scheduler import filters as nova_filters
from nova.scheduler import host_manager
from nova.scheduler import weights as nova_weights
from oslo_utils.fixture import uuidsentinel as uuids

from nova_gpu.tests.unit.scheduler import base


def candidate(*rps):
    return {'allocations': {rp: {'resources': {'VGPU': 1}} for rp in rps},
            'mappings': {'': list(rps)}}


class FilterCase(base.TestCase):

    def setUp(self):
        super().setUp()
        objects.register_all()
        from nova_gpu.scheduler import filters
        from nova_gpu.scheduler import weighers
        self.filter = filters.GpuFilter(self.view)
        self.weighers = [weighers.GpuFragmentationWeigher(),
                         weighers.GpuTopologyWeigher()]

    def host_state(self, nodename, candidates):
        state = host_manager.HostState(nodename, nodename, 'cell')
        state.uuid = nodename + '-root'
        state.allocation_candidates = candidates
        return state

    def request(self, **specs):
        flavor = objects.Flavor(
            name='f', vcpus=2, memory_mb=2048, root_gb=1, ephemeral_gb=0,
            swap=0, extra_specs={k.replace('__', ':'): v
                                 for k, v in specs.items()})
        return objects.RequestSpec(flavor=flavor, instance_uuid=uuids.i1,
                                   num_instances=1, scheduler_hints={},
                                   ignore_hosts=None, force_hosts=None,
                                   force_nodes=None)

    def run_filter(self, states, spec_obj):
        handler = nova_filters.HostFilterHandler()
        return handler.get_filtered_objects([self.filter], states, spec_obj)


class FilterTest(FilterCase):

    def test_candidates_reordered_to_the_best_gpu(self):
        self.add_host('h1', 'A100-40GB', vgpu_type='A100-10C', used={2: 1})
        state = self.host_state('h1', [candidate('h1-rp0'),
                                       candidate('h1-rp1'),
                                       candidate('h1-rp2')])
        passed = self.run_filter([state], self.request(resources__VGPU='1'))
        self.assertEqual([state], passed)
        self.assertEqual(['h1-rp2', 'h1-rp0', 'h1-rp1'],
                         [list(c['allocations'])[0]
                          for c in state.allocation_candidates])

    def test_candidates_on_a_gpu_left_out_of_the_report_are_dropped(self):
        # The agent left out a GPU NVML cannot read (report "left_out"):
        # Placement still offers its provider (h1-rp2), which stands for
        # no usable GPU; the host's other GPUs serve.
        log = self.useFixture(fixtures.FakeLogger(level=logging.INFO))
        data = base.gpu_report('h1', 'A100-40GB', count=3,
                               vgpu_type='A100-10C')
        data['left_out'] = [{'address': '0000:84:00.0',
                             'reason': 'GPU is lost',
                             'providers': [base.provider('h1', 3)]}]
        self.view.ingest(data)
        self.view.set_provider_uuids('h1', {
            base.provider('h1', 0): 'h1-rp0', base.provider('h1', 1):
            'h1-rp1', base.provider('h1', 2): 'h1-rp3',
            base.provider('h1', 3): 'h1-rp2'})
        state = self.host_state('h1', [candidate('h1-rp2'),
                                       candidate('h1-rp3'),
                                       candidate('h1-rp0')])
        passed = self.run_filter([state], self.request(resources__VGPU='1'))
        self.assertEqual([state], passed)
        self.assertEqual(['h1-rp0', 'h1-rp3'],
                         sorted(list(c['allocations'])[0]
                                for c in state.allocation_candidates))
        # A provider the view cannot name otherwise (a report behind
        # Placement) is still kept, after the others.
        state = self.host_state('h1', [candidate('h1-rp9'),
                                       candidate('h1-rp0')])
        self.run_filter([state], self.request(resources__VGPU='1'))
        self.assertEqual(['h1-rp0', 'h1-rp9'],
                         [list(c['allocations'])[0]
                          for c in state.allocation_candidates])
        # Only that GPU's candidates: the host is refused, with why.
        state = self.host_state('h1', [candidate('h1-rp2')])
        passed = self.run_filter([state], self.request(resources__VGPU='1'))
        self.assertEqual([], [s for s in passed if s.allocation_candidates])
        self.assertIn('Placement offered only providers of GPUs this '
                      'host\'s agent cannot read (0000:84:00.0: GPU is '
                      'lost)', log.output)

    def test_left_out_gpus_named_only_in_their_hosts_refusal(self):
        # h1 lost its fourth GPU; h2 has three: the same state, so they
        # share one ranking, but only h1's refusal names a GPU left out.
        log = self.useFixture(fixtures.FakeLogger(level=logging.INFO))
        for name, left_out in (('h1', True), ('h2', False)):
            data = base.gpu_report(name, 'A100-40GB', count=3,
                                   vgpu_type='A100-10C')
            if left_out:
                data['left_out'] = [{'address': '0000:84:00.0',
                                     'reason': 'GPU is lost',
                                     'providers': []}]
            self.view.ingest(data)
        states = [self.host_state(name, [candidate(name + '-rp0')])
                  for name in ('h2', 'h1')]
        self.assertEqual([], self.run_filter(states, self.request(
            gpu__count='4', resources1__VGPU='1', resources2__VGPU='1',
            resources3__VGPU='1', resources4__VGPU='1',
            group_policy='isolate')))
        self.assertIn('h1: 3 of 3 GPUs can take a vgpu device, 4 needed; '
                      'left out, its agent cannot read them: 0000:84:00.0 '
                      '(GPU is lost)', log.output)
        self.assertIn('h2: 3 of 3 GPUs can take a vgpu device, 4 needed',
                      log.output)
        self.assertEqual(1, log.output.count('left out'))

    def test_wrong_model_dropped_with_reason_logged(self):
        log = self.useFixture(fixtures.FakeLogger(level=logging.INFO))
        self.add_host('h1', 'A100-40GB', vgpu_type='A100-10C')
        state = self.host_state('h1', [candidate('h1-rp0')])
        passed = self.run_filter([state], self.request(
            gpu__profile='H100-10C', resources__VGPU='1'))
        self.assertEqual([], passed)
        self.assertIn('h1: has no GPU of model H100-80GB', log.output)

    def test_refusals_notified_by_reason(self):
        from nova_gpu.core import notification
        from nova_gpu.scheduler import notifier as notifications

        class Notifier:
            sent = []

            def info(self, ctxt, event_type, payload):
                self.sent.append((event_type, payload))
        notifications.set_notifier(Notifier())
        self.addCleanup(notifications.set_notifier, None)
        self.add_host('h1', 'A100-40GB', vgpu_type='A100-10C')
        self.add_host('h2', 'H100-80GB', vgpu_type='H100-10C')
        states = [self.host_state('h1', [candidate('h1-rp0')]),
                  self.host_state('h2', [candidate('h2-rp0')])]
        passed = self.run_filter(states, self.request(
            gpu__profile='H100-10C', resources__VGPU='1'))
        self.assertEqual(['h2'], [s.nodename for s in passed])
        # The request also fed the demand the scheduler publishes.
        [(event, payload)] = [(e, p) for e, p in Notifier.sent
                              if e != notification.DEMAND_EVENT]
        self.assertEqual(notification.REFUSAL_EVENT, event)
        data = payload['nova_object.data']
        self.assertEqual({notification.GPU_MODEL: 1}, data['refusals'])
        self.assertEqual(1, data['hosts_passed'])

    def test_invalid_candidate_pairs_dropped(self):
        self.add_host('h1', 'A100-40GB', vgpu_type='A100-10C', per_numa=2)
        state = self.host_state('h1', [
            candidate('h1-rp1', 'h1-rp2'), candidate('h1-rp2', 'h1-rp3'),
            candidate('h1-rp0', 'h1-rp3')])
        passed = self.run_filter([state], self.request(
            gpu__count='2', gpu__topology='numa', resources1__VGPU='1',
            resources2__VGPU='1', group_policy='isolate'))
        self.assertEqual([state], passed)
        self.assertEqual([candidate('h1-rp2', 'h1-rp3')],
                         state.allocation_candidates)

    def test_unknown_host_stock_flavor_passes_explicit_does_not(self):
        state = self.host_state('nohost', [candidate('x')])
        self.assertEqual([state], self.run_filter(
            [state], self.request(resources__VGPU='1')))
        self.assertEqual([], self.run_filter(
            [state], self.request(gpu__profile='A100-10C',
                                  resources__VGPU='1')))

    def test_flavor_without_placement_resources_refused(self):
        log = self.useFixture(fixtures.FakeLogger(level=logging.INFO))
        self.add_host('h1', 'A100-40GB', vgpu_type='A100-10C')
        state = self.host_state('h1', [candidate('h1-rp0')])
        self.assertEqual([], self.run_filter(
            [state], self.request(gpu__profile='A100-10C')))
        self.assertIn('set resources:VGPU=1', log.output)

    def test_no_gpu_request_untouched(self):
        state = self.host_state('h1', [candidate('h1-rp0')])
        self.assertEqual([state], self.run_filter([state], self.request()))

    def test_multi_create_counts_the_previous_claim(self):
        self.add_host('h1', 'A100-40GB', count=2, vgpu_type='A100-40C')
        state = self.host_state('h1', [candidate('h1-rp0'),
                                       candidate('h1-rp1')])
        spec_obj = self.request(resources__VGPU='1')
        self.run_filter([state], spec_obj)
        first = list(state.allocation_candidates[0]['allocations'])[0]
        # Nova claims candidate 0 and consumes the host, then filters the
        # next instance of the same request.
        state.num_instances += 1
        spec_obj.instance_uuid = uuids.i2
        passed = self.run_filter([state], spec_obj)
        self.assertEqual([state], passed)
        self.assertEqual(1, len(state.allocation_candidates))
        self.assertNotEqual(first, list(
            state.allocation_candidates[0]['allocations'])[0])

    def test_weighers_prefer_packing_host(self):
        self.add_host('h1', 'A100-40GB', vgpu_type='A100-10C')
        self.add_host('h2', 'A100-40GB', vgpu_type='A100-10C', used={0: 2})
        s1 = self.host_state('h1', [candidate('h1-rp0')])
        s2 = self.host_state('h2', [candidate('h2-rp0')])
        spec_obj = self.request(resources__VGPU='1')
        passed = self.run_filter([s1, s2], spec_obj)
        weighed = nova_weights.HostWeightHandler().get_weighed_objects(
            self.weighers, passed, spec_obj)
        self.assertEqual('h2', weighed[0].obj.nodename)

    def test_weighers_read_the_decision_from_the_host_state(self):
        from nova_gpu.scheduler import filters
        self.add_host('h1', 'A100-40GB', vgpu_type='A100-10C', used={0: 2})
        state = self.host_state('h1', [candidate('h1-rp1'),
                                       candidate('h1-rp0')])
        spec_obj = self.request(resources__VGPU='1')
        self.run_filter([state], spec_obj)
        decision = getattr(state, filters.DECISION)
        self.assertIsNone(decision.why)
        self.assertEqual((0,), decision.ranked.gpus)
        self.assertEqual((1, 0), decision.order)
        weigher = self.weighers[0]
        self.assertNotEqual(0.0, weigher._weigh_object(state, spec_obj))
        # Another request's weighing never reads this decision.
        other = self.request(resources__VGPU='1')
        self.assertEqual(0.0, weigher._weigh_object(state, other))

    def test_each_scheduler_service_owns_its_view(self):
        from nova_gpu.scheduler import filters
        from nova_gpu.scheduler import listener
        from nova_gpu.scheduler import view as view_mod

        class Manager:
            def __init__(self, gpu_filter):
                self.host_manager = type('HM', (), {
                    'enabled_filters': [gpu_filter], 'weighers': []})()
        self.conf.set_override('report_listener', False, 'gpu_scheduler')
        one, two = filters.GpuFilter(), filters.GpuFilter()
        early = one.view  # used before its service started: adopted
        first, second = Manager(one), Manager(two)
        listener.service_started(first)
        listener.service_started(second)
        self.assertIs(early, view_mod.of_service(first))
        self.assertIs(early, one.view)
        self.assertIs(view_mod.of_service(second), two.view)
        self.assertIsNot(one.view, two.view)
        self.assertIsNone(listener.listener_of(first))

    def test_weigher_multiplier_aggregate_override(self):
        self.add_host('h1', 'A100-40GB', vgpu_type='A100-10C')
        state = self.host_state('h1', [])
        state.aggregates = [objects.Aggregate(
            id=1, name='a', hosts=['h1'],
            metadata={'gpu_fragmentation_weight_multiplier': '-2.5'})]
        self.assertEqual(-2.5, self.weighers[0].weight_multiplier(state))
        self.assertEqual(1.0, self.weighers[1].weight_multiplier(state))


class ContainmentTest(FilterCase):
    """Issue 10 item 2: one bad host never breaks scheduling of others."""

    def test_bad_report_does_not_stop_gpu_scheduling(self):
        # Today's reproducer: a report with pcie_switch {} was accepted
        # and every later ranking of that host raised TypeError out of
        # the filter, so every GPU boot went to ERROR.
        from nova_gpu.core import report as report_mod
        from nova_gpu.scheduler import listener
        log = self.useFixture(fixtures.FakeLogger(level=logging.WARNING))
        self.add_host('h2', 'A100-40GB', vgpu_type='A100-10C')
        bad = base.gpu_report('h1', 'A100-40GB', vgpu_type='A100-10C')
        bad['gpus'][0]['pcie_switch'] = {}
        listener.ReportEndpoint(self.view).info(
            {}, 'nova-gpu-agent.h1', report_mod.EVENT_TYPE, bad, {})
        s1 = self.host_state('h1', [candidate('h1-rp0')])
        s2 = self.host_state('h2', [candidate('h2-rp0')])
        passed = self.run_filter([s1, s2],
                                 self.request(resources__VGPU='1'))
        # h1 has no usable report: a stock flavor treats it as Nova does.
        self.assertEqual([s1, s2], passed)
        self.assertIn('gpus[0].pcie_switch', log.output)

    def test_malformed_candidates_refuse_only_their_host(self):
        # Whatever a HostState carries as candidates (Nova sets a list),
        # the filter refuses that host with the reason and passes the
        # others.
        self.add_host('h1', 'A100-40GB', vgpu_type='A100-10C')
        self.add_host('h2', 'A100-40GB', vgpu_type='A100-10C')
        for bad in (5, object(), [None], [{'allocations': 7}]):
            s1 = self.host_state('h1', [])
            s1.allocation_candidates = bad
            s2 = self.host_state('h2', [candidate('h2-rp0')])
            spec_obj = self.request(resources__VGPU='1')
            passed = self.run_filter([s1, s2], spec_obj)
            self.assertIn(s2, passed, repr(bad))
            if s1 in passed:
                # Left for Nova to read: reading it refuses the host.
                self.assertEqual([], list(s1.allocation_candidates),
                                 repr(bad))

    def test_host_whose_ranking_raises_is_refused_once_logged(self):
        log = self.useFixture(fixtures.FakeLogger(level=logging.WARNING))
        self.add_host('h1', 'A100-40GB', vgpu_type='A100-10C')
        self.add_host('h2', 'A100-40GB', vgpu_type='A100-10C')
        real = self.view.ranking

        def ranking(entry, *args, **kwargs):
            if entry.nodename == 'h1':
                raise TypeError("unhashable type: 'dict'")
            return real(entry, *args, **kwargs)
        self.useFixture(fixtures.MonkeyPatch(
            'nova_gpu.scheduler.view.GpuView.ranking',
            lambda view, entry, *a, **kw: ranking(entry, *a, **kw)))
        for i in range(3):
            s1 = self.host_state('h1', [candidate('h1-rp0')])
            s2 = self.host_state('h2', [candidate('h2-rp0')])
            spec_obj = self.request(resources__VGPU='1')
            passed = self.run_filter([s1, s2], spec_obj)
            self.assertEqual([s2], passed)
            weighed = nova_weights.HostWeightHandler().get_weighed_objects(
                self.weighers, [s1, s2], spec_obj)
            self.assertEqual(2, len(weighed))
        lines = [line for line in log.output.splitlines()
                 if 'GpuFilter contained an error on host h1' in line]
        # Once per report of that host, not once per request.
        self.assertEqual(1, len(lines), log.output)
        self.assertIn('TypeError', lines[0])
        # A new report of h1: logged again.
        self.add_host('h1', 'A100-40GB', vgpu_type='A100-10C',
                      generation=2)
        self.run_filter([self.host_state('h1', [candidate('h1-rp0')])],
                        self.request(resources__VGPU='1'))
        self.assertEqual(2, log.output.count(
            'GpuFilter contained an error on host h1'))

    def test_weigher_error_weighs_neutral(self):
        log = self.useFixture(fixtures.FakeLogger(level=logging.WARNING))
        self.add_host('h1', 'A100-40GB', vgpu_type='A100-10C')
        self.add_host('h2', 'A100-40GB', vgpu_type='A100-10C')
        states = [self.host_state('h1', [candidate('h1-rp0')]),
                  self.host_state('h2', [candidate('h2-rp0')])]
        spec_obj = self.request(resources__VGPU='1')
        self.run_filter(states, spec_obj)
        self.useFixture(fixtures.MonkeyPatch(
            'nova_gpu.scheduler.filters.decision_of',
            lambda *a: (_ for _ in ()).throw(ValueError('boom'))))
        weighed = nova_weights.HostWeightHandler().get_weighed_objects(
            self.weighers, states, spec_obj)
        self.assertEqual(2, len(weighed))
        self.assertEqual([0.0, 0.0], [w.weight for w in weighed])
        self.assertIn('GpuFragmentationWeigher contained an error on host '
                      'h1', log.output)


class EveryProviderTest(FilterCase):
    """Issue 9 item 1: candidates are ordered on any provider of a GPU."""

    def add_vf_host(self, nodename, used=None):
        from nova_gpu.core import report as report_mod
        data = base.gpu_report(nodename, 'A100-40GB', vgpu_type='A100-10C',
                               used=used)
        for raw in data['gpus']:
            pf = raw['address']
            raw['providers'] = [report_mod.provider_dict(
                report_mod.mdev_provider_name(nodename, pf[:-1] + str(f)),
                report_mod.VF_MDEV, pf[:-1] + str(f),
                vgpu_type='A100-10C') for f in (4, 5)]
        entry = self.view.ingest(data)
        self.view.set_provider_uuids(nodename, {
            name: 'rp-' + name[-6:] for name in entry.providers})
        return entry

    def test_vf_providers_ordered_to_the_used_gpu(self):
        entry = self.add_vf_host('h1', used={2: 1})
        self.assertEqual(8, len(entry.uuids))
        vf = {index: sorted(u for u, i in entry.uuids.items()
                            if i == index) for index in range(4)}
        state = self.host_state('h1', [candidate(vf[0][0]),
                                       candidate(vf[1][1]),
                                       candidate(vf[2][1])])
        self.assertEqual([state], self.run_filter(
            [state], self.request(resources__VGPU='1')))
        self.assertEqual(vf[2][1], list(
            state.allocation_candidates[0]['allocations'])[0])

    def test_pci_class_counts_as_a_gpu_allocation(self):
        from nova_gpu.core import report as report_mod
        data = base.gpu_report('h1', 'A100-40GB', count=2)
        rc = report_mod.pci_default_resource_class('10de', '20b0')
        for raw in data['gpus']:
            raw['providers'] = [report_mod.provider_dict(
                report_mod.pci_provider_name('h1', raw['address']),
                report_mod.PCI_POOL, raw['address'], rc, 'A100-10C')]
        entry = self.view.ingest(data)
        pool = {'allocations': {'pool-1': {'resources': {rc: 1}},
                                'root': {'resources': {'VCPU': 2}}}}
        # Unresolved pool provider: the GPU is unknown, not "no GPU".
        self.assertIsNone(entry.gpus_of(pool, 'VGPU'))
        entry = self.view.ingest(dict(data, generation=2))
        self.view.set_provider_uuids('h1', {
            report_mod.pci_provider_name('h1', data['gpus'][1]['address']):
            'pool-1'})
        self.assertEqual((1,), entry.gpus_of(pool, 'VGPU'))

    def vfs_by_gpu(self, entry):
        return {index: sorted(u for u, i in entry.uuids.items()
                              if i == index) for index in range(4)}

    def test_two_vfs_of_one_gpu_are_not_two_gpus(self):
        # Two devices on distinct GPUs are two isolated request groups;
        # isolate separates providers, so Placement offers both devices
        # on two VFs of one GPU too.
        vf = self.vfs_by_gpu(self.add_vf_host('h1', used={0: 1}))
        same = candidate(vf[0][0], vf[0][1])
        distinct = candidate(vf[0][1], vf[1][0])
        state = self.host_state('h1', [same, distinct])
        self.assertEqual([state], self.run_filter([state], self.request(
            gpu__profile='A100-10C', gpu__count='2', resources1__VGPU='1',
            resources2__VGPU='1', group_policy='isolate')))
        self.assertEqual([distinct], state.allocation_candidates)
        # Only such candidates: the host is refused.
        state = self.host_state('h1', [same])
        self.assertEqual([], self.run_filter([state], self.request(
            gpu__profile='A100-10C', gpu__count='2', resources1__VGPU='1',
            resources2__VGPU='1', group_policy='isolate')))

    def multi_create_passes(self, state, candidates, spec_obj, passes):
        """Filter ``passes`` instances of one multi-create as Nova does:
        every pass gets the same candidates, and Nova claims candidate 0
        (returned, per pass) and consumes the host.
        """
        claimed = []
        for n in range(passes):
            state.allocation_candidates = list(candidates)
            spec_obj.instance_uuid = getattr(uuids, 'i%d' % n)
            self.assertEqual([state], self.run_filter([state], spec_obj))
            claimed.append(state.allocation_candidates[0])
            state.num_instances += 1
        return claimed

    def test_multi_create_never_claims_a_full_vf_again(self):
        entry = self.add_vf_host('h1', used={2: 1})
        vf = self.vfs_by_gpu(entry)
        candidates = [candidate(u) for i in range(4) for u in vf[i]
                      if u != vf[2][0]]  # vf[2][0] holds the used vGPU
        spec_obj = self.request(resources__VGPU='1')
        spec_obj.num_instances = 3
        claimed = self.multi_create_passes(self.host_state('h1', []),
                                           candidates, spec_obj, 3)
        rps = [list(c['allocations'])[0] for c in claimed]
        # Packed: the used GPU's other VF, then another GPU's two VFs,
        # each VF (one vGPU each) claimed once.
        self.assertEqual(vf[2][1], rps[0])
        self.assertEqual(3, len(set(rps)), rps)
        self.assertEqual(1, len({entry.uuids[rp] for rp in rps[1:]}))

    def test_multi_create_refuses_a_host_whose_vfs_are_full(self):
        entry = self.add_vf_host('h1')
        vf = self.vfs_by_gpu(entry)
        state = self.host_state('h1', [])
        spec_obj = self.request(resources__VGPU='1')
        spec_obj.num_instances = 2
        self.multi_create_passes(state, [candidate(vf[0][0])], spec_obj, 1)
        state.allocation_candidates = [candidate(vf[0][0])]
        spec_obj.instance_uuid = uuids.i9
        self.assertEqual([], self.run_filter([state], spec_obj))


class WeigherTiesTest(FilterCase):

    def test_hosts_in_identical_states_weigh_equal(self):
        from nova_gpu.scheduler import filters
        from nova_gpu.scheduler import weighers
        self.add_host('h1', 'A100-40GB', vgpu_type='A100-10C', used={0: 1})
        self.add_host('h2', 'A100-40GB', vgpu_type='A100-10C', used={0: 1})
        states = [self.host_state('h1', [candidate('h1-rp0')]),
                  self.host_state('h2', [candidate('h2-rp0')])]
        spec_obj = self.request(resources__VGPU='1')
        self.run_filter(states, spec_obj)
        # The same choice, computed along two paths: float noise.
        ranked = getattr(states[1], filters.DECISION).ranked
        noisy = ranked.choice._replace(
            frag_delta=ranked.choice.frag_delta + 2e-16)
        getattr(states[1], filters.DECISION).ranked = type(ranked)(
            ranked.gpus, noisy, ranked.request, ranked.free_milli,
            ranked.key)
        weigher = weighers.GpuFragmentationWeigher()
        self.assertEqual(weigher._weigh_object(states[0], spec_obj),
                         weigher._weigh_object(states[1], spec_obj))
        weighed = nova_weights.HostWeightHandler().get_weighed_objects(
            [weigher], states, spec_obj)
        # Nova's min-max normalisation leaves a tie a tie.
        self.assertEqual([0.0, 0.0], [w.weight for w in weighed])


class PlacedNotificationTest(FilterCase):
    """gpu.placement.decided: sent once per instance when Nova placed it
    (from what SchedulerManager.select_destinations returns, in
    nova-gpu-scheduler's manager), with the host Nova chose and the GPUs
    of candidate 0.
    """

    def setUp(self):
        super().setUp()
        self.sent = self.useFixture(base.Notifications())

    def consume(self, state, spec_obj, instance_uuid=None):
        """As Nova: the host consumed (``_consume_selected_host``), then
        ``select_destinations`` returns the selection, which
        ``manager.GpuSchedulerManager`` hands to ``notify_placements``.
        """
        from nova.scheduler import manager
        from nova_gpu.scheduler import filters
        if state.allocation_candidates:
            # Nova claims candidate 0 (SchedulerManager._schedule), which
            # reads it first.
            state.allocation_candidates[0]
        manager.SchedulerManager._consume_selected_host(
            state, spec_obj, instance_uuid=instance_uuid)
        selection = types.SimpleNamespace(service_host=state.host,
                                          nodename=state.nodename)
        return filters.notify_placements(spec_obj, [instance_uuid],
                                         [[selection]])

    def request(self, name='f', **specs):
        spec_obj = super().request(**specs)
        spec_obj.flavor.name = name
        # What HostState.consume_from_request reads.
        spec_obj.instance_group = None
        spec_obj.numa_topology = None
        spec_obj.pci_requests = objects.InstancePCIRequests(requests=[])
        return spec_obj

    def test_sent_once_with_the_gpus_of_candidate_0(self):
        self.add_host('h1', 'A100-40GB', vgpu_type='A100-10C', used={2: 1})
        # Nova's HostState.host (the compute service) and nodename differ.
        state = host_manager.HostState('compute-1', 'h1', 'cell')
        state.allocation_candidates = [candidate('h1-rp0'),
                                       candidate('h1-rp1'),
                                       candidate('h1-rp2')]
        spec_obj = self.request(resources__VGPU='1')
        self.run_filter([state], spec_obj)
        self.assertEqual([], self.sent.placed())  # not placed yet
        self.consume(state, spec_obj, instance_uuid=uuids.i1)
        (payload,) = self.sent.placed()
        self.assertEqual('compute-1', payload.host)
        self.assertEqual([2], payload.gpus)  # the packing choice: rp2
        self.assertEqual(['h1-rp2'],
                         list(state.allocation_candidates[0]['allocations']))
        self.assertEqual([[2, 'vgpu', 'A100-10C']], payload.slots)
        self.assertEqual(uuids.i1, payload.instance_uuid)
        self.assertEqual('f', payload.request)
        self.assertIsInstance(payload.fragmentation_delta, float)
        # Nova consumed the host as without the plugin.
        self.assertEqual(1, state.num_instances)
        # Once: the pass's choice is spent.
        self.consume(state, spec_obj, instance_uuid=uuids.i1)
        self.assertEqual(1, len(self.sent.placed()))

    def test_each_instance_of_a_multi_create(self):
        self.add_host('h1', 'A100-40GB', count=2, vgpu_type='A100-40C')
        state = self.host_state('h1', [candidate('h1-rp0'),
                                       candidate('h1-rp1')])
        spec_obj = self.request(resources__VGPU='1')
        spec_obj.num_instances = 2
        for uuid in (uuids.i1, uuids.i2):
            spec_obj.instance_uuid = uuid
            self.assertEqual([state], self.run_filter([state], spec_obj))
            self.consume(state, spec_obj, instance_uuid=uuid)
        # Two equally good empty GPUs: the first instance draws one
        # (core.engine.tie_break), the second gets the other.
        placed = [(p.instance_uuid, p.gpus) for p in self.sent.placed()]
        self.assertEqual([uuids.i1, uuids.i2], [u for u, _g in placed])
        self.assertEqual([[0], [1]], sorted(g for _u, g in placed))

    def test_another_request_filtering_the_host_meanwhile(self):
        from nova_gpu.scheduler import filters
        # nova-scheduler serves requests concurrently: B filters the same
        # HostState (its decision replaces A's there) while Nova claims
        # for A. A's notification still carries A's choice.
        self.add_host('h1', 'A100-40GB', vgpu_type='A100-10C', used={2: 1})
        state = self.host_state('h1', [candidate('h1-rp0'),
                                       candidate('h1-rp2')])
        a = self.request('a', resources__VGPU='1')
        b = self.request('b', resources__VGPU='1')
        b.instance_uuid = uuids.i2
        self.run_filter([state], a)
        first = state.allocation_candidates
        # Placement offered B only GPU 0 meanwhile.
        state.allocation_candidates = [candidate('h1-rp0')]
        self.run_filter([state], b)
        # B's candidates as Nova reads them: GPU 0, all Placement offered.
        self.assertEqual(['h1-rp0'], list(
            state.allocation_candidates[0]['allocations']))
        self.assertEqual((0,), getattr(state, filters.DECISION).ranked.gpus)
        state.allocation_candidates = first
        self.consume(state, a, instance_uuid=uuids.i1)
        (payload,) = self.sent.placed()
        self.assertEqual((uuids.i1, 'a', [2]), (
            payload.instance_uuid, payload.request, payload.gpus))

    def test_nothing_without_a_gpu_choice(self):
        self.add_host('h1', 'A100-40GB', vgpu_type='A100-10C')
        # Not a GPU request.
        plain = self.request()
        state = self.host_state('h1', [candidate('h1-rp0')])
        self.run_filter([state], plain)
        self.consume(state, plain, instance_uuid=uuids.i1)
        # No allocation candidates (Placement not used): the compute
        # chooses the device, not this plugin.
        spec_obj = self.request(resources__VGPU='1')
        state = self.host_state('h1', [])
        self.assertEqual([state], self.run_filter([state], spec_obj))
        self.consume(state, spec_obj, instance_uuid=uuids.i1)
        # Another instance than the pass's.
        state = self.host_state('h1', [candidate('h1-rp0')])
        self.run_filter([state], spec_obj)
        self.consume(state, spec_obj, instance_uuid=uuids.other)
        self.assertEqual([], self.sent.placed())

    def test_never_raises_into_scheduling(self):
        from nova_gpu.scheduler import notifier as notifications

        class Broken:
            def info(self, *args):
                raise RuntimeError('broker gone')
        notifications.set_notifier(Broken())
        log = self.useFixture(fixtures.FakeLogger(level=logging.WARNING))
        self.add_host('h1', 'A100-40GB', vgpu_type='A100-10C')
        state = self.host_state('h1', [candidate('h1-rp0')])
        spec_obj = self.request(resources__VGPU='1')
        self.run_filter([state], spec_obj)
        self.consume(state, spec_obj, instance_uuid=uuids.i1)
        self.assertEqual(1, state.num_instances)
        self.assertIn('gpu.placement.decided not sent: broker gone',
                      log.output)
