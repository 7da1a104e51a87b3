"""The GPU scheduler plugin inside a real, in-process Nova.

Three fake GPU hosts of different models (A100, H100, L4), each shown as
Nova 34 shows an SR-IOV GPU with vGPU 16 (one VGPU provider per VF, see
nova_gpu.tests.harness.cloud); servers are booted through the Nova API with the
plugin configured as an operator would (etc/nova, service by service:
nova_gpu.tests.harness.service_conf), and, for comparison, with Nova's stock
filters and weighers.
Every path (PF mdev, VF mdev, MIG-backed VF, vendor VFIO, passthrough) has
its own tests in test_gpu_paths.
"""

from nova.tests.functional.api import client

from nova_gpu.core import notification
from nova_gpu.exporter import cloud as exporter_cloud
from nova_gpu.exporter import listener as exporter_listener
from nova_gpu.tests.harness import cloud
from nova_gpu.tests.unit.scheduler import base

HOSTS = (
    # GPUs 0,1 on NUMA node 0; 2,3 on node 1.
    cloud.GpuHost('a100', 'A100-40GB', 'A100-10C', gpus=4,
                  numa=(0, 0, 1, 1)),
    # NUMA pairs (0,2) and (1,3); NVLink pairs (0,1) and (2,3). Every
    # VF of each GPU is a provider: candidates with two devices on two
    # VFs of one GPU are dropped by the plugin.
    cloud.GpuHost('h100', 'H100-80GB', 'H100-20C', gpus=4,
                  numa=(0, 1, 0, 1), nvlink=((0, 1), (2, 3))),
    # Two vGPUs of L4-12C per GPU: four in all.
    cloud.GpuHost('l4', 'L4', 'L4-12C', gpus=2, numa=(0, 1)),
)


class _Base(cloud.GpuCloudTestCase):
    HOSTS = HOSTS

    def host_of(self, server):
        return self.admin_api.get_server(server['id'])[
            'OS-EXT-SRV-ATTR:host']

    def pack_scenario(self):
        """One vGPU already on a100; where does a stock vGPU flavor go?

        Returns the GPU (host, index) of the first vGPU and the second
        server.
        """
        first = self.boot(self.create_gpu_flavor({'resources:VGPU': '1'}),
                          host='a100')
        (used,) = self.gpus_of(first)
        server = self.boot(self.create_gpu_flavor({'resources:VGPU': '1'}))
        return ('a100', used), server


class PluginPlacementTest(_Base):

    def test_stock_vgpu_flavor_packs_onto_the_used_gpu(self):
        sent = self.useFixture(base.Notifications())
        used, server = self.pack_scenario()
        # Fragmentation policy: the partly used A100 GPU, not a fresh one
        # (another VF of it: another provider).
        self.assertEqual('a100', self.host_of(server))
        self.assertEqual([used[1]], self.gpus_of(server))
        (dev,) = self.guest_devices(server)
        self.assertEqual((used[1],), self.ranked_first(server))
        self.assertEqual(used[1], dev.gpu)
        # gpu.placement.decided, once per server: the host and the GPU it
        # got (Placement's allocation and the guest's device agree).
        first, second = sent.placed()
        self.assertEqual((second.instance_uuid, second.host, second.gpus),
                         (server['id'], 'a100', [dev.gpu]))
        self.assertEqual([[dev.gpu, 'vgpu', 'A100-10C']], second.slots)
        self.assertEqual(('a100', [used[1]]), (first.host, first.gpus))
        self.assertNotEqual(server['id'], first.instance_uuid)
        # nova-gpu-exporter counts them.
        state = exporter_cloud.CloudState(self.gpu_view.catalog)
        endpoint = exporter_listener.Endpoint(state)
        for m in sent.messages(notification.PLACEMENT_EVENT):
            endpoint.info({}, m['publisher_id'], m['event_type'],
                          m['payload'], {})
        self.assertEqual(2, state.snapshot_counters()['placements'])

    def test_by_need_serves_the_smallest_device(self):
        # 12GB: L4-12C is exactly 12GB; H100-20C would strand 8GB and
        # A100-10C is too small.
        server = self.boot(self.create_gpu_flavor({'gpu:memory': '12GB'}))
        self.assertEqual('l4', self.host_of(server))
        # Both L4 GPUs are empty, so equally good: either (each request
        # draws its own among equal choices, core.engine.tie_break).
        self.assertIn(self.gpus_of(server), ([0], [1]))

    def test_model_list(self):
        server = self.boot(self.create_gpu_flavor(
            {'gpu:model': 'H100-80GB,H200-141GB'}))
        self.assertEqual('h100', self.host_of(server))

    def test_fits_nowhere_no_valid_host_with_gpu_reason(self):
        flavor = self.create_gpu_flavor({'gpu:model': 'V100-32GB'})
        server = self.boot(flavor, expected_state='ERROR')
        self.assertIn('No valid host', server['fault']['message'])
        log = self.stdlog.logger.output
        self.assertIn('GpuFilter: no host can serve the GPU request', log)
        self.assertIn('h100: has no GPU of model V100-32GB', log)

    def test_numa_pair(self):
        flavor = self.create_gpu_flavor(
            {'gpu:model': 'H100-80GB', 'gpu:count': '2',
             'gpu:topology': 'numa'})
        for _ in range(2):
            server = self.boot(flavor)
            self.assertEqual('h100', self.host_of(server))
            pair = {self.gpu_index(p) for p in self.gpu_providers_of(server)}
            self.assertIn(pair, [{0, 2}, {1, 3}])

    def test_nvlink_pair(self):
        flavor = self.create_gpu_flavor(
            {'gpu:model': 'H100-80GB', 'gpu:count': '2',
             'gpu:topology': 'nvlink'})
        server = self.boot(flavor)
        pair = {self.gpu_index(p) for p in self.gpu_providers_of(server)}
        self.assertIn(pair, [{0, 1}, {2, 3}])

    def test_rebuild_resize_and_cold_migrate(self):
        small = self.create_gpu_flavor({'gpu:model': 'A100-40GB'})
        server = self.boot(small)
        self.assertEqual('a100', self.host_of(server))
        # Rebuild: same host, same vGPU.
        before = self.gpu_providers_of(server)
        server = self._rebuild_server(server, cloud.IMAGE)
        self.assertEqual('a100', self.host_of(server))
        self.assertEqual(before, self.gpu_providers_of(server))
        # Resize to an H100 flavor: the plugin sends it to h100.
        big = self.create_gpu_flavor({'gpu:model': 'H100-80GB'},
                                     memory_mb=4096)
        server = self._resize_server(server, big)
        self.assertEqual('h100', self.host_of(server))
        server = self._confirm_resize(server, host='a100')
        self.assertEqual({0: (0, 4), 1: (0, 4), 2: (0, 4), 3: (0, 4)},
                         self.vgpu_usage('a100'))
        self.assertEqual(1, sum(u for u, _t in
                                self.vgpu_usage('h100').values()))
        # Cold migrate a stock vGPU server away from h100.
        plain = self.boot(self.create_gpu_flavor({'resources:VGPU': '1'}),
                          host='h100')
        plain = self._migrate_server(plain)
        self.assertNotEqual('h100', self.host_of(plain))
        (provider,) = self.gpu_providers_of(plain)
        self.assertTrue(provider.startswith(self.host_of(plain) + '_pci_'))
        self._confirm_resize(plain, host='h100')
        self.assertEqual(1, sum(u for u, _t in
                                self.vgpu_usage('h100').values()))

    def test_bad_extra_spec_refused_by_the_api(self):
        flavor = self._create_flavor(extra_spec={'resources:VGPU': '1'})
        err = self.assertRaises(
            client.OpenStackApiException, self.api.post_extra_spec, flavor,
            {'extra_specs': {'gpu:profile': 'NOPE'}})
        self.assertEqual(400, err.response.status_code)
        self.assertIn('gpu:profile=NOPE', str(err))
        self.assertIn('A100-10C', str(err))


class MultiCreateTest(cloud.GpuCloudTestCase):
    """One request for four servers: the view counts each claim.

    On a PF-mdev host (T4-8C: two per GPU), where one provider holds all
    the vGPUs of a GPU; VF-mdev hosts in test_gpu_paths. One build at a
    time: concurrent builds on one provider meet Nova's mdev race.
    """

    HOSTS = (cloud.GpuHost('t4', 'T4', 'T4-8C', gpus=2, numa=(0, 1)),)
    MAX_CONCURRENT_BUILDS = 1

    def host_of(self, server):
        return self.admin_api.get_server(server['id'])[
            'OS-EXT-SRV-ATTR:host']

    def test_multi_create_no_double_allocation(self):
        sent = self.useFixture(base.Notifications())
        flavor = self.create_gpu_flavor({'gpu:model': 'T4'})
        body = self._build_server(image_uuid=cloud.IMAGE, flavor_id=flavor,
                                  networks='none')
        body['min_count'] = 4
        body['return_reservation_id'] = True
        reservation = self.api.post_server({'server': body})[
            'reservation_id']
        servers = self.api.get_servers(
            detail=True, search_opts={'reservation_id': reservation})
        self.assertEqual(4, len(servers))
        per_gpu, functions = {}, set()
        for server in servers:
            self._wait_for_state_change(server, 'ACTIVE')
            self.assertEqual('t4', self.host_of(server))
            (gpu,) = self.gpus_of(server)
            per_gpu[gpu] = per_gpu.get(gpu, 0) + 1
            (dev,) = self.guest_devices(server)
            functions.add(dev.function)
        # Exactly the capacity: 2 per GPU, and Placement agrees.
        self.assertEqual({0: 2, 1: 2}, per_gpu)
        self.assertEqual(2, len(functions))
        self.assertEqual({0: (2, 2), 1: (2, 2)}, self.vgpu_usage('t4'))
        # One gpu.placement.decided per server, with the GPU it got.
        self.assertEqual(
            sorted((s['id'], 't4', self.gpus_of(s)) for s in servers),
            sorted((p.instance_uuid, p.host, p.gpus)
                   for p in sent.placed()))

    def test_a_deleted_guests_mdev_serves_the_next_guest(self):
        flavor = self.create_gpu_flavor({'gpu:model': 'T4'})
        servers = [self.boot(flavor) for _ in range(4)]
        self.assertEqual({0: (2, 2), 1: (2, 2)}, self.vgpu_usage('t4'))
        (gpu,) = self.gpus_of(servers[0])
        (mdev,) = self.guest_devices(servers[0])
        self._delete_server(servers[0])
        self.sync_gpu_reports()
        raw = self.gpu_report('t4')['gpus'][gpu]
        self.assertEqual([mdev.mdev], [d['uuid'] for d in raw['idle_mdevs']])
        self.assertEqual(1, len(raw['devices']))
        # Nova keeps the mdev and gives it to the next guest of its type:
        # the GPU is not full in the scheduler's view.
        server = self.boot(flavor)
        self.assertEqual([gpu], self.gpus_of(server))
        self.assertEqual([mdev], self.guest_devices(server))
        self.assertEqual({0: (2, 2), 1: (2, 2)}, self.vgpu_usage('t4'))


class StockPlacementTest(_Base):
    """The same cloud and scenario without the plugin."""

    NOVA_CONF = cloud.STOCK_CONF
    SCHEDULER_FILES = ()

    def test_stock_vgpu_flavor_spreads_elsewhere(self):
        used, server = self.pack_scenario()
        # Nova's RAM/CPU/disk weighers spread: away from the busy host.
        self.assertNotEqual('a100', self.host_of(server))
        self.assertNotEqual(used, (self.host_of(server),
                                   self.gpus_of(server)[0]))


class DedicatedCpuTest(cloud.GpuCloudTestCase):
    """Pinned CPUs: GPUs on the NUMA node that can also hold the guest."""

    HOSTS = (HOSTS[1],)  # h100: GPUs 0,2 on node 0; 1,3 on node 1
    # Fake hosts have 8 CPUs, 0-3 on node 0 and 4-7 on node 1.
    NOVA_CONF = dict(cloud.HARNESS_CONF, compute={
        'cpu_dedicated_set': '0-1,4-5', 'cpu_shared_set': '2-3,6-7'})

    def fill_node0_cpus(self):
        pinned = self._create_flavor(vcpu=2, extra_spec={
            'hw:cpu_policy': 'dedicated'})
        self.boot(pinned, host='h100')

    def test_prefers_gpu_next_to_free_pinned_cpus(self):
        self.fill_node0_cpus()
        flavor = self.create_gpu_flavor(
            {'gpu:model': 'H100-80GB', 'hw:cpu_policy': 'dedicated'},
            vcpu=2)
        server = self.boot(flavor)
        (provider,) = self.gpu_providers_of(server)
        # Node 0's pinned CPUs are taken: a GPU of node 1.
        self.assertIn(self.gpu_index(provider), (1, 3))

    def test_numa_topology_is_strict(self):
        self.fill_node0_cpus()
        flavor = self.create_gpu_flavor(
            {'gpu:model': 'H100-80GB', 'gpu:count': '2',
             'gpu:topology': 'numa', 'hw:cpu_policy': 'dedicated'},
            vcpu=2)
        server = self.boot(flavor)
        pair = {self.gpu_index(p) for p in self.gpu_providers_of(server)}
        # {0, 2} is a NUMA pair too, but node 0 cannot hold the CPUs.
        self.assertEqual({1, 3}, pair)
