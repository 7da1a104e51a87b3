"""GpuCandidateCutFilter: the same placements, fewer PCI checks.

Real Nova 34 and Placement (nova_gpu.tests.harness.cloud) with two 8-GPU
whole-GPU hosts and a 4-GPU vendor-VFIO host (PCI in Placement: one
provider per whole GPU, one VF pool per GPU). A sequence of boots of
1- and 2-GPU whole-GPU flavors and vendor-VFIO vGPU flavors runs twice
on the same cloud, first with ``[gpu_scheduler] pci_candidates_per_host =
0`` (every candidate reaches Nova's PCI filters), then, once every server
is deleted, with the cut at its most (1: the best candidate and those as
good). Every placement (host and GPU providers) must be the same, and
Nova's per-candidate PCI check (``PciDeviceStats.support_requests``) must
run fewer times. The choices that are random in production (a request's
draw among equally good candidates, Nova's shuffle of equally weighed
hosts) are fixed here so that the two runs can be compared.

``CutFilterTest``: which requests the filter cuts, and that it refuses no
host, on a stand-in view.
"""

import types

import fixtures
from nova.pci import stats as pci_stats
from oslo_config import cfg
from oslo_config import fixture as config_fixture
import testtools
from testtools import content

from nova_gpu.scheduler import candidate_cut
from nova_gpu.tests.harness import cloud

HOSTS = (
    cloud.GpuHost('hgx-a', 'H100-80GB', gpus=8, path=cloud.PASSTHROUGH),
    cloud.GpuHost('hgx-b', 'H100-80GB', gpus=8, path=cloud.PASSTHROUGH),
    cloud.GpuHost('h100', 'H100-80GB', 'H100-20C', gpus=4, path=cloud.VFIO),
)
WHOLE_1 = {'gpu:kind': 'whole', 'gpu:model': 'H100-80GB'}
WHOLE_2 = dict(WHOLE_1, **{'gpu:count': '2'})
VGPU = {'gpu:profile': 'H100-20C', 'gpu:backend': 'vfio'}
# Enough to fill GPUs unevenly on every host, not to exhaust them.
SEQUENCE = ('whole1', 'vgpu', 'whole2', 'whole1', 'vgpu', 'vgpu', 'whole2',
            'whole1', 'vgpu', 'whole1')


class CandidateCutTest(cloud.GpuCloudTestCase):
    HOSTS = HOSTS

    def setUp(self):
        super().setUp()
        # Nova's random pick among equally weighed hosts, off.
        self.flags_for_every_service(
            'filter_scheduler', shuffle_best_same_weighed_hosts=False)
        # The request's draw among equally good candidates: the first;
        # no avoidance of what a just-finished request put first.
        for view in self._views():
            view.draw = lambda: 0.0
        self.useFixture(fixtures.MonkeyPatch(
            'nova_gpu.scheduler.view.PUT_FIRST_TTL', 0.0))
        self.flavors = {'whole1': self.create_gpu_flavor(WHOLE_1),
                        'whole2': self.create_gpu_flavor(WHOLE_2),
                        'vgpu': self.create_gpu_flavor(VGPU)}
        self.checks = 0
        real = pci_stats.PciDeviceStats.support_requests
        test = self

        def counting(stats, requests, provider_mapping=None, *a, **kw):
            if provider_mapping is not None:  # the scheduler's, per candidate
                test.checks += 1
            return real(stats, requests, provider_mapping, *a, **kw)
        self.useFixture(fixtures.MonkeyPatch(
            'nova.pci.stats.PciDeviceStats.support_requests', counting))

    def run_sequence(self, keep):
        self.flags_for_every_service('gpu_scheduler',
                                     pci_candidates_per_host=keep)
        self.checks = 0
        servers, placements = [], []
        for name in SEQUENCE:
            server = self.boot(self.flavors[name])
            servers.append(server)
            host = self.admin_api.get_server(server['id'])[
                'OS-EXT-SRV-ATTR:host']
            placements.append((name, host, self.gpu_providers_of(server)))
        checks = self.checks
        for server in servers:
            self._delete_server(server)
        self.sync_gpu_reports()
        return placements, checks

    def test_same_placements_fewer_pci_checks(self):
        every, every_checks = self.run_sequence(0)
        cut, cut_checks = self.run_sequence(1)
        self.assertEqual(every, cut)
        # Spread over the hosts and paths, so the comparison means
        # something.
        self.assertEqual({'hgx-a', 'hgx-b', 'h100'},
                         {host for _name, host, _gpus in every})
        self.assertLess(cut_checks, every_checks)
        self.addDetail('pci_checks', content.text_content(
            'every candidate: %d, cut: %d' % (every_checks, cut_checks)))


CONF = cfg.CONF


class FakeView:
    def __init__(self, kept=None, fail=False):
        self.kept = kept
        self.fail = fail
        self.asked = []

    def request(self, spec_obj, spec):
        return types.SimpleNamespace(spec=spec)

    def cut(self, request, nodename, cells, candidates, keep):
        self.asked.append((nodename, len(candidates), keep))
        if self.fail:
            raise RuntimeError('view broken')
        return self.kept


def spec_obj(pci=True, num_instances=1):
    requests = types.SimpleNamespace(requests=[object()] if pci else [])
    return types.SimpleNamespace(
        pci_requests=requests, num_instances=num_instances,
        scheduler_hints={}, flavor=types.SimpleNamespace(
            vcpus=2, memory_mb=2048,
            extra_specs={'gpu:kind': 'whole', 'gpu:model': 'H100-80GB'}))


def host(name, n):
    return types.SimpleNamespace(nodename=name, numa_topology=None,
                                 allocation_candidates=[{'i': i}
                                                        for i in range(n)])


class CutFilterTest(testtools.TestCase):

    def setUp(self):
        super().setUp()
        self.conf = self.useFixture(config_fixture.Config(CONF))
        self.useFixture(fixtures.MonkeyPatch(
            'nova.scheduler.utils.request_is_rebuild', lambda s: False))

    def run_filter(self, view, spec, hosts):
        f = candidate_cut.GpuCandidateCutFilter(view)
        return list(f.filter_all(hosts, spec))

    def test_cuts_pci_requests_and_refuses_no_host(self):
        view = FakeView(kept=[0, 2])
        hosts = [host('a', 5), host('b', 2)]
        self.assertEqual(hosts, self.run_filter(view, spec_obj(), hosts))
        self.assertEqual([{'i': 0}, {'i': 2}],
                         hosts[0].allocation_candidates)
        # b: no more than kept anyway, not asked.
        self.assertEqual([('a', 5, 3)], view.asked)
        self.assertEqual(2, len(hosts[1].allocation_candidates))

    def test_left_as_they_come(self):
        for spec, keep in ((spec_obj(pci=False), 3),
                           (spec_obj(num_instances=2), 3),
                           (spec_obj(), 0)):
            self.conf.config(pci_candidates_per_host=keep,
                             group='gpu_scheduler')
            view = FakeView(kept=[0])
            hosts = [host('a', 5)]
            self.assertEqual(hosts, self.run_filter(view, spec, hosts))
            self.assertEqual(5, len(hosts[0].allocation_candidates))
            self.assertEqual([], view.asked)

    def test_a_request_it_cannot_read_is_left_to_gpufilter(self):
        spec = spec_obj()
        spec.flavor = None
        hosts = [host('a', 5)]
        view = FakeView(kept=[0])
        self.assertEqual(hosts, self.run_filter(view, spec, hosts))
        self.assertEqual(5, len(hosts[0].allocation_candidates))

    def test_a_broken_view_leaves_the_host(self):
        hosts = [host('a', 5)]
        self.assertEqual(hosts, self.run_filter(FakeView(fail=True),
                                                spec_obj(), hosts))
        self.assertEqual(5, len(hosts[0].allocation_candidates))
        self.assertTrue(candidate_cut.GpuCandidateCutFilter().host_passes(
            hosts[0], spec_obj()))
