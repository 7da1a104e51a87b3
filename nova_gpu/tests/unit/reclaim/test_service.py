"""nova-gpu-reclaimer's service logic, on a fake compute API."""

import threading
import time

import fixtures
from oslo_config import cfg
from oslo_config import fixture as config_fixture
import testtools

from nova_gpu import conf  # noqa: F401  (registers [gpu_reclaimer])
from nova_gpu.core import flavor as core_flavor
from nova_gpu.core import report as report_mod
from nova_gpu.reclaim import events
from nova_gpu.reclaim import executor
from nova_gpu.reclaim import grammar
from nova_gpu.reclaim import listener
from nova_gpu.reclaim import notices as notification
from nova_gpu.reclaim import planner_view as inventory
from nova_gpu.reclaim import service as service_mod
from nova_gpu.scheduler import gpu_spec
from nova_gpu.tests.unit.reclaim import fakes

CONF = cfg.CONF


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


class ServiceTestBase(testtools.TestCase):

    def setUp(self):
        super().setUp()
        self.conf = self.useFixture(config_fixture.Config(CONF))
        # The room is told at once unless a test says otherwise.
        self.conf.config(grace_period=0, room_report_timeout=0,
                         group='gpu_reclaimer')
        self.clock = Clock()
        # h0: GPU 0 on-demand "od0", GPU 1 spot "spot0";
        # h1: GPU 0 spot "spot1", GPU 1 on-demand "od1".
        self.compute = fakes.FakeCompute([
            fakes.server('od0', 'h0', 0, fakes.ON_DEMAND),
            fakes.server('spot0', 'h0', 1, fakes.SPOT),
            fakes.server('spot1', 'h1', 0, fakes.SPOT),
            fakes.server('od1', 'h1', 1, fakes.ON_DEMAND),
        ], flavors={'big': fakes.ON_DEMAND})
        self.sent = fakes.Sent()

    def service(self, **opts):
        if opts:
            self.conf.config(group='gpu_reclaimer', **opts)
        svc = service_mod.ReclaimService(
            CONF, self.compute, catalog=fakes.CATALOG,
            notifier=notification.Notifier(self.sent), clock=self.clock)
        svc.executor.poll_s = 0
        svc.store.ingest(fakes.report('h0', used=(0, 1)))
        svc.store.ingest(fakes.report('h1', used=(0, 1)))
        return svc

    def refused(self, specs=fakes.ON_DEMAND, instance='new'):
        return events.refused_request(fakes.build_error(instance, specs))


class RefusalTest(ServiceTestBase):

    def test_evicts_one_spot_server_after_notice(self):
        outcome = self.service().handle_refusal(self.refused())
        self.assertTrue(outcome.ok, outcome.failed)
        (victim,) = outcome.evicted
        self.assertIn(victim, ('spot0', 'spot1'))
        self.assertEqual([('shelve', victim), ('shelve_offload', victim)],
                         self.compute.actions())
        (meta,) = [c for c in self.compute.calls if c[0] == 'metadata']
        self.assertEqual(victim, meta[1])
        self.assertIn('shelve_offload at 1970-01-01T00:16:40Z',
                      meta[2][executor.METADATA_KEY])
        self.assertEqual([(notification.NOTICE_EVENT, victim),
                          (notification.EVICTED_EVENT, victim),
                          (notification.ROOM_EVENT, 'new')],
                         self.sent.events())
        room = self.sent.sent[-1][1]
        self.assertEqual('GpuReclaimRoomPayload', room['nova_object.name'])
        self.assertEqual([victim], room['nova_object.data']['evicted'])
        self.assertEqual('p2', room['nova_object.data']['project_id'])
        for od in ('od0', 'od1'):
            self.assertEqual('ACTIVE', self.compute.server(od).status)

    def test_room_told_after_the_hosts_next_report(self):
        # The schedulers place on the agents' reports: the owner of the
        # refused instance is told to boot again once the host's agent
        # reported the eviction, not before (seen in devstack: a boot
        # right after the eviction was refused again).
        svc = self.service(action='delete', room_report_timeout=30)
        events_at_report = []

        def agent_reports():
            time.sleep(0.3)
            events_at_report.extend(self.sent.events())
            for host in ('h0', 'h1'):
                svc.store.ingest(fakes.report(host, used=(0,),
                                              generation=2))

        reporter = threading.Thread(target=agent_reports)
        reporter.start()
        start = time.monotonic()
        outcome = svc.handle_refusal(self.refused())
        reporter.join()
        self.assertTrue(outcome.ok, outcome.failed)
        self.assertLess(time.monotonic() - start, 10)
        # Evicted before the report, the room told after it.
        self.assertNotIn(notification.ROOM_EVENT,
                         [e for e, _ in events_at_report])
        self.assertEqual(notification.ROOM_EVENT, self.sent.events()[-1][0])

    def test_room_told_anyway_without_a_report(self):
        svc = self.service(action='delete', room_report_timeout=1)
        logged = self.useFixture(fixtures.FakeLogger(
            name='nova_gpu.reclaim.service'))
        start = time.monotonic()
        outcome = svc.handle_refusal(self.refused())
        self.assertTrue(outcome.ok, outcome.failed)
        self.assertGreaterEqual(time.monotonic() - start, 1)
        self.assertEqual(notification.ROOM_EVENT, self.sent.events()[-1][0])
        self.assertIn('No GPU report of', logged.output)

    def test_a_report_lagging_placement_frees_no_gpu_for_free(self):
        # h0's report predates spot0's boot (GPU 1 looks free), as right
        # after boots (the agent reports after the device change): the
        # refusal must still evict a spot server, not plan on GPU 1 as
        # free and evict none (found in devstack).
        svc = self.service()
        svc.store.ingest(fakes.report('h0', used=(0,), generation=2))
        outcome = svc.handle_refusal(self.refused())
        self.assertTrue(outcome.ok, outcome.failed)
        (victim,) = outcome.evicted
        self.assertIn(victim, ('spot0', 'spot1'))
        inv = svc.inventory()
        self.assertNotIn('spot0', inv.skipped)

    def test_delete_action(self):
        outcome = self.service(action='delete').handle_refusal(
            self.refused())
        (victim,) = outcome.evicted
        self.assertEqual([('delete', victim)], self.compute.actions())
        self.assertIsNone(self.compute.server(victim))

    def test_grace_period_waits_between_notice_and_eviction(self):
        svc = self.service(grace_period=120)
        waits = []

        def wait(seconds):
            waits.append(seconds)
            self.clock.now += seconds
            return False
        svc.executor.stop.wait = wait
        outcome = svc.handle_refusal(self.refused())
        self.assertTrue(outcome.ok)
        self.assertIn(120.0, waits)
        meta = [c for c in self.compute.calls if c[0] == 'metadata'][0]
        self.assertIn('at 1970-01-01T00:18:40Z',
                      meta[2][executor.METADATA_KEY])

    def test_spot_request_evicts_nobody(self):
        self.assertIsNone(self.service().handle_refusal(
            self.refused(fakes.SPOT)))
        self.assertEqual([], self.compute.calls)

    def test_request_without_gpu_evicts_nobody(self):
        self.assertIsNone(self.service().handle_refusal(
            self.refused({'hw:cpu_policy': 'dedicated'})))
        self.assertEqual([], self.compute.calls)

    def test_on_demand_servers_are_never_evicted(self):
        for sid in ('spot0', 'spot1'):
            self.compute._set(sid, extra_specs=dict(fakes.ON_DEMAND))
        self.assertIsNone(self.service().handle_refusal(self.refused()))
        self.assertEqual([], self.compute.calls)
        self.assertEqual([], self.sent.sent)

    def test_bad_preemptible_value_counts_as_on_demand(self):
        for sid in ('spot0', 'spot1'):
            self.compute._set(sid, extra_specs=dict(
                fakes.ON_DEMAND, **{'gpu:preemptible': 'True'}))
        self.assertIsNone(self.service().handle_refusal(self.refused()))
        self.assertEqual([], self.compute.calls)

    def test_server_no_longer_spot_at_eviction_is_kept(self):
        # Resized to an on-demand flavor between the plan and the notice.
        svc = self.service()
        svc.inventory()  # warm
        original = self.compute.server

        def server(sid):
            found = original(sid)
            if found is not None and sid.startswith('spot'):
                found = found.__class__(**dict(
                    found.__dict__, extra_specs=dict(fakes.ON_DEMAND)))
            return found
        self.compute.server = server
        outcome = svc.handle_refusal(self.refused())
        self.assertFalse(outcome.ok)
        self.assertIn('not of a preemptible flavor now', outcome.failed)
        self.assertEqual([], self.compute.calls)
        self.assertNotIn(notification.ROOM_EVENT,
                         [e for e, _i in self.sent.events()])

    def test_resized_during_grace_is_kept(self):
        svc = self.service()

        def resized(sid):
            self.compute._set(sid, extra_specs=dict(fakes.ON_DEMAND))
        self.compute.on_metadata = resized
        outcome = svc.handle_refusal(self.refused())
        self.assertFalse(outcome.ok)
        self.assertEqual([], self.compute.actions())

    def test_dry_run_changes_nothing(self):
        self.assertIsNone(self.service(dry_run=True).handle_refusal(
            self.refused()))
        self.assertEqual([], self.compute.calls)
        self.assertEqual([], self.sent.sent)

    def test_stale_reports_are_not_planned_with(self):
        svc = self.service(stale_after=60)
        self.clock.now += 61
        self.assertIsNone(svc.handle_refusal(self.refused()))
        self.assertEqual([], self.compute.calls)

    def test_eviction_that_never_frees_the_gpu_fails(self):
        svc = self.service(eviction_timeout=1)
        self.compute.shelve_offload = lambda sid: None  # stays SHELVED
        outcome = svc.handle_refusal(self.refused())
        self.assertFalse(outcome.ok)
        self.assertIn('was not offloaded within 1 s', outcome.failed)
        self.assertEqual([], outcome.evicted)


class HeadroomTest(ServiceTestBase):

    def test_floor_met_does_nothing(self):
        self.assertIsNone(self.service().check_headroom())  # floor 0: off
        self.compute._set('spot0', providers={})
        svc = self.service(headroom_floor=1, headroom_flavor='big')
        svc.store.ingest(fakes.report('h0', used=(0,), generation=2))
        self.assertIsNone(svc.check_headroom())
        self.assertEqual([], self.compute.calls)

    def test_below_floor_evicts_spot_servers(self):
        outcome = self.service(headroom_floor=2,
                               headroom_flavor='big').check_headroom()
        self.assertTrue(outcome.ok)
        self.assertEqual(['spot0', 'spot1'], sorted(outcome.evicted))
        self.assertEqual('ACTIVE', self.compute.server('od0').status)

    def test_unreachable_floor_evicts_nobody(self):
        self.assertIsNone(self.service(
            headroom_floor=3, headroom_flavor='big').check_headroom())
        self.assertEqual([], self.compute.calls)


class InventoryTest(testtools.TestCase):

    def test_servers_on_the_reported_gpus(self):
        inv = inventory.build(
            {'h0': fakes.report('h0', used=(0, 1))},
            [fakes.server('a', 'h0', 0, fakes.ON_DEMAND),
             fakes.server('b', 'h0', 1, fakes.SPOT),
             fakes.server('c', 'h0', 1, fakes.SPOT, status='SHELVED'),
             fakes.server('d', 'h9', 0, fakes.SPOT),
             inventory.ServerInfo('e')],
            fakes.CATALOG, grammar.is_spot)
        self.assertEqual({'a': False, 'b': True},
                         {s.id: s.spot for s in inv.servers})
        self.assertEqual((1,), inv.servers[1].placement.gpus)
        # c: GPU 1 holds one vGPU, already b's; d: no report of h9.
        self.assertIn('report disagrees', inv.skipped['c'])
        self.assertIn('in no fresh GPU report', inv.skipped['d'])
        self.assertNotIn('e', inv.skipped)

    def test_store_keeps_the_newest_report(self):
        clock = Clock()
        store = inventory.ReportStore(fakes.CATALOG, 100, clock)
        self.assertTrue(store.ingest(fakes.report('h0', (0,), 2)))
        self.assertFalse(store.ingest(fakes.report('h0', (), 1)))
        self.assertEqual([{'kind': 'vgpu', 'detail': 'T4-16C'}],
                         store.fresh(50)['h0']['gpus'][0]['devices'])
        clock.now += 101
        self.assertEqual({}, store.fresh(100))
        self.assertTrue(store.ingest(fakes.report('h0', (), 1)))
        self.assertRaises(report_mod.ReportError, store.ingest,
                          {'version': 2})

    def test_store_keeps_reports_by_the_core_rule(self):
        # core.report.replaces, as the schedulers apply it.
        clock = Clock()
        store = inventory.ReportStore(fakes.CATALOG, 100, clock)

        def report(generation, boot_id, used=()):
            data = fakes.report('h0', used, generation)
            if boot_id is not None:
                data['boot_id'] = boot_id
            return data
        self.assertTrue(store.ingest(report(5, 'run-1', (0,))))
        # No boot_id (an older agent): no new agent run.
        self.assertFalse(store.ingest(report(4, None)))
        # The held report resent: not taken again, however late.
        clock.now += 101
        self.assertFalse(store.ingest(report(5, 'run-1', (0,))))
        self.assertEqual({}, store.fresh(100))
        # A restart counting from low is taken at once.
        self.assertTrue(store.ingest(report(1, 'run-2')))
        self.assertEqual('run-2', store.fresh(100)['h0']['boot_id'])


class EventsTest(testtools.TestCase):

    def test_no_valid_host(self):
        refused = events.refused_request(fakes.build_error(
            'i1', fakes.ON_DEMAND))
        self.assertEqual(('i1', 'p2', 'u2', 'gpu.small', 2, 2048),
                         (refused.instance_uuid, refused.project_id,
                          refused.user_id, refused.flavor_name,
                          refused.vcpus, refused.memory_mb))
        self.assertEqual(fakes.ON_DEMAND, refused.extra_specs)

    def test_no_valid_host_from_the_scheduler_service(self):
        # Where nova-scheduler is another process (every deployment), the
        # conductor's exception is oslo.messaging's remote class
        # (seen in devstack: "NoValidHost_Remote").
        refused = events.refused_request(fakes.build_error(
            'i1', fakes.ON_DEMAND, exception='NoValidHost_Remote'))
        self.assertEqual('i1', refused.instance_uuid)

    def test_other_failures_are_not_refusals(self):
        for exception in ('MaxRetriesExceeded', 'MaxRetriesExceeded_Remote',
                          'NoValidHostX', '_Remote'):
            self.assertIsNone(events.refused_request(fakes.build_error(
                'i1', fakes.ON_DEMAND, exception=exception)), exception)

    def test_malformed_payload_named(self):
        payload = fakes.build_error('i1', fakes.ON_DEMAND)
        flavor_data = payload['nova_object.data']['request_spec'][
            'nova_object.data']['flavor']['nova_object.data']
        flavor_data['vcpus'] = 'two'
        err = self.assertRaises(events.EventError, events.refused_request,
                                payload)
        self.assertIn('flavor.vcpus', str(err))
        self.assertRaises(events.EventError, events.refused_request, [])


class ListenerTest(testtools.TestCase):

    def test_reports_and_refusals_routed_bad_ones_dropped(self):
        store = inventory.ReportStore(fakes.CATALOG)
        got = []
        endpoint = listener.Endpoint(store, got.append)
        endpoint.info({}, 'nova-gpu-agent.h0', report_mod.EVENT_TYPE,
                      fakes.report('h0', (0,)), {})
        endpoint.error({}, 'nova-conductor', events.BUILD_ERROR,
                       fakes.build_error('i1', fakes.ON_DEMAND), {})
        endpoint.error({}, 'nova-conductor', events.BUILD_ERROR,
                       {'nova_object.data': 'junk'}, {})
        endpoint.info({}, 'x', report_mod.EVENT_TYPE, {'version': 99}, {})
        self.assertEqual(['h0'], list(store.fresh(1e9)))
        self.assertEqual(['i1'], [r.instance_uuid for r in got])


class GrammarTest(testtools.TestCase):

    def setUp(self):
        super().setUp()
        self.conf = self.useFixture(config_fixture.Config(CONF))
        self.names = core_flavor.PathNames.from_options(CONF.gpu_scheduler)

    def requests_of(self, specs, **kw):
        return grammar.requests_of(specs, fakes.CATALOG, self.names, **kw)

    def test_requests_of(self):
        (req,) = self.requests_of(fakes.ON_DEMAND)
        self.assertEqual('T4-16C', req.profile)
        self.assertEqual((), self.requests_of({'gpu:count': 'x'}))
        self.assertEqual((), self.requests_of({}))

    def test_read_as_the_scheduler_reads_them(self):
        # The core grammar, with the same [gpu_scheduler] names: the
        # scheduler's alternatives, in its order.
        self.conf.config(group='gpu_scheduler', vgpu_backend='vfio',
                         whole_gpu_alias='gpu-pt')
        self.names = core_flavor.PathNames.from_options(CONF.gpu_scheduler)
        for specs in (fakes.ON_DEMAND,
                      {'gpu:memory': '10GB', 'gpu:compute': '25%'},
                      {'gpu:kind': 'whole', 'gpu:count': '2'},
                      {'pci_passthrough:alias': 'gpu-pt:2'},
                      {'gpu:profile': 'A100-10C', 'hw:cpu_policy':
                       'dedicated'}):
            expected = gpu_spec.parse(specs, fakes.CATALOG, 4, 8192)
            self.assertEqual(expected.alternatives,
                             self.requests_of(specs, vcpus=4,
                                              memory_mb=8192), specs)
        (whole,) = self.requests_of({'pci_passthrough:alias': 'gpu-pt:2'})
        self.assertEqual(('whole', 2), (whole.kind, whole.count))

    def test_spot(self):
        self.assertTrue(grammar.is_spot(fakes.SPOT))
        self.assertFalse(grammar.is_spot(fakes.ON_DEMAND))
        self.assertFalse(grammar.is_spot(None))
        # A value that only looks true is on-demand: never evicted.
        self.assertFalse(grammar.is_spot({'gpu:preemptible': 'True'}))

    def test_service_reads_with_its_names(self):
        self.conf.config(group='gpu_scheduler', whole_gpu_alias='gpu-pt')
        svc = service_mod.ReclaimService(
            CONF, fakes.FakeCompute([]), catalog=fakes.CATALOG,
            notifier=notification.Notifier(fakes.Sent()))
        (req,) = svc.requests_of({'pci_passthrough:alias': 'gpu-pt:1'})
        self.assertEqual('whole', req.kind)
        self.assertEqual((), svc.requests_of(
            {'pci_passthrough:alias': 'nvidia-gpu:1'}))


class LifecycleTest(ServiceTestBase):

    def test_start_and_stop_leave_no_thread(self):
        import threading

        import oslo_messaging as messaging
        transport = messaging.get_notification_transport(CONF,
                                                         url='fake:/')
        self.addCleanup(transport.cleanup)
        before = set(threading.enumerate())
        svc = service_mod.ReclaimService(CONF, self.compute,
                                         transport=transport,
                                         catalog=fakes.CATALOG)
        svc.start()
        svc.submit(self.refused())
        svc.stop()
        self.assertEqual(set(), {t for t in threading.enumerate()
                                 if t not in before and t.is_alive()})

    def test_started_as_main_builds_it_sends_its_notices(self):
        # main() gives neither transport nor notifier: start() makes the
        # transport, and the notices must go out on it (they did not:
        # found in devstack, where no owner was told of the room).
        import oslo_messaging as messaging
        transport = messaging.get_notification_transport(CONF,
                                                         url='fake:/')
        self.addCleanup(transport.cleanup)
        self.useFixture(fixtures.MonkeyPatch(
            'nova_gpu.listening.transport', lambda _conf: transport))
        svc = service_mod.ReclaimService(CONF, self.compute,
                                         catalog=fakes.CATALOG,
                                         clock=self.clock)
        self.assertIsNone(svc.notifier)
        sent = []
        self.useFixture(fixtures.MonkeyPatch(
            'oslo_messaging.Notifier.info',
            lambda notifier, ctxt, event, payload: sent.append(event)))
        svc.start()
        try:
            svc.executor.poll_s = 0
            svc.store.ingest(fakes.report('h0', used=(0, 1)))
            svc.store.ingest(fakes.report('h1', used=(0, 1)))
            outcome = svc.handle_refusal(self.refused())
        finally:
            svc.stop()
        self.assertTrue(outcome.ok, outcome.failed)
        self.assertEqual([notification.NOTICE_EVENT,
                          notification.EVICTED_EVENT,
                          notification.ROOM_EVENT], sent)

    def test_headroom_floor_needs_the_flavor(self):
        self.assertIsNone(service_mod.conf_problem(CONF))
        self.conf.config(headroom_floor=1, group='gpu_reclaimer')
        self.assertIn('needs headroom_flavor',
                      service_mod.conf_problem(CONF))


class MigrationStepTest(ServiceTestBase):

    def test_live_migration_step(self):
        from nova_gpu.reclaim import reclaimer
        decision = reclaimer.ReclaimDecision('request', (), (
            reclaimer.Step(0.0, reclaimer.LIVE_MIGRATE, 'od0', 'h1'),))
        ex = self.service(eviction_timeout=1).executor
        outcome = ex.carry_out(decision)
        # The fake never moves it: the step fails, nothing else is done.
        self.assertFalse(outcome.ok)
        self.assertEqual([('live_migrate', 'od0', 'h1')],
                         self.compute.actions())
        self.compute.live_migrate = lambda sid, host: self.compute._set(
            sid, host=host)
        self.assertTrue(ex.carry_out(decision).ok)


class WorkerTest(ServiceTestBase):

    def test_worker_runs_refusals_and_the_periodic_check(self):
        import threading

        import oslo_messaging as messaging
        transport = messaging.get_notification_transport(CONF,
                                                         url='fake:/')
        self.addCleanup(transport.cleanup)
        svc = self.service(headroom_floor=2, headroom_flavor='big',
                           headroom_interval=1)
        svc._transport = transport
        done = threading.Event()
        calls = []
        svc.handle_refusal = lambda r: calls.append(('refusal', r))

        def headroom():
            calls.append(('headroom',))
            done.set()
        svc.check_headroom = headroom
        svc.start()
        try:
            svc.submit(self.refused())
            self.assertTrue(done.wait(10))
        finally:
            svc.stop()
        self.assertEqual('refusal', calls[0][0])
        self.assertIn(('headroom',), calls)
