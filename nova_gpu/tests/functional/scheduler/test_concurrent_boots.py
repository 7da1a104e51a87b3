"""Concurrent boots to exhaustion with two nova-scheduler services racing.

Real Nova API, conductor, two schedulers (each with its own GPU view, fed
by the same reports), Placement and nova-compute on fake GPU hosts.
Servers of several GPU flavors are booted at once, as parallel POSTs and
as multi-create requests, until a whole round fails; the audit of
``nova_gpu.bench.reliability_boots`` must then find no over-commit, no
double allocation, no ACTIVE server without its vGPUs and no failure
other than NoValidHost.
"""

import contextlib

import fixtures
import testtools

from nova_gpu.bench import reliability_boots as boots
from nova_gpu.scheduler import filters
from nova_gpu.scheduler import view as view_mod
from nova_gpu.scheduler import weighers
from nova_gpu.tests.harness import cloud


class _Base(cloud.GpuCloudTestCase):
    HOSTS = boots.hosts(small=True)
    NOVA_CONF = boots.nova_conf()
    SCHEDULERS = 2


class ConcurrentBootsTest(_Base):

    def test_each_scheduler_has_its_own_view(self):
        self.assertEqual(2, len(self.schedulers))
        self.assertEqual(2, len({id(v) for v in self.gpu_views}))
        for service, view in zip(self.schedulers, self.gpu_views):
            plugins = cloud._gpu_plugins(service)
            self.assertEqual(
                {filters.GpuFilter, weighers.GpuFragmentationWeigher,
                 weighers.GpuTopologyWeigher},
                {type(p) for p in plugins})
            # The filter uses its service's view; the weighers read the
            # filter's decisions from the HostStates, not from a view.
            self.assertIs(view, view_mod.of_service(service.manager))
            for plugin in plugins:
                if isinstance(plugin, filters.GpuFilter):
                    self.assertIs(view, plugin.view)
            # Both views got every host's report.
            self.assertEqual(len(self.HOSTS), len(view))

    def test_boot_to_exhaustion_two_schedulers_racing(self):
        boots.slow_guest_definition(self)
        tally = boots.boot_until(self, 60)
        audit = tally.audit
        self.assertGreaterEqual(tally.attempts, 60)
        # Both schedulers served requests: the views did race.
        self.assertEqual(2, len(tally.per_scheduler))
        self.assertTrue(all(tally.per_scheduler), tally.per_scheduler)
        self.assertGreater(tally.multi_creates, 0)
        self.assertGreater(tally.single_posts, 0)
        self.assertGreater(tally.active, 0)
        self.assertEqual(tally.attempts, tally.active + tally.no_valid_host
                         + len(tally.other))
        self.assertEqual([], tally.other)
        self.assertEqual([], audit.overcommits)
        self.assertEqual([], audit.double)
        self.assertEqual([], audit.without_allocation)
        self.assertEqual([], audit.device_mismatch)
        self.assertEqual([], audit.failed_holding)
        self.assertEqual(0, audit.free_at_exhaustion, audit.free_detail)
        self.assertEqual([], tally.leaked)


class AuditTest(_Base):
    """The audit sees what it must count (it can fail).

    Two servers on one provider need a provider of several vGPUs: a T4's
    (mdev types on the physical function); SR-IOV GPUs have one vGPU per
    VF provider.
    """

    HOSTS = _Base.HOSTS + (
        cloud.GpuHost('t4', 'T4', 'T4-8C', gpus=1, numa=(0,)),)

    def _two_on_one_gpu(self):
        flavor = self.create_gpu_flavor({'gpu:model': 'T4'}, memory_mb=512,
                                        vcpu=1, disk=1, ephemeral=0)
        servers = [self.boot(flavor, host='t4') for _ in range(2)]
        flavor_of = {s['id']: flavor for s in servers}
        vgpus = {flavor: 1}
        self.assertEqual(boots.Audit(), self.audit(flavor_of, vgpus))
        return servers, flavor_of, vgpus

    def audit(self, flavor_of, vgpus):
        """The audit, less the free vGPUs (the cloud is not full here)."""
        found = boots.audit(self, flavor_of, vgpus)
        found.free_at_exhaustion, found.free_detail = 0, []
        return found

    def test_over_commit_counted(self):
        servers, flavor_of, vgpus = self._two_on_one_gpu()
        (name,) = self.gpu_providers_of(servers[0])
        uuid = self._get_provider_uuid_by_name(name)
        inventory = self.placement.get(
            '/resource_providers/%s/inventories' % uuid).body
        used = self._get_provider_usages(uuid)['VGPU']
        inventory['inventories']['VGPU']['total'] = used - 1
        # Placement accepts a capacity below usage (a GPU lost, say).
        self.placement.put('/resource_providers/%s/inventories' % uuid,
                           inventory)
        found = self.audit(flavor_of, vgpus)
        self.assertEqual(1, len(found.overcommits), found)
        self.assertIn('%s VGPU' % name, found.overcommits[0])

    def _share_first_mdev(self, servers):
        """Domains as if the second server had the first one's mdev."""
        real = boots._domains(self)
        first, second = (real[s['id']][0] for s in servers)
        shared = dict(real)
        shared[servers[1]['id']] = [(first[0], second[1])]
        self.useFixture(fixtures.MockPatch(
            'nova_gpu.bench.reliability_boots._domains',
            return_value=shared))
        return first, second

    def test_mdev_in_two_domains_counted(self):
        servers, flavor_of, vgpus = self._two_on_one_gpu()
        first, second = self._share_first_mdev(servers)
        found = self.audit(flavor_of, vgpus)
        if first[1] == second[1]:
            # Both hold a vGPU of that GPU: Nova's driver reused the mdev.
            self.assertEqual(1, len(found.driver_reuse), found)
            self.assertEqual([], found.double)
        else:
            # The second holds none there: the scheduler's fault.
            self.assertEqual(1, len(found.double), found)
            self.assertEqual(1, len(found.device_mismatch), found)


class PatientTargetCellTest(testtools.TestCase):
    """Entering a cell is retried when Nova's fixture gives up."""

    def _target_cell(self, fail):
        calls = []

        @contextlib.contextmanager
        def target_cell(context, cell_mapping):
            calls.append((context, cell_mapping))
            if len(calls) <= fail:
                return  # the fixture's retries ran out: no yield
            yield 'cctxt'
        return target_cell, calls

    def test_retried_until_entered(self):
        self.useFixture(fixtures.MockPatch('time.sleep'))
        target_cell, calls = self._target_cell(fail=2)
        with cloud._PatientTargetCell(target_cell, 'ctx', 'cell1') as c:
            self.assertEqual('cctxt', c)
        self.assertEqual([('ctx', 'cell1')] * 3, calls)

    def test_gives_up_after_the_tries(self):
        self.useFixture(fixtures.MockPatch('time.sleep'))
        target_cell, calls = self._target_cell(fail=100)
        manager = cloud._PatientTargetCell(target_cell, 'ctx', 'cell1')
        self.assertRaisesRegex(RuntimeError, "didn't yield",
                               manager.__enter__)
        self.assertEqual(cloud.CELL_SWITCH_TRIES, len(calls))

    def test_errors_of_the_body_are_not_retried(self):
        target_cell, calls = self._target_cell(fail=0)

        def body():
            with cloud._PatientTargetCell(target_cell, 'ctx', None):
                raise RuntimeError('in the body')
        self.assertRaisesRegex(RuntimeError, 'in the body', body)
        self.assertEqual(1, len(calls))
