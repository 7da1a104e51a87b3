"""GPU usage for billing, against what a real Nova did to a server.

A server is booted on an A100 host (A100-10C, a quarter of a GPU),
resized to an L4 flavor (L4-12C, half a GPU: another model, another
profile, another host), cold-migrated to the other L4 host, and deleted;
each resize and migration waits in VERIFY_RESIZE, where the source host
keeps the guest's device, before it is confirmed. nova-gpu-exporter's
usage ledger (``exporter.usage.UsageBook`` on ``exporter.cloud.
CloudState``, as the service wires them) is fed every host's report
every ``PERIOD`` seconds, the agent's cycle, and is restarted from its
file in the middle (after a crash: what it took since its last write is
lost).

The test measures, on its own, when it asked Nova for each change and
when Nova showed it done. A device is attached somewhere between the two
(the guest's domain is defined during the build), and the ledger counts
it from the first report that shows it to the first that no longer does:
the error is within one observation interval (the longest gap between two
reports of a host, ``interval``) beyond the span Nova took, at either
end, whatever the session's length. The harness' reports carry each
device's instance the way the agent's do (``devices[].instance``, the
domain referencing it).
"""

import time

import fixtures
from nova.tests.functional.api import client

from nova_gpu.core import catalog as catalog_mod
from nova_gpu.exporter import api as api_mod
from nova_gpu.exporter import cloud as exporter_cloud
from nova_gpu.exporter import usage
from nova_gpu.tests.harness import cloud

PERIOD = 0.5      # seconds between two reports of each host
HOLD = 3.0        # seconds each state is held (VERIFY_RESIZE included)
SETTLE_S = 120
HOSTS = (cloud.GpuHost('a100', 'A100-40GB', 'A100-10C', gpus=1),
         cloud.GpuHost('l4-1', 'L4', 'L4-12C', gpus=1),
         cloud.GpuHost('l4-2', 'L4', 'L4-12C', gpus=1))


class UsageBillingTest(cloud.GpuCloudTestCase):

    HOSTS = HOSTS

    def setUp(self):
        super().setUp()
        self.catalog = catalog_mod.load_catalog()
        self.path = self.useFixture(fixtures.TempDir()).path + '/usage.json'
        self.observed = {}   # host -> times its reports were taken
        self.start_exporter()

    def project_of(self, server_id):
        try:
            return self.admin_api.get_server(server_id)['tenant_id']
        except client.OpenStackApiNotFoundException:
            return None

    def start_exporter(self):
        self.state = exporter_cloud.CloudState(self.catalog)
        self.book = usage.UsageBook(self.path, max_interval=30,
                                    projects=self.project_of)
        self.state.report_observers.append(self.book.observe)

    def observe(self):
        for hostname in self._host_specs:
            for attempt in range(5):
                try:
                    report = self.gpu_report(hostname)
                    break
                except RuntimeError:
                    # Nova's fake libvirt listed while a build changed it
                    time.sleep(0.01)
            else:
                continue
            self.state.ingest_report(report)
            self.observed.setdefault(hostname, []).append(time.time())

    def hold(self, seconds):
        deadline = time.time() + seconds
        while time.time() < deadline:
            self.observe()
            time.sleep(PERIOD)

    def until(self, server_id, status):
        """Observe until the server is ``status`` (None: gone); when."""
        deadline = time.monotonic() + SETTLE_S
        while time.monotonic() < deadline:
            self.observe()
            try:
                server = self.api.get_server(server_id)
            except client.OpenStackApiNotFoundException:
                if status is None:
                    return time.time()
                raise
            if server['status'] == status:
                return time.time()
            self.assertNotEqual('ERROR', server['status'],
                                server.get('fault'))
            time.sleep(PERIOD)
        self.fail('server %s not %s in %d s'
                  % (server_id, status, SETTLE_S))

    def host_of(self, server_id):
        return self.admin_api.get_server(server_id)['OS-EXT-SRV-ATTR:host']

    def test_boot_resize_migrate_delete(self):
        small = self.create_gpu_flavor({'gpu:model': 'A100-40GB'})
        big = self.create_gpu_flavor({'gpu:model': 'L4'}, memory_mb=4096)
        t = {}
        self.hold(PERIOD * 2)
        t['post'] = time.time()
        server = self.api.post_server({'server': self._build_server(
            image_uuid=cloud.IMAGE, flavor_id=small, networks='none')})
        sid = server['id']
        t['active'] = self.until(sid, 'ACTIVE')
        self.assertEqual('a100', self.host_of(sid))
        self.hold(HOLD)

        t['resize'] = time.time()
        self.api.post_server_action(sid, {'resize': {'flavorRef': big}})
        t['resized'] = self.until(sid, 'VERIFY_RESIZE')
        first_l4 = self.host_of(sid)
        self.assertIn(first_l4, ('l4-1', 'l4-2'))
        self.hold(HOLD)  # the source still holds the A100 vGPU
        self.api.post_server_action(sid, {'confirmResize': None})
        self.until(sid, 'ACTIVE')
        self.hold(HOLD)

        # nova-gpu-exporter crashes: written, then two more reports
        # taken and lost with it; a new one resumes from the file
        self.book.write()
        self.hold(PERIOD * 2)
        self.start_exporter()
        self.hold(HOLD)

        self.api.post_server_action(sid, {'migrate': None})
        self.until(sid, 'VERIFY_RESIZE')
        self.assertNotEqual(first_l4, self.host_of(sid))
        self.hold(HOLD)
        self.api.post_server_action(sid, {'confirmResize': None})
        self.until(sid, 'ACTIVE')
        self.hold(HOLD)

        t['delete'] = time.time()
        self.api.delete_server(sid)
        t['gone'] = self.until(sid, None)
        self.hold(PERIOD * 4)
        self.book.write()

        # The error bound: the longest gap between two reports of a host
        # (the restart's gap included, as the ledger counts over it).
        interval = max(b - a for times in self.observed.values()
                       for a, b in zip(times, times[1:]))
        ledger = self.book.published()
        totals = {k[1:]: v for k, v in ledger.totals.items() if k[0] == sid}
        a100 = totals[('A100-40GB', 'A100-10C')]
        l4 = totals[('L4', 'L4-12C')]
        counted = a100.seconds + l4.seconds
        held_least = t['delete'] - t['active']
        held_most = t['gone'] - t['post']
        print('usage: counted %.2f s, Nova held it %.2f .. %.2f s; '
              'A100 %.2f s, L4 %.2f s; observation interval %.3f s'
              % (counted, held_least, held_most, a100.seconds, l4.seconds,
                 interval))
        self.assertGreaterEqual(counted, held_least - interval)
        self.assertLessEqual(counted, held_most + interval)
        # The A100 until the destination showed the L4 device, not until
        # the resize was confirmed: VERIFY_RESIZE is counted once.
        self.assertGreaterEqual(a100.seconds,
                                t['resize'] - t['active'] - interval)
        self.assertLessEqual(a100.seconds,
                             t['resized'] - t['post'] + interval)
        # No span of time counted on two hosts.
        sessions = sorted((s.start, s.end, s.host) for s in ledger.sessions
                          if s.server == sid)
        self.assertEqual(['a100', first_l4],
                         [h for _s, _e, h in sessions][:2])
        for (_s0, end, _h0), (start, _e1, _h1) in zip(sessions,
                                                      sessions[1:]):
            self.assertGreaterEqual(start, end - 1e-6)
        # Shares and frame buffers: A100-10C a quarter and 10 GiB,
        # L4-12C half and 12 GiB.
        self.assertAlmostEqual(a100.seconds / 4, a100.gpu_seconds)
        self.assertAlmostEqual(l4.seconds / 2, l4.gpu_seconds)
        self.assertAlmostEqual(12 * l4.seconds, l4.fb_gib_seconds)

        # What "openstack gpu usage --project P --start T1" reads.
        project = ledger.projects[sid]
        body = api_mod.usage_body(self.book, {
            'project': [project], 'start': [api_mod.iso(t['post'] - 60)]})
        rows = {(r['model'], r['profile']): r for r in body['usage']}
        self.assertEqual({('A100-40GB', 'A100-10C'), ('L4', 'L4-12C')},
                         set(rows))
        self.assertAlmostEqual(counted, sum(r['seconds']
                                            for r in rows.values()))
        self.assertEqual({sid}, {r['server_id'] for r in rows.values()})
