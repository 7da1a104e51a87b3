"""Several nova-scheduler services: lost claims are scheduled again, and
equally good devices are spread.

Nova claims candidate 0 of the first weighed host and, when Placement
refuses it (another scheduler took that device since Placement offered
it), candidate 0 of the next host, then answers NoValidHost
(``SchedulerManager._schedule``). Here another scheduler's claim is
played right before Nova's own, on the very device Nova is about to
claim: with the plugin the request is scheduled again with fresh
candidates (``manager.GpuSchedulerManager``) and boots; with ``[gpu_scheduler]
claim_retries = 0`` (Nova's behaviour) it gets NoValidHost although the
host has room. A refusal (no room) is answered at once.
"""


import fixtures
from oslo_utils import uuidutils

from nova_gpu.tests.harness import cloud


class _LostClaims(cloud.GpuCloudTestCase):
    """A100s on SR-IOV + mdev: four VFs a GPU, one VGPU provider each."""

    def setUp(self):
        super().setUp()
        self.flavor = self.create_gpu_flavor({'gpu:profile': 'A100-10C'},
                                             memory_mb=512, vcpu=1)
        # No wait between attempts (it is random, at most 0.1 s at first).
        self.useFixture(fixtures.MonkeyPatch(
            'nova_gpu.scheduler.manager.RETRY_WAIT', 0.0))

    def take_before_claim(self, times, once_per_instance=False):
        """Play another scheduler's claim on the VF of each of Nova's
        next ``times`` claims (the first claim of each instance only, with
        ``once_per_instance``), just before it; returns the VFs taken.
        """
        from nova.scheduler import utils
        real = utils.claim_resources
        taken = []
        instances = set()

        def claim(ctx, client, spec_obj, instance_uuid, alloc_req,
                  *args, **kwargs):
            first = instance_uuid not in instances
            instances.add(instance_uuid)
            if len(taken) < times and (first or not once_per_instance):
                (rp,) = [rp for rp, a in alloc_req['allocations'].items()
                         if 'VGPU' in a['resources']]
                self.placement.put(
                    '/allocations/%s' % uuidutils.generate_uuid(),
                    {'allocations': {rp: {'resources': {'VGPU': 1}}},
                     'project_id': 'other', 'user_id': 'other'},
                    version='1.12')
                taken.append(rp)
            return real(ctx, client, spec_obj, instance_uuid, alloc_req,
                        *args, **kwargs)
        self.useFixture(fixtures.MonkeyPatch(
            'nova.scheduler.utils.claim_resources', claim))
        return taken

    def retries(self):
        return dict(self.scheduler.manager.claim_retries)


class LostClaimTest(_LostClaims):
    """One A100: four VFs."""

    HOSTS = (cloud.GpuHost('a100', 'A100-40GB', 'A100-10C', gpus=1),)

    def test_lost_claim_is_scheduled_again(self):
        taken = self.take_before_claim(1)
        server = self.boot(self.flavor)
        (provider,) = self.gpu_providers_of(server)
        (lost,) = taken
        self.assertNotEqual(lost, self._get_provider_uuid_by_name(provider))
        self.assertEqual({'retried': 1, 'gave_up': 0}, self.retries())

    def test_bounded_when_every_claim_is_lost(self):
        self.flags_for_every_service('gpu_scheduler', claim_retries=2)
        taken = self.take_before_claim(100)
        server = self.boot(self.flavor, expected_state='ERROR')
        self.assertIn('No valid host', server['fault']['message'])
        # The first attempt and two retries, each losing its one claim.
        self.assertEqual(3, len(taken))
        self.assertEqual({'retried': 2, 'gave_up': 1}, self.retries())

    def test_racing_retries_while_placement_is_in_flux(self):
        # Another scheduler's multi-create holds every VF when Nova claims
        # (the claim is lost), so the retry finds no candidate at all;
        # then the multi-create fails and releases them (Nova's cleanup).
        # The request keeps racing and is placed.
        from nova.scheduler.client import report
        other = uuidutils.generate_uuid()
        from nova.scheduler import utils
        real_claim = utils.claim_resources
        held = []

        def claim(ctx, client, spec_obj, instance_uuid, alloc_req,
                  *args, **kwargs):
            if not held:
                entry = self.view_entry()
                self.placement.put('/allocations/%s' % other, {
                    'allocations': {rp: {'resources': {'VGPU': 1}}
                                    for rp in entry.uuids},
                    'project_id': 'other', 'user_id': 'other'},
                    version='1.12')
                held.append(True)
            return real_claim(ctx, client, spec_obj, instance_uuid,
                              alloc_req, *args, **kwargs)
        real_get = report.SchedulerReportClient.get_allocation_candidates
        gets = []

        def get(client, *args, **kwargs):
            found = real_get(client, *args, **kwargs)
            gets.append(bool(found and found[0]))
            if len(gets) == 2:
                self.placement.delete('/allocations/%s' % other)
            return found
        self.useFixture(fixtures.MonkeyPatch(
            'nova.scheduler.utils.claim_resources', claim))
        self.useFixture(fixtures.MonkeyPatch(
            'nova.scheduler.client.report.SchedulerReportClient.'
            'get_allocation_candidates', get))
        server = self.boot(self.flavor)
        self.assertEqual(1, len(self.gpu_providers_of(server)))
        # Candidates, none (all held), candidates again.
        self.assertEqual([True, False, True], gets)
        self.assertEqual({'retried': 2, 'gave_up': 0}, self.retries())

    def view_entry(self):
        return self.gpu_view.get('a100')

    def test_without_retries_a_lost_claim_is_no_valid_host(self):
        # Nova's own behaviour, and the plugin's before it retried: the
        # host still had three free VFs.
        self.flags_for_every_service('gpu_scheduler', claim_retries=0)
        self.take_before_claim(1)
        server = self.boot(self.flavor, expected_state='ERROR')
        self.assertIn('No valid host', server['fault']['message'])
        used, total = self.vgpu_usage('a100')[0]
        self.assertEqual(3, total - used)

    def test_a_refusal_is_not_retried(self):
        for _ in range(4):
            self.boot(self.flavor)
        server = self.boot(self.flavor, expected_state='ERROR')
        self.assertIn('No valid host', server['fault']['message'])
        self.assertEqual({'retried': 0, 'gave_up': 0}, self.retries())


class ThreeSchedulersTest(_LostClaims):
    """Three scheduler services, each with its own view and its own
    retries: requests go to them in turn. Two A100s: eight VFs.
    """

    HOSTS = (cloud.GpuHost('a100', 'A100-40GB', 'A100-10C', gpus=2),)
    SCHEDULERS = 3

    def test_each_scheduler_schedules_its_lost_claims_again(self):
        taken = self.take_before_claim(3, once_per_instance=True)
        servers = [self.boot(self.flavor) for _ in range(3)]
        self.assertEqual(3, len(taken))
        # Three servers on three VFs, none of them one another scheduler
        # took.
        providers = [self._get_provider_uuid_by_name(p) for s in servers
                     for p in self.gpu_providers_of(s)]
        self.assertEqual(3, len(set(providers)))
        self.assertEqual(set(), set(providers) & set(taken))
        self.assertEqual(
            [{'retried': 1, 'gave_up': 0}] * 3,
            [dict(s.manager.claim_retries) for s in self.schedulers])
