"""The scheduler publishes its windowed demand for the agents' planners."""

from nova_gpu.core import notification
from nova_gpu.scheduler import gpu_spec
from nova_gpu.tests.unit.scheduler import base


def spec(**specs):
    return gpu_spec.parse({k.replace('__', ':'): v for k, v in specs.items()},
                          base.CATALOG)


SMALL = spec(gpu__profile='A100-10C', resources__VGPU='1')
LARGE = spec(gpu__profile='A100-40C', resources__VGPU='1')


class DemandPublishTest(base.TestCase):

    def setUp(self):
        super().setUp()
        self.sent = self.useFixture(base.Notifications())
        self.conf.set_override('demand_refresh_interval', 10,
                               'gpu_scheduler')
        self.conf.set_override('demand_publish_interval', 60,
                               'gpu_scheduler')

    def published(self):
        return [notification.parse(m['event_type'], m['payload'])
                for m in self.sent.messages(notification.DEMAND_EVENT)]

    def test_rebuilds_are_published_at_most_every_interval(self):
        self.view.note_request(SMALL)
        first = self.published()
        self.assertEqual(1, len(first))
        profiles = {i.request.profile: i.weight
                    for i in first[0].demand().items}
        self.assertIn('A100-10C', profiles)
        # The whole-GPU share the fragmentation measure adds is no demand.
        self.assertNotIn('whole', {i.request.kind
                                   for i in first[0].demand().items})
        self.assertIn('whole', {i.request.kind for i in
                                self.view.demand.engine.demand.items})
        self.assertEqual(1, first[0].requests)
        self.assertEqual(self.view.demand_version, first[0].version)
        # Rebuilt 10 s later: too soon to publish.
        self.now += 10
        self.view.note_request(LARGE)
        self.assertEqual(1, len(self.published()))
        # The first request after the interval carries the newest one.
        self.now += 50
        self.view.note_request(LARGE)
        sent = self.published()
        self.assertEqual(2, len(sent))
        self.assertIn('A100-40C', {i.request.profile
                                   for i in sent[1].demand().items})
        # Nothing new: nothing sent.
        self.now += 5
        self.view.note_request(LARGE)
        self.assertEqual(2, len(self.published()))

    def test_zero_disables(self):
        self.conf.set_override('demand_publish_interval', 0,
                               'gpu_scheduler')
        self.view.note_request(SMALL)
        self.assertEqual([], self.published())


class TypicalRequestsTest(base.TestCase):
    """``[gpu_scheduler] typical_requests``: a bad line names the option,
    the line and the problem, at start.
    """

    def test_bad_lines_are_named(self):
        from nova_gpu.core import exceptions
        from nova_gpu.scheduler import demand_window as demand
        for line, problem in (
                ('gpu:profile=A100-99C', 'unknown vGPU profile'),
                ('gpu:count=0;gpu:kind=whole', 'gpu:count'),
                ('hw:cpu_policy=dedicated', 'asks for no GPU')):
            self.conf.set_override('typical_requests', [line],
                                   'gpu_scheduler')
            err = self.assertRaises(exceptions.InvalidRequest,
                                    demand.typical_requests, base.CATALOG)
            self.assertIn('[gpu_scheduler] typical_requests: %r' % line,
                          str(err))
            self.assertIn(problem, str(err))
        self.conf.set_override('typical_requests',
                               ['gpu:profile=A100-10C'], 'gpu_scheduler')
        self.assertEqual(['A100-10C'], [
            r.profile for r in demand.typical_requests(base.CATALOG)])
