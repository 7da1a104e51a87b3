"""GPU quotas by model and memory: Nova's unified limits refuse the boot.

Nova + Placement in process with ``[quota] driver =
nova.quota.UnifiedLimitsDriver``; the Keystone limits come from
oslo.limit's ``LimitFixture`` (its fake of Keystone's limits API, the way
Nova's own nova/tests/functional/test_unified_limits.py sets them: a real
Keystone is exercised only by the devstack job). The hosts' provider
configs carry the quota classes as nova-gpu-agent writes them with
``[gpu_agent] quota_inventory`` (``core.quota.host_inventory``) and the
flavors ask them as ``openstack gpu flavor keys --quota`` prints them
(``core.quota.extra_specs``). Past a limit Nova's API answers 403 with
its own quota error naming the class; another model still boots.
"""

from oslo_limit import fixture as limit_fixture

from nova.tests.functional.api import client

from nova_gpu.core import quota
from nova_gpu.scheduler import gpu_spec as flavor_mod
from nova_gpu.tests.harness import cloud

H100_VGPU = quota.model_class('H100-80GB', quota.VGPU)
H200_WHOLE = quota.model_class('H200-141GB', quota.WHOLE)
T4_VGPU = quota.model_class('T4', quota.VGPU)

HOSTS = (
    # vendor-VFIO VFs, H100-20C preset: 4 per GPU.
    cloud.GpuHost('h100', 'H100-80GB', 'H100-20C', gpus=1,
                  path=cloud.VFIO),
    # Whole GPUs, PCI in Placement.
    cloud.GpuHost('h200', 'H200-141GB', gpus=2, path=cloud.PASSTHROUGH),
    # Turing, PF mdev: two T4-8C per GPU.
    cloud.GpuHost('t4', 'T4', 'T4-8C', gpus=1),
)

# Generous limits for what every boot also asks: a class a boot asks
# with no registered limit makes Nova list Keystone's registered limits
# (nova/limit/utils.py should_enforce) on each boot.
BASE_LIMITS = {
    'servers': 20, 'class:VCPU': 100, 'class:MEMORY_MB': 1024 * 1024,
    'class:DISK_GB': 10000, 'class:VGPU': 100,
    'class:CUSTOM_NVIDIA_VGPU': 100, 'class:CUSTOM_NVIDIA_GPU': 100,
    'class:' + T4_VGPU: 100,
}


class _QuotaBase(cloud.GpuCloudTestCase):
    HOSTS = HOSTS
    GPU_QUOTA = True
    NOVA_CONF = dict(cloud.HARNESS_CONF,
                     quota={'driver': 'nova.quota.UnifiedLimitsDriver'})
    LIMITS = {}

    def setUp(self):
        super().setUp()
        self.useFixture(limit_fixture.LimitFixture(
            dict(BASE_LIMITS, **self.LIMITS), {}))

    def quota_flavor(self, specs):
        """A flavor of ``specs`` with its path's keys and quota classes."""
        parsed = flavor_mod.parse(specs, vcpus=2, memory_mb=2048)
        extra = dict(specs)
        extra.update(flavor_mod.placement_extra_specs(parsed))
        extra.update(quota.extra_specs(parsed,
                                       flavor_mod.default_catalog()))
        return self._create_flavor(memory_mb=2048, vcpu=2,
                                   extra_spec=extra)

    def assert_over_quota(self, flavor, resource_class):
        """The boot is refused by Nova's API with its quota error."""
        e = self.assertRaises(client.OpenStackApiException, self.boot,
                              flavor)
        self.assertEqual(403, e.response.status_code, e.response.text)
        self.assertIn('over a limit', e.response.text)
        self.assertIn('class:' + resource_class, e.response.text)

    def host_of(self, server):
        return self.admin_api.get_server(server['id'])[
            'OS-EXT-SRV-ATTR:host']


class ModelQuotaTest(_QuotaBase):
    LIMITS = {'class:' + H100_VGPU: 2, 'class:' + H200_WHOLE: 1,
              'class:' + quota.MEMORY_CLASS: 1024 * 1024}

    def test_root_offers_quota_classes(self):
        inventory = self._get_provider_inventory(
            self._get_provider_uuid_by_name('h100'))
        self.assertEqual(20, inventory[H100_VGPU]['total'])
        self.assertEqual(81920, inventory[quota.MEMORY_CLASS]['total'])
        inventory = self._get_provider_inventory(
            self._get_provider_uuid_by_name('h200'))
        self.assertEqual(2, inventory[H200_WHOLE]['total'])

    def test_h100_vgpus_capped(self):
        h100 = self.quota_flavor({'gpu:profile': 'H100-20C',
                                  'gpu:backend': 'vfio'})
        for _ in range(2):
            server = self.boot(h100)
            self.assertEqual('h100', self.host_of(server))
            allocations = self._get_allocations_by_server_uuid(server['id'])
            asked = {rc for a in allocations.values()
                     for rc in a['resources']}
            self.assertIn(H100_VGPU, asked)
            self.assertIn('CUSTOM_NVIDIA_VGPU', asked)
        # The H100 has room for two more: the limit refuses the third.
        self.assert_over_quota(h100, H100_VGPU)
        # Another model still boots.
        t4 = self.boot(self.quota_flavor({'gpu:profile': 'T4-8C'}))
        self.assertEqual('t4', self.host_of(t4))

    def test_whole_h200s_capped(self):
        h200 = self.quota_flavor({'gpu:kind': 'whole',
                                  'gpu:model': 'H200-141GB'})
        server = self.boot(h200)
        self.assertEqual('h200', self.host_of(server))
        self.assert_over_quota(h200, H200_WHOLE)
        # Deleting the server gives the quota back.
        self._delete_server(server)
        self.assertEqual('h200', self.host_of(self.boot(h200)))
        # vGPUs of another model on another path are not held back.
        h100 = self.boot(self.quota_flavor({'gpu:profile': 'H100-20C',
                                            'gpu:backend': 'vfio'}))
        self.assertEqual('h100', self.host_of(h100))


class MemoryQuotaTest(_QuotaBase):
    # Two H100-20C (20 GiB each) and one T4-8C (8 GiB) fit in 48 GiB.
    LIMITS = {'class:' + H100_VGPU: 100,
              'class:' + quota.MEMORY_CLASS: 48 * 1024}

    def test_gpu_memory_capped_across_models(self):
        h100 = self.quota_flavor({'gpu:profile': 'H100-20C',
                                  'gpu:backend': 'vfio'})
        t4 = self.quota_flavor({'gpu:profile': 'T4-8C'})
        self.boot(h100)
        self.boot(h100)
        self.boot(t4)
        # 48 GiB used: neither a T4-8C nor an H100-20C fits.
        self.assert_over_quota(t4, quota.MEMORY_CLASS)
        self.assert_over_quota(h100, quota.MEMORY_CLASS)
