from nova_gpu.scheduler import flavor
from nova_gpu.scheduler import listener
from tests.unit.scheduler import base


def spec(**specs):
    return flavor.parse({k.replace('__', ':'): v for k, v in specs.items()},
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
        endpoint.info({}, 'nova-gpu-agent.h2', listener.EVENT_TYPE,
                      base.gpu_report('h2', 'T4', count=2), {})
        self.assertEqual(2, len(self.view.get('h2').host.gpus))
        # A bad report is dropped with a log line, not raised.
        endpoint.info({}, 'x', listener.EVENT_TYPE, {'version': 99}, {})
        self.assertIsNone(self.view.get('x'))

    def test_listener_and_agent_agree_on_the_event_type(self):
        from nova_gpu.agent import publisher
        self.assertEqual(publisher.EVENT_TYPE, listener.EVENT_TYPE)
        rule = listener.ReportEndpoint.filter_rule
        self.assertTrue(rule.match({}, 'nova-gpu-agent.h1',
                                   publisher.EVENT_TYPE, {}, {}))
        self.assertFalse(rule.match({}, 'nova-compute.h1',
                                    'compute.instance.create.end', {}, {}))

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
        self.assertEqual(3, sum(self.view._counts.values()))
