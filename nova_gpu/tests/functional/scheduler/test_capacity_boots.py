"""``openstack gpu capacity`` is what boots: fill the demo cloud, flavor by
flavor, until NoValidHost.

The capacity is the exporter's, from the same reports the schedulers read
(``nova_gpu.exporter.cloud``, ``/v1/capacity``), read the way ``openstack
gpu capacity --flavor`` reads it (``osc.commands.flavor_device`` and
``servers_of``). Before each flavor's fill the test asks how many more
servers of it fit, boots them one at a time, and checks that exactly that
many became ACTIVE and the next one got NoValidHost. The capacity counts
GPU devices only: the flavors ask little CPU and memory and no disk.
"""

import time

from nova_gpu.core import catalog as catalog_mod
from nova_gpu.demo import scenario
from nova_gpu.exporter import api as api_mod
from nova_gpu.exporter import cloud as exporter_cloud
from nova_gpu.osc import commands
from nova_gpu.tests.harness import cloud

SETTLE_S = 60
# The demo's hosts of each path, one of each (fewer boots).
HOSTS = tuple(h for h in scenario.HOSTS
              if h.name in ('h100-1', 'a100-1', 'l40s-1', 't4-1', 'h200-1'))
# Multi-device flavors before single ones: a fill of single devices leaves
# them none.
# One a100.mig boots before the fills, so that a100.mig.x2 meets GPUs of
# unequal room.
# gpu.whole (any model) first: only the passthrough host serves whole GPUs,
# whatever the other GPUs could hold.
ORDER = ('gpu.whole', 'h100.40c.x4', 'h100.40c', 'a100.mig.x2', 'a100.mig',
         'l40s.8c', 't4.8c', 'h200.x2')
WHOLE = scenario.Flavor('gpu.whole', {'gpu:kind': 'whole'}, vcpus=2)


class CapacityIsWhatBootsTest(cloud.GpuCloudTestCase):

    HOSTS = HOSTS
    NOVA_CONF = dict(cloud.HARNESS_CONF, quota={
        'instances': -1, 'cores': -1, 'ram': -1})

    def setUp(self):
        super().setUp()
        self.catalog = catalog_mod.load_catalog()
        self.state = exporter_cloud.CloudState(self.catalog)
        self.exporter = api_mod.Api(self.state, None, stale_after=3600)
        self.flavors = {}
        for flavor in scenario.FLAVORS + (WHOLE,):
            # No disk: the capacity counts GPU devices, and the fake hosts'
            # 128 GB of disk would end the fills first.
            self.flavors[flavor.name] = (flavor, self.create_gpu_flavor(
                flavor.extra_specs, vcpu=flavor.vcpus,
                memory_mb=flavor.ram_mb, name=flavor.name, disk=0,
                ephemeral=0))

    def capacity(self, name):
        """Servers of flavor ``name`` that fit, as ``openstack gpu``."""
        for hostname in self._host_specs:
            self.state.ingest_report(self.gpu_report(hostname))
        flavor, _id = self.flavors[name]
        kind, profile, models, count = commands.flavor_device(
            flavor.extra_specs)
        rows = [r for r in self.exporter.route(['capacity'])['capacity']
                if r['kind'] == kind and r['profile'] == profile
                and (models is None or r['model'] in models)]
        return sum(commands.servers_of(r, count) for r in rows)

    def fill(self, name):
        """Boot ``name`` until NoValidHost; the number that became ACTIVE."""
        _flavor, flavor_id = self.flavors[name]
        booted = 0
        while True:
            server = self.settled(self.api.post_server({
                'server': self._build_server(
                    image_uuid=cloud.IMAGE, flavor_id=flavor_id,
                    networks='none')}))
            if server['status'] == 'ERROR':
                self.assertIn('No valid host', server['fault']['message'])
                self._delete_server(server)
                return booted
            booted += 1
            self.assertLess(booted, 100, name)

    def settled(self, server):
        """The server once ACTIVE or ERROR (reports synced after)."""
        deadline = time.monotonic() + SETTLE_S
        while time.monotonic() < deadline:
            server = self.api.get_server(server['id'])
            if server['status'] in ('ACTIVE', 'ERROR'):
                self.sync_gpu_reports()
                return server
            time.sleep(0.2)
        self.fail('server %s still %s after %d s' % (
            server['id'], server['status'], SETTLE_S))

    def test_capacity_then_fill(self):
        self.boot(self.flavors['a100.mig'][1])
        seen = {}
        for name in ORDER:
            predicted = self.capacity(name)
            seen[name] = (predicted, self.fill(name))
        self.assertEqual({n: (p, p) for n, (p, _b) in seen.items()}, seen)
        # The fills were not all empty: every path booted.
        self.assertEqual(
            {'gpu.whole': 2, 'h100.40c.x4': 4, 'a100.mig.x2': 5,
             'a100.mig': 1, 'l40s.8c': 12, 't4.8c': 4},
            {n: p for n, (p, _b) in seen.items() if p})
