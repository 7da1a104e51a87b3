import os

import testtools

from nova_gpu.sim import nova_modes
from nova_gpu.sim import trace as trace_mod

DATA = os.path.join(os.path.dirname(nova_modes.__file__), 'data')


class NovaModesTest(testtools.TestCase):
    """vGPU and MIG replays on the shipped sample trace."""

    def setUp(self):
        super().setUp()
        self.nodes = trace_mod.load_nodes(os.path.join(DATA,
                                                       'small_nodes.csv'))
        self.tasks = trace_mod.load_tasks(os.path.join(DATA,
                                                       'small_tasks.csv'))
        capacity = int(self.nodes.gpus.sum()) * 1000
        self.work = trace_mod.workload(self.tasks, capacity, 1.3, 42)

    def test_every_mode_and_policy_packs_validly(self):
        for mode in nova_modes.MODES:
            results = {}
            for policy in nova_modes.POLICIES:
                cap, arrived, placed, allocated = nova_modes.replay(
                    self.nodes, self.work, mode, policy, self.tasks)
                # Profiles round requests up: they take at least what was
                # asked, and never more than the cluster has.
                self.assertTrue((placed <= arrived).all())
                self.assertTrue((allocated <= cap).all())
                self.assertTrue((placed <= allocated).all())
                self.assertGreater(placed[-1], 0)
                results[policy] = placed[-1]
            # On this sample the fragmentation-aware policies place more
            # than stock Nova's spreading.
            self.assertGreater(results['ours'], results['nova'], mode)
            self.assertGreater(results['fgd'], results['nova'], mode)

    def test_shares_round_up_to_catalog_profiles(self):
        from nova_gpu.core import catalog
        cat = catalog.load_catalog()
        a100 = cat.model('A100-80GB')
        self.assertEqual('1g.10gb', nova_modes.mig_profile(a100, 100))
        profile = nova_modes.vgpu_profile(a100, 460)
        self.assertGreaterEqual(
            a100.vgpu_profiles[profile].framebuffer_mib,
            0.46 * a100.framebuffer_mib)
