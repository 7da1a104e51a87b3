"""Spot GPU servers in a real Nova: an on-demand refusal evicts spot.

One host with two whole T4 GPUs (passthrough, PCI in Placement). An
on-demand server takes one GPU, a spot server (``gpu:preemptible=true``)
the other; a second on-demand server is refused (NoValidHost). Nova's own
versioned ``compute_task.build_instances.error`` is handed to the
reclaimer, which plans from the agent's report and Nova's servers and
Placement allocations, tells the spot server's owner and shelve-offloads
it through Nova's API; the on-demand server booted again goes ACTIVE on
the freed GPU, and the first on-demand server is untouched.

The reclaimer's compute client here is Nova's in-process API client (the
harness has no Keystone endpoint openstacksdk could reach); everything
else is the service's own code (``ReclaimService.handle_refusal``).
"""

from nova.tests.functional.api import client
from oslo_config import cfg

from nova_gpu.reclaim import compute as compute_mod
from nova_gpu.reclaim import events
from nova_gpu.reclaim import executor
from nova_gpu.reclaim import notices as notification
from nova_gpu.reclaim import planner_view as inventory
from nova_gpu.reclaim import service as service_mod
from nova_gpu.tests.harness import cloud

CONF = cfg.CONF
MICROVERSION = '2.96'  # servers show their flavor's extra specs (2.47+)


class HarnessCompute:
    """``compute.SdkCompute``'s methods over the harness's admin API."""

    def __init__(self, case):
        self.case = case
        self.api = case.admin_api

    def _get(self, call, *args, **kw):
        old = self.api.microversion
        self.api.microversion = MICROVERSION
        try:
            return call(*args, **kw)
        finally:
            self.api.microversion = old

    def _name_of(self, rp_uuid):
        return self.case.placement.get(
            '/resource_providers/%s' % rp_uuid).body['name']

    def _info(self, s):
        flavor = s.get('flavor') or {}
        specs = dict(flavor.get('extra_specs') or {})
        providers = {}
        if compute_mod.asks_gpu(specs):
            providers = compute_mod.gpu_providers(
                self.case._get_allocations_by_server_uuid(s['id']),
                self._name_of)
        return inventory.ServerInfo(
            s['id'], s['name'], s.get('OS-EXT-SRV-ATTR:host'), s['status'],
            s.get('tenant_id'), s.get('user_id'), specs, providers)

    def servers(self):
        return [self._info(s) for s in self._get(
            self.api.get_servers, detail=True,
            search_opts={'all_tenants': 1})]

    def server(self, server_id):
        try:
            return self._info(self._get(self.api.get_server, server_id))
        except client.OpenStackApiNotFoundException:
            return None

    def set_metadata(self, server_id, metadata):
        self.api.post_server_metadata(server_id, metadata)

    def shelve(self, server_id):
        self.api.post_server_action(server_id, {'shelve': None})

    def shelve_offload(self, server_id):
        self.api.post_server_action(server_id, {'shelveOffload': None})

    def delete(self, server_id):
        self.api.delete_server(server_id)


class Sent:
    def __init__(self):
        self.sent = []

    def info(self, ctxt, event_type, payload):
        self.sent.append((event_type, payload['nova_object.data']))


class SpotReclaimTest(cloud.GpuCloudTestCase):

    HOSTS = (cloud.GpuHost('t4', 'T4', gpus=2, path=cloud.PASSTHROUGH),)

    def host_and_gpus(self, server):
        return (self.admin_api.get_server(server['id'])[
            'OS-EXT-SRV-ATTR:host'], self.gpus_of(server))

    def test_refused_on_demand_server_evicts_the_spot_server(self):
        self.flags(grace_period=0, eviction_timeout=30,
                   group='gpu_reclaimer')
        on_demand = self.create_gpu_flavor(
            {'gpu:kind': 'whole', 'gpu:model': 'T4'})
        spot = self.create_gpu_flavor(
            {'gpu:kind': 'whole', 'gpu:model': 'T4',
             'gpu:preemptible': 'true'})
        # The API knows the key: a value that only looks true is refused.
        err = self.assertRaises(
            client.OpenStackApiException, self.api.post_extra_spec,
            on_demand, {'extra_specs': {'gpu:preemptible': 'yes'}})
        self.assertEqual(400, err.response.status_code)
        self.assertIn('gpu:preemptible=yes', str(err))
        first = self.boot(on_demand)
        where_first = self.host_and_gpus(first)
        victim = self.boot(spot)
        refused = self.boot(on_demand, expected_state='ERROR')
        self.assertIn('No valid host', refused['fault']['message'])

        # Nova's own notification of the refusal.
        errors = self.notifier.wait_for_versioned_notifications(
            events.BUILD_ERROR)
        (payload,) = [n['payload'] for n in errors
                      if n['payload']['nova_object.data']['instance_uuid']
                      == refused['id']]

        sent = Sent()
        reclaimer = service_mod.ReclaimService(
            CONF, HarnessCompute(self),
            notifier=notification.Notifier(sent))
        reclaimer.executor.poll_s = 0.2
        reclaimer.store.ingest(self.gpu_report('t4'))
        outcome = reclaimer.handle_refusal(events.refused_request(payload))

        self.assertIsNotNone(outcome, 'the reclaimer did nothing')
        self.assertTrue(outcome.ok, outcome.failed)
        self.assertEqual([victim['id']], outcome.evicted)
        evicted = self.admin_api.get_server(victim['id'])
        self.assertEqual('SHELVED_OFFLOADED', evicted['status'])
        self.assertIn('shelve_offload at',
                      evicted['metadata'][executor.METADATA_KEY])
        self.assertEqual({}, self._get_allocations_by_server_uuid(
            victim['id']))
        self.assertEqual(
            [(notification.NOTICE_EVENT, victim['id']),
             (notification.EVICTED_EVENT, victim['id']),
             (notification.ROOM_EVENT, refused['id'])],
            [(e, p['instance_uuid']) for e, p in sent.sent])

        # The owner boots the on-demand server again: it fits now.
        self.sync_gpu_reports()
        served = self.boot(on_demand)
        self.assertEqual('ACTIVE', served['status'])
        # The on-demand server already running was never touched.
        untouched = self.admin_api.get_server(first['id'])
        self.assertEqual('ACTIVE', untouched['status'])
        self.assertNotIn(executor.METADATA_KEY, untouched['metadata'])
        self.assertEqual(where_first, self.host_and_gpus(first))
        self.assertNotEqual(where_first, self.host_and_gpus(served))
