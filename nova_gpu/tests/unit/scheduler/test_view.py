import logging

import fixtures

from nova_gpu.bench import reliability_reports
from nova_gpu.core import report as report_mod
from nova_gpu.scheduler import gpu_spec
from nova_gpu.scheduler import listener
from nova_gpu.tests.unit.scheduler import base


def spec(**specs):
    return gpu_spec.parse({k.replace('__', ':'): v for k, v in specs.items()},
                          base.CATALOG, vcpus=4, memory_mb=8192)


STOCK = spec(resources__VGPU='1')


class ViewTest(base.TestCase):

    def test_packs_onto_the_used_gpu(self):
        entry = self.add_host('h1', 'A100-40GB', vgpu_type='A100-10C',
                              used={2: 1})
        ranking = self.view.ranking(entry, STOCK)
        self.assertEqual((2,), ranking.items[0].gpus)
        self.assertEqual(4, len(ranking.items))

    def test_full_gpu_is_not_ranked_and_reason_given(self):
        entry = self.add_host('h1', 'A100-40GB', count=1,
                              vgpu_type='A100-10C', used={0: 4})
        ranking = self.view.ranking(entry, STOCK)
        self.assertEqual((), ranking.items)
        self.assertIn('0 of 1 GPUs', ranking.why)

    def test_host_reporting_no_gpus_is_refused_with_a_reason(self):
        # A report may list no GPU (all lost since the last one); every
        # kind of request gets a reason, not an error from the ranking.
        entry = self.add_host('h1', 'A100-40GB', count=0)
        self.assertEqual(0, len(entry.host.gpus))
        for asked in (STOCK, spec(gpu__kind='whole', gpu__count='2'),
                      spec(gpu__mig='3g.20gb', resources__VGPU='1')):
            ranking = self.view.ranking(entry, asked)
            self.assertEqual((), ranking.items)
            self.assertEqual('no GPUs reported', ranking.why)

    def test_wrong_model_reason(self):
        entry = self.add_host('h1', 'A100-40GB', vgpu_type='A100-10C')
        ranking = self.view.ranking(
            entry, spec(gpu__model='H100-80GB', resources__VGPU='1'))
        self.assertIn('has no GPU of model H100-80GB (it has A100-40GB)',
                      ranking.why)

    def test_numa_topology_pairs(self):
        entry = self.add_host('h1', 'A100-40GB', vgpu_type='A100-10C',
                              per_numa=2)
        ranking = self.view.ranking(entry, spec(
            gpu__count='2', gpu__topology='numa', resources1__VGPU='1',
            resources2__VGPU='1'))
        self.assertTrue(ranking.items)
        for item in ranking.items:
            self.assertIn(item.gpus, [(0, 1), (2, 3)])
        pair = spec(gpu__count='2', gpu__topology='numa',
                    resources1__VGPU='1', resources2__VGPU='1')
        ranking = self.view.ranking(entry, pair)
        self.assertEqual((2, 3), self.view.evaluate(entry, pair, ranking,
                                                    (2, 3)).gpus)
        self.assertIsNone(self.view.evaluate(entry, pair, ranking, (1, 2)))

    def test_nvlink_pairs(self):
        entry = self.add_host('h1', 'H100-80GB', vgpu_type='H100-10C',
                              per_numa=4, nvlink=[(0, 3), (1, 2)])
        nv = spec(gpu__count='2', gpu__topology='nvlink',
                  resources1__VGPU='1', resources2__VGPU='1')
        gpus = {item.gpus for item in self.view.ranking(entry, nv).items}
        self.assertTrue(gpus)
        self.assertLessEqual(gpus, {(0, 3), (1, 2)})
        ranking = self.view.ranking(entry, nv)
        self.assertIsNone(self.view.evaluate(entry, nv, ranking, (0, 1)))

    def test_by_need_prefers_smallest_device(self):
        entry = self.add_host('h1', 'A100-40GB', vgpu_type=None)
        entry.host.gpus[0].vgpu_types = ('A100-40C',)
        entry.host.gpus[1].vgpu_types = ('A100-20C',)
        entry.host.gpus[2].vgpu_types = ('A100-10C',)
        entry.host.gpus[3].vgpu_types = ('A100-20C',)
        entry.changed()
        ranking = self.view.ranking(entry, spec(
            gpu__memory='16GB', gpu__model='A100-40GB', resources__VGPU='1'))
        self.assertIn(ranking.items[0].gpus, [(1,), (3,)])
        self.assertEqual('A100-20C', ranking.items[0].request.profile)
        self.assertNotIn((2,), [i.gpus for i in ranking.items])

    def test_sets_the_engine_did_not_list_are_scored(self):
        entry = self.add_host('h1', 'H100-80GB', count=8, per_numa=4,
                              vgpu_type='H100-10C')
        four = spec(gpu__profile='H100-10C', gpu__count='4',
                    **{'resources%d__VGPU' % i: '1' for i in range(1, 5)})
        ranking = self.view.ranking(entry, four)
        local = self.view.evaluate(entry, four, ranking, (0, 1, 2, 3))
        spread = self.view.evaluate(entry, four, ranking, (0, 1, 4, 5))
        self.assertLess(local.key, spread.key)
        self.assertLess(local.choice.topology, spread.choice.topology)
        self.assertIs(spread, self.view.evaluate(entry, four, ranking,
                                                 (0, 1, 4, 5)))

    def test_a_set_naming_one_gpu_twice_is_refused(self):
        # Two VFs of GPU 0 map to (0, 0): one GPU, not two.
        entry = self.add_host('h1', 'A100-40GB', vgpu_type='A100-10C')
        two = spec(gpu__profile='A100-10C', gpu__count='2',
                   resources1__VGPU='1', resources2__VGPU='1',
                   group_policy='isolate')
        ranking = self.view.ranking(entry, two)
        self.assertIsNone(self.view.evaluate(entry, two, ranking, (0, 0)))
        self.assertIsNotNone(self.view.evaluate(entry, two, ranking,
                                                (0, 1)))

    def test_costs_equal_but_for_float_noise_tie(self):
        from nova_gpu.scheduler import ranking as ranking_mod
        entry = self.add_host('h1', 'A100-40GB', vgpu_type='A100-10C')
        first = self.view.ranking(entry, STOCK).items[0]
        noisy = first.choice._replace(cost=first.choice.cost + 2e-16)
        self.assertEqual(
            first.key[:2],
            ranking_mod.sort_key(STOCK, first.request, noisy,
                                 first.free_milli, first.gpus)[:2])

    def test_memoised_until_the_host_changes(self):
        entry = self.add_host('h1', 'A100-40GB', vgpu_type='A100-10C')
        first = self.view.ranking(entry, STOCK)
        self.assertIs(first, self.view.ranking(entry, STOCK))
        self.view.claim(entry, first.items[0].choice.placement)
        second = self.view.ranking(entry, STOCK)
        self.assertIsNot(first, second)
        self.assertEqual(first.items[0].gpus, second.items[0].gpus)

    def test_pending_claims_expire_and_reports_supersede(self):
        entry = self.add_host('h1', 'A100-40GB', count=1,
                              vgpu_type='A100-10C', used={0: 3})
        item = self.view.ranking(entry, STOCK).items[0]
        self.view.claim(entry, item.choice.placement)
        self.assertEqual((), self.view.ranking(entry, STOCK).items)
        self.now += self.conf.gpu_scheduler.pending_claim_ttl + 1
        self.assertEqual(1, len(self.view.ranking(entry, STOCK).items))
        self.view.claim(entry, item.choice.placement)
        entry = self.view.ingest(base.gpu_report(
            'h1', 'A100-40GB', count=1, vgpu_type='A100-10C', used={0: 3},
            generation=2))
        self.assertEqual(1, len(self.view.ranking(entry, STOCK).items))
        # Provider UUIDs survive a new report.
        self.assertEqual({'h1-rp0': 0}, entry.uuids)

    def test_report_resent_keeps_the_claims_counted_since(self):
        # The agent's outbox resends a report whose acknowledgement was
        # lost: the same generation of the same run says nothing new, so
        # the claims counted since it came stay (core.report.replaces).
        report = base.gpu_report('h1', 'A100-40GB', count=1,
                                 vgpu_type='A100-10C', used={0: 3})
        report['boot_id'] = 'run-1'
        entry = self.view.ingest(report)
        item = self.view.ranking(entry, STOCK).items[0]
        self.view.claim(entry, item.choice.placement)
        self.assertIs(entry, self.view.ingest(dict(report)))
        self.assertEqual((), self.view.ranking(entry, STOCK).items)
        # Without boot_id alike.
        del report['boot_id']
        entry = self.view.ingest(dict(report, generation=2))
        self.view.claim(entry, item.choice.placement)
        self.assertIs(entry, self.view.ingest(dict(report, generation=2)))
        self.assertEqual((), self.view.ranking(entry, STOCK).items)

    def test_older_report_is_ignored(self):
        self.add_host('h1', 'A100-40GB', generation=5)
        entry = self.view.ingest(base.gpu_report('h1', 'A100-40GB',
                                                 generation=4))
        self.assertEqual(5, entry.generation)

    def test_resolver_runs_at_ingestion(self):
        calls = []

        def resolver(nodename, names):
            calls.append(nodename)
            return {n: 'uuid-' + n for n in names}
        self.view.resolver = resolver
        entry = self.view.ingest(base.gpu_report('h9', 'L4', count=2))
        self.assertEqual(['h9'], calls)
        self.assertEqual({'uuid-' + base.provider('h9', 0): 0,
                          'uuid-' + base.provider('h9', 1): 1}, entry.uuids)
        # A newer report of the same providers needs no Placement call.
        entry = self.view.ingest(base.gpu_report('h9', 'L4', count=2,
                                                 generation=2))
        self.assertEqual(['h9'], calls)
        self.assertEqual(2, len(entry.uuids))

    def test_listener_endpoint_feeds_the_view(self):
        endpoint = listener.ReportEndpoint(self.view)
        endpoint.info({}, 'nova-gpu-agent.h2', report_mod.EVENT_TYPE,
                      base.gpu_report('h2', 'T4', count=2), {})
        self.assertEqual(2, len(self.view.get('h2').host.gpus))
        # A bad report is dropped with a log line, not raised.
        endpoint.info({}, 'x', report_mod.EVENT_TYPE, {'version': 99}, {})
        self.assertIsNone(self.view.get('x'))

    def test_listener_and_agent_agree_on_the_event_type(self):
        from nova_gpu.agent import publisher
        # One contract, in the core: neither side spells it again.
        self.assertFalse(hasattr(publisher, 'EVENT_TYPE'))
        self.assertFalse(hasattr(listener, 'EVENT_TYPE'))
        rule = listener.ReportEndpoint.filter_rule
        self.assertTrue(rule.match({}, 'nova-gpu-agent.h1',
                                   report_mod.EVENT_TYPE, {}, {}))
        self.assertFalse(rule.match({}, 'nova-compute.h1',
                                    'compute.instance.create.end', {}, {}))

    def test_every_report_topic_defaults_to_the_contract(self):
        from nova_gpu import conf  # noqa: F401 - registers the options
        groups = [g for g in ('gpu_scheduler', 'gpu_agent', 'gpu_exporter')
                  if g in self.conf and 'report_topic' in self.conf[g]]
        self.assertIn('gpu_scheduler', groups)
        self.assertIn('gpu_agent', groups)
        for group in groups:
            opt = self.conf._get_opt_info('report_topic', group)['opt']
            self.assertEqual(report_mod.TOPIC, opt.default, group)

    def test_demand_follows_requests(self):
        before = self.view.demand_version
        self.view.note_request(STOCK)
        self.assertEqual(before + 1, self.view.demand_version)
        # Between refreshes the demand (and every memoised ranking) stays.
        self.view.note_request(spec(gpu__profile='A100-10C',
                                    resources__VGPU='1'))
        self.assertEqual(before + 1, self.view.demand_version)
        self.now += self.conf.gpu_scheduler.demand_refresh_interval
        self.view.note_request(STOCK)
        self.assertEqual(before + 2, self.view.demand_version)
        self.assertEqual(3, sum(self.view.demand.counts.values()))


YEAR_MS = 365 * 24 * 3600 * 1000


class ReportSafetyTest(base.TestCase):
    """Issue 10 item 2: no report can break the view or another host."""

    def setUp(self):
        super().setUp()
        self.log = self.useFixture(fixtures.FakeLogger(level=logging.DEBUG))
        self.endpoint = listener.ReportEndpoint(self.view)

    def send(self, payload, publisher='nova-gpu-agent.h1'):
        return self.endpoint.info({}, publisher, report_mod.EVENT_TYPE,
                                  payload, {})

    def test_endpoint_never_raises_and_names_the_problem(self):
        self.add_host('ok', 'A100-40GB', vgpu_type='A100-10C')
        before = self.view.get('ok')
        good = base.gpu_report('h1', 'A100-40GB', vgpu_type='A100-10C')
        bad = []
        for key, value in [('pcie_switch', {}), ('numa_node', [0]),
                           ('nvlink_peers', 'x'), ('devices', 'whole'),
                           ('vgpu_types', 5), ('index', None)]:
            report = base.gpu_report('h1', 'A100-40GB')
            report['gpus'][0][key] = value
            bad.append(report)
        bad += [None, [], 'junk', {'version': 2, 'host': 'h1'},
                dict(good, gpus=[None]), dict(good, numa_cells=[1]),
                dict(good, generation=float('inf'))]
        for payload in bad:
            self.assertEqual(listener.messaging.NotificationResult.HANDLED,
                             self.send(payload))
        self.assertIsNone(self.view.get('h1'))
        self.assertIs(before, self.view.get('ok'))
        self.assertIn('Dropping GPU report from nova-gpu-agent.h1 (host '
                      "h1): GPU report from 'h1': gpus[0].pcie_switch",
                      self.log.output)
        self.assertIn('gpus[0].numa_node', self.log.output)
        # WARNING, not DEBUG: an operator sees it.
        warnings = [r for r in self.log.output.splitlines()
                    if 'Dropping GPU report' in r]
        self.assertEqual(len(bad), len(warnings))

    def test_dropped_report_is_logged_at_warning(self):
        log = self.useFixture(fixtures.FakeLogger(level=logging.WARNING))
        self.send({'version': 99})
        self.assertIn('Dropping GPU report', log.output)

    def test_bad_report_keeps_the_previous_one(self):
        entry = self.add_host('h1', 'A100-40GB', vgpu_type='A100-10C',
                              generation=5)
        report = base.gpu_report('h1', 'A100-40GB', generation=6)
        report['gpus'][1]['pcie_switch'] = {}
        self.send(report)
        self.assertIs(entry, self.view.get('h1'))
        # Still ranks.
        self.assertTrue(self.view.ranking(entry, STOCK).items)

    def test_future_generation_cannot_freeze_a_host(self):
        # The agent's generation is ms since the epoch: a clock one year
        # ahead, then set right.
        now_ms = 1764547200000
        self.add_host('h1', 'A100-40GB', generation=now_ms + YEAR_MS)
        self.now += 10
        entry = self.view.ingest(base.gpu_report('h1', 'A100-40GB',
                                                 generation=now_ms))
        self.assertEqual(now_ms + YEAR_MS, entry.generation)  # reordered?
        self.now += self.conf.gpu_scheduler.generation_reset_after
        entry = self.view.ingest(base.gpu_report('h1', 'A100-40GB',
                                                 generation=now_ms + 1))
        self.assertEqual(now_ms + 1, entry.generation)
        self.assertIn('generation_reset_after', self.log.output)
        # And it counts up from there again.
        entry = self.view.ingest(base.gpu_report('h1', 'A100-40GB',
                                                 generation=now_ms))
        self.assertEqual(now_ms + 1, entry.generation)

    def test_new_agent_run_resets_the_generation_at_once(self):
        report = base.gpu_report('h1', 'L4', count=2, generation=10 ** 12)
        report['boot_id'] = 'run-1'
        self.view.ingest(report)
        report = base.gpu_report('h1', 'L4', count=2, generation=3)
        report['boot_id'] = 'run-2'
        self.assertEqual(3, self.view.ingest(report).generation)
        self.assertIn('new agent run', self.log.output)
        # Same run, older generation: an out-of-order delivery.
        report = base.gpu_report('h1', 'L4', count=2, generation=2)
        report['boot_id'] = 'run-2'
        self.assertEqual(3, self.view.ingest(report).generation)

    def test_non_finite_or_absurd_generations_refused(self):
        for generation in (float('inf'), float('nan'), 2 ** 53, -1, 1.0,
                           '5', True, None):
            report = base.gpu_report('h1', 'L4', count=1)
            report['generation'] = generation
            err = self.assertRaises(report_mod.ReportError, self.view.ingest,
                                    report)
            self.assertEqual('generation', err.field)
            self.assertIn("'h1'", str(err))

    def test_fuzzed_reports_small(self):
        """The reliability figure, small: every target met."""
        rows = reliability_reports.run(reports=300)
        failed = [(r.name, r.value, r.target) for r in rows if not r.ok]
        self.assertEqual([], failed)
        by_name = {r.name: r.value for r in rows}
        self.assertEqual(300, by_name['fuzzed reports (v1 and v2 '
                                      'mutations)'])
        self.assertGreater(by_name['accepted as valid after mutation'], 0)


class ProvidersTest(base.TestCase):
    """Issue 9 item 1: the view maps every provider of a GPU."""

    def report(self):
        catalog = base.CATALOG
        model = catalog.model('A100-40GB')
        from nova_gpu.core import fixtures as core_fixtures
        host = core_fixtures.hgx_host('h1', model, gpus=4, mig=False)
        host.gpus[3].mig_enabled = True
        rc = report_mod.pci_default_resource_class('10de', '20b0')
        providers = {
            0: [report_mod.provider_dict(
                report_mod.mdev_provider_name('h1', '0000:18:00.0'),
                report_mod.PF_MDEV, '0000:18:00.0')],
            1: [report_mod.provider_dict(
                report_mod.mdev_provider_name('h1', '0000:38:00.%d' % f),
                report_mod.VF_MDEV, '0000:38:00.%d' % f,
                vgpu_type='A100-10C') for f in (4, 5)],
            2: [report_mod.provider_dict(
                report_mod.pci_provider_name('h1', '0000:58:00.0'),
                report_mod.PCI_POOL, '0000:58:00.0', rc, 'A100-10C',
                vfs=['0000:58:00.4', '0000:58:00.5'])],
            3: [report_mod.provider_dict(
                report_mod.mdev_provider_name('h1', '0000:78:00.4'),
                report_mod.VF_MDEV, '0000:78:00.4', vgpu_type='A100-3-20C',
                mig=('3g.20gb', 4))],
        }
        return report_mod.host_to_dict(host, 'h1', 1, providers)

    def test_every_provider_maps_to_its_gpu(self):
        entry = self.view.ingest(self.report())
        self.assertEqual({'h1_pci_0000_18_00_0': 0,
                          'h1_pci_0000_38_00_4': 1,
                          'h1_pci_0000_38_00_5': 1,
                          'h1_0000:58:00.0': 2,
                          'h1_pci_0000_78_00_4': 3}, entry.providers)
        self.assertEqual({'VGPU', 'CUSTOM_PCI_10DE_20B0'}, entry.gpu_classes)
        self.view.set_provider_uuids('h1', {
            name: 'uuid-%s' % name for name in entry.providers})
        self.assertEqual(('3g.20gb', 4),
                         entry.mig_slot('uuid-h1_pci_0000_78_00_4'))
        self.assertIsNone(entry.mig_slot('uuid-h1_0000:58:00.0'))

    def test_one_device_providers_known(self):
        entry = self.view.ingest(self.report())
        self.view.set_provider_uuids('h1', {
            name: 'uuid-%s' % name for name in entry.providers})
        # VFs with their one mdev; not the PF's or the PCI pool's.
        self.assertEqual({'uuid-h1_pci_0000_38_00_4',
                          'uuid-h1_pci_0000_38_00_5',
                          'uuid-h1_pci_0000_78_00_4'}, entry.unit_uuids)
        self.assertEqual({'uuid-h1_pci_0000_38_00_5'}, entry.claimed(
            {'allocations': {'uuid-h1_pci_0000_38_00_5': {}, 'root': {}}}))
        self.assertEqual(set(), entry.claimed(
            {'allocations': {'uuid-h1_pci_0000_18_00_0': {}}}))

    def test_resolver_asked_for_every_provider(self):
        asked = []

        def resolver(nodename, names):
            asked.extend(names)
            return {n: 'uuid-' + n for n in names}
        self.view.resolver = resolver
        entry = self.view.ingest(self.report())
        self.assertEqual(sorted(entry.providers), sorted(asked))
        self.assertEqual(5, len(entry.uuids))
