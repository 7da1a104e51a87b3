"""Between cycles the agent moves the set traits every heads_interval."""

import types

import fixtures
import testtools

from nova_gpu.agent import agent as agent_mod
from nova_gpu.agent import service


class FakeClock:
    """time.monotonic and a stop event whose wait advances it."""

    def __init__(self, stop_at=None):
        self.now = 0.0
        self.waits = []
        self.stop_at = stop_at

    def monotonic(self):
        return self.now

    def wait(self, seconds):
        self.waits.append(seconds)
        self.now += seconds
        return self.is_set()

    def is_set(self):
        return self.stop_at is not None and self.now >= self.stop_at


class WaitTest(testtools.TestCase):

    def _run(self, interval, heads_interval, stop_at=None):
        clock = FakeClock(stop_at)
        self.useFixture(fixtures.MockPatch(
            'nova_gpu.agent.service.time.monotonic', clock.monotonic))
        passes = []
        agent = types.SimpleNamespace(keep_heads=lambda: passes.append(
            clock.now))
        service._wait_keeping_heads(agent, clock, interval, heads_interval)
        return clock, passes

    def test_passes_between_cycles(self):
        clock, passes = self._run(60, 5)
        self.assertEqual([5.0 * i for i in range(1, 12)], passes)
        self.assertEqual(60.0, clock.now)  # the cycle is not delayed

    def test_zero_means_only_cycles(self):
        clock, passes = self._run(60, 0)
        self.assertEqual([], passes)
        self.assertEqual([60], clock.waits)

    def test_a_stop_ends_the_wait(self):
        clock, passes = self._run(60, 5, stop_at=12)
        self.assertEqual([5.0, 10.0], passes)
        self.assertLess(clock.now, 60)


class AgentPassTest(testtools.TestCase):

    def _agent(self, placement):
        agent = agent_mod.Agent.__new__(agent_mod.Agent)
        agent._placement = placement
        return agent

    def test_no_placement_no_pass(self):
        self.assertEqual(0, self._agent(None).keep_heads())
        self.assertEqual(0, self._agent(
            types.SimpleNamespace(last=None)).keep_heads())

    def test_failures_are_logged_not_raised(self):
        def broken(report, found):
            raise RuntimeError('placement down')
        agent = self._agent(types.SimpleNamespace(
            last=({'gpus': []}, {}), keep_heads=broken))
        logger = self.useFixture(fixtures.FakeLogger())
        self.assertEqual(0, agent.keep_heads())
        self.assertIn('placement down', logger.output)

    def test_the_last_cycles_providers_are_used(self):
        seen = []
        last = ({'gpus': []}, {'vf': {}})
        agent = self._agent(types.SimpleNamespace(
            last=last, keep_heads=lambda r, f: seen.append((r, f)) or 3))
        self.assertEqual(3, agent.keep_heads())
        self.assertEqual([last], seen)
