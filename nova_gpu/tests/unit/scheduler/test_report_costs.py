"""What one host or publisher can cost the scheduler's view (issue 25, 6).

A stale replay is known from its header and refused before its GPUs are
read; hosts Nova has not matched to a compute node are held boundedly,
evicted oldest first and by age, and counted.
"""

import fixtures

from nova_gpu.core import report as report_mod
from nova_gpu.scheduler import hosts as hosts_mod
from nova_gpu.tests.unit.scheduler import base
from nova_gpu.tests.unit.scheduler import test_view


class _SpecObj:
    instance_uuid = 'i-1'
    num_instances = 1


class StaleReplayTest(base.TestCase):

    def setUp(self):
        super().setUp()
        self.parsed = []
        real = report_mod.parse

        def counting(data, catalog):
            self.parsed.append(data.get('generation'))
            return real(data, catalog)
        self.useFixture(fixtures.MonkeyPatch(
            'nova_gpu.core.report.parse', counting))

    def test_stale_replay_is_not_read(self):
        held = self.view.ingest(base.gpu_report('h1', 'A100-40GB',
                                                generation=5))
        # A replay of an older report, its GPU list junk: the held report
        # answers it from the header, without reading the GPUs.
        replay = base.gpu_report('h1', 'A100-40GB', generation=4)
        replay['gpus'] = [{'junk': n} for n in range(64)]
        self.assertIs(held, self.view.ingest(replay))
        self.assertEqual([5], self.parsed)
        # As before: a new agent run's lower generation is read and taken,
        # a newer one too.
        rerun = base.gpu_report('h1', 'A100-40GB', generation=1)
        rerun['boot_id'] = 'run-2'
        self.assertEqual(1, self.view.ingest(rerun).generation)
        self.assertEqual(2, self.view.ingest(base.gpu_report(
            'h1', 'A100-40GB', generation=2)).generation)
        self.assertEqual([5, 1, 2], self.parsed)


class UnmatchedHostsTest(base.TestCase):

    def setUp(self):
        super().setUp()
        self.useFixture(fixtures.MonkeyPatch(
            'nova_gpu.scheduler.hosts.MAX_UNMATCHED', 3))
        self.useFixture(fixtures.MonkeyPatch(
            'nova_gpu.scheduler.hosts.UNMATCHED_TTL', 600.0))

    def report(self, name, generation=1):
        self.now += 1
        return self.view.ingest(base.gpu_report(name, 'T4', count=1,
                                                generation=generation))

    def ask(self, name):
        """Nova's HostManager lists ``name``: GpuFilter asks about it."""
        self.obj = _SpecObj()
        return self.view.decide(
            self.view.request(self.obj, test_view.STOCK), name, 0)

    def test_unmatched_hosts_bounded_oldest_evicted_and_counted(self):
        for n in range(5):
            self.report('fake-%d' % n)
        self.assertEqual(['fake-2', 'fake-3', 'fake-4'],
                         sorted(self.view.hosts.by_name))
        self.assertEqual(2, self.view.hosts.evicted)
        self.assertEqual(3, self.view.hosts.unmatched)
        # A report keeps a host young: the oldest is then another one.
        self.report('fake-2', generation=2)
        self.report('fake-5')
        self.assertEqual(['fake-2', 'fake-4', 'fake-5'],
                         sorted(self.view.hosts.by_name))
        self.assertEqual(3, self.view.hosts.evicted)

    def test_hosts_nova_asks_about_are_held(self):
        self.report('real')
        self.ask('real')
        for n in range(5):
            self.report('fake-%d' % n)
        self.assertIsNotNone(self.view.get('real'))
        self.assertEqual(4, len(self.view))
        # Its next reports keep it matched.
        self.report('real', generation=2)
        self.assertTrue(self.view.get('real').matched)
        self.assertEqual(3, self.view.hosts.unmatched)

    def test_hosts_placement_knows_are_held(self):
        def resolver(nodename, names):
            if nodename.startswith('fake'):
                raise hosts_mod.UnknownNode('no resource provider named %s'
                                            % nodename)
            return {}
        self.view.resolver = resolver
        self.report('real')
        for n in range(5):
            self.report('fake-%d' % n)
        self.assertIsNotNone(self.view.get('real'))
        self.assertTrue(self.view.get('real').matched)
        self.assertEqual(3, self.view.hosts.unmatched)
        self.assertEqual(2, self.view.hosts.evicted)

    def test_unmatched_hosts_evicted_by_age(self):
        self.report('gone')
        self.report('real')
        self.ask('real')
        self.now += 601
        self.report('other')
        self.assertIsNone(self.view.get('gone'))
        self.assertIsNotNone(self.view.get('real'))
        self.assertEqual(1, self.view.hosts.evicted)

    def test_removed_hosts_leave_the_count(self):
        self.report('fake-0')
        self.view.remove('fake-0')
        self.assertEqual(0, self.view.hosts.unmatched)

    def test_placement_resolver_names_an_unknown_node(self):
        class Client:
            def get(self, url, version=None):
                class Resp:
                    status_code = 200

                    def __bool__(self):
                        return True

                    def json(self):
                        return {'resource_providers': []}
                return Resp()
        resolver = hosts_mod.PlacementResolver(Client())
        self.assertRaises(hosts_mod.UnknownNode, resolver, 'fake', ['x'])
