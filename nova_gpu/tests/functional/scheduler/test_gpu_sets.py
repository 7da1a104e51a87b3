"""Multi-GPU flavors with set traits, through Nova and Placement.

The flavors ask ``core.flavor.placement_extra_specs``' keys: each device
group requires a set trait that one provider per GPU carries
(``core.gpu_sets``): from the provider config nova-compute read at start
(GPUs with one provider) or kept in Placement by the agent's code (the
heads of GPUs whose VFs are providers; the harness runs
``agent.placement.PlacementClient.keep_heads`` after each boot, as the
agent's cycle does).
"""

from nova_gpu.core import gpu_sets
from nova_gpu.tests.harness import cloud


class SetTraitsMixin:

    def set_traits(self, provider_name):
        (rp,) = self.placement.get('/resource_providers?name=%s'
                                   % provider_name).body['resource_providers']
        body = self.placement.get('/resource_providers/%s/traits'
                                  % rp['uuid'], version='1.6').body
        return {t for t in body['traits'] if gpu_sets.is_set_trait(t)}

    def boot_count(self, count, expected='ACTIVE', **keys):
        keys = dict(keys, **{'gpu:count': str(count)})
        return self.boot(self.create_gpu_flavor(keys),
                         expected_state=expected)

    def assert_distinct_gpus(self, server, count):
        gpus = [self.gpu_index(n) for n in self.gpu_providers_of(server)]
        self.assertEqual(count, len(gpus))
        self.assertEqual(count, len(set(gpus)), gpus)


class VfHeadsTest(SetTraitsMixin, cloud.GpuCloudTestCase):
    """8 x H100-80GB, H100-40C on 2 VFs each: 16 VGPU providers."""

    HOSTS = (cloud.GpuHost('h100', 'H100-80GB', 'H100-40C', gpus=8),)
    MAX_CONCURRENT_BUILDS = 1
    PROFILE = {'gpu:profile': 'H100-40C'}

    def heads(self, count):
        """{GPU index: [VF providers carrying ``count``'s set traits]}."""
        found = {}
        for state in self.gpu_states('h100'):
            for p in self.providers_of_gpu('h100', state):
                if any(gpu_sets.parse_trait(t)[0] == count
                       for t in self.set_traits(p['name'])):
                    found.setdefault(state.index, []).append(p['name'])
        return found

    def test_four_devices_one_head_per_gpu(self):
        self.assertEqual(1, gpu_sets.heads_per_gpu(4, 8))
        heads = self.heads(4)
        self.assertEqual(list(range(8)), sorted(heads))
        self.assertTrue(all(len(v) == 1 for v in heads.values()), heads)
        taken = set()
        for _n in range(4):
            server = self.boot_count(4, **self.PROFILE)
            self.assert_distinct_gpus(server, 4)
            taken |= set(self.gpu_providers_of(server))
            self.sync_gpu_reports()
            # The heads moved off the VFs the guests took.
            heads = {n for v in self.heads(4).values() for n in v}
            self.assertFalse(taken & heads)
        self.assertEqual({}, self.heads(4))  # every VF is taken
        self.boot_count(2, expected='ERROR', **self.PROFILE)

    def test_a_multi_create_of_eight_device_servers(self):
        # Two heads per GPU for 8 devices: one query serves both servers
        # of the multi-create (Nova reuses its candidates).
        self.assertEqual(2, gpu_sets.heads_per_gpu(8, 8))
        fid = self.create_gpu_flavor(dict(self.PROFILE, **{
            'gpu:count': '8'}))
        self.api.post_server({'server': {
            'name': 'eight', 'imageRef': cloud.IMAGE, 'flavorRef': fid,
            'networks': 'none', 'min_count': 2, 'max_count': 2}})
        servers = [s for s in self.api.get_servers()
                   if s['name'].startswith('eight')]
        self.assertEqual(2, len(servers))
        gpus = []
        for server in servers:
            server = self._wait_for_state_change(server, 'ACTIVE')
            self.assert_distinct_gpus(server, 8)
            gpus += self.gpus_of(server)
        self.assertEqual(sorted(list(range(8)) * 2), sorted(gpus))

    def test_a_single_vgpu_moves_the_head(self):
        server = self.boot_count(1, **self.PROFILE)
        self.sync_gpu_reports()
        (name,) = self.gpu_providers_of(server)
        self.assertEqual(set(), self.set_traits(name))
        gpu = self.gpu_index(name)
        (head,) = self.heads(4)[gpu]
        self.assertNotEqual(name, head)
        self.assertEqual(gpu_sets.traits_at(gpu, 8),
                         self.set_traits(head))


class StaticSetsTest(SetTraitsMixin, cloud.GpuCloudTestCase):
    """GPUs with one provider each: set traits from the provider config.

    nova-compute read the file (the harness writes it as the agent would)
    when it started.
    """

    HOSTS = (cloud.GpuHost('h200', 'H200-141GB', gpus=4,
                           path=cloud.PASSTHROUGH),
             cloud.GpuHost('h100', 'H100-80GB', 'H100-20C', gpus=4,
                           path=cloud.VFIO),
             cloud.GpuHost('t4', 'T4', 'T4-8C', gpus=4))

    def test_traits_and_boots(self):
        for host in ('h200', 'h100', 't4'):
            for state in self.gpu_states(host):
                (provider,) = self.providers_of_gpu(host, state)
                self.assertEqual(gpu_sets.traits_at(state.index, 4),
                                 self.set_traits(provider['name']))
        whole = self.boot_count(4, **{'gpu:kind': 'whole'})
        self.assert_distinct_gpus(whole, 4)
        self.boot_count(2, expected='ERROR', **{'gpu:kind': 'whole'})
        for _n in range(2):
            self.assert_distinct_gpus(self.boot_count(
                3, **{'gpu:profile': 'H100-20C', 'gpu:backend': 'vfio'}), 3)
        self.assert_distinct_gpus(self.boot_count(
            4, **{'gpu:profile': 'T4-8C'}), 4)

    def test_plain_groups_still_schedule(self):
        # A flavor made before the set traits: slower, not refused.
        keys = {'gpu:kind': 'whole', 'gpu:count': '2',
                'pci_passthrough:alias': 'nvidia-gpu:2'}
        server = self.boot(self.create_gpu_flavor(keys))
        self.assert_distinct_gpus(server, 2)
        self.assertIn('without set traits', self.stdlog.logger.output)
