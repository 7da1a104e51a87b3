"""The real report path: nova-gpu-agent processes -> RabbitMQ -> scheduler.

Each fake GPU host of the in-process cloud gets a fake sysfs tree built
from its fake libvirt devices and a real ``nova-gpu-agent`` process
(libvirt unreachable; NVML absent, or faked at the pynvml module where
the host has NVLinks) publishing its reports every second over a real
RabbitMQ; nova-scheduler consumes them with ``[gpu_scheduler]
report_listener = true``. Nothing hands reports to the view directly
(``AgentReportsMixin.sync_gpu_reports`` only waits for the agents'). Nova's
fixtures fail a test whose oslo.messaging poller outlives its services.
"""

import os

from nova_gpu.scheduler import listener
from nova_gpu.tests.harness import agent_process
from nova_gpu.tests.harness import cloud

# Pre-Ampere hosts (mdev types on the PF): two with four T4-4C vGPUs per
# GPU; one V100 SXM2 board whose NVLink pairs only NVML tells (the agent
# there runs with NVML faked at its boundary, the pynvml module).
HOSTS = (
    cloud.GpuHost('t4-a', 'T4', 'T4-4C', gpus=2, numa=(0, 1)),
    cloud.GpuHost('t4-b', 'T4', 'T4-4C', gpus=2, numa=(1, 0)),
    cloud.GpuHost('v100', 'V100-32GB', 'V100DX-8C', gpus=4,
                  numa=(0, 0, 1, 1), nvlink=((0, 2), (1, 3))),
)


class AgentReportsTest(agent_process.AgentReportsMixin,
                       cloud.GpuCloudTestCase):
    HOSTS = HOSTS

    def host_of(self, server):
        return self.admin_api.get_server(server['id'])[
            'OS-EXT-SRV-ATTR:host']

    def entry(self, hostname):
        return self.gpu_view.get(hostname)

    def provider_uuid(self, name):
        (rp,) = self.placement.get(
            '/resource_providers?name=%s' % name).body['resource_providers']
        return rp['uuid']

    def test_view_holds_each_agents_report_and_uses_it(self):
        # The scheduler's listener runs, bound to its service.
        found = listener.listener_of(self.scheduler.manager)
        self.assertIsNotNone(found)
        self.assertTrue(found.running)
        for spec in HOSTS:
            entry = self.entry(spec.name)
            # From the agent (the harness's own reports carry no boot_id).
            self.assertIsNotNone(entry.boot_id)
            # The agent names providers as Nova does for that host, and
            # the view found each of them in Placement.
            names = {self.provider_name(spec.name, i)
                     for i in range(spec.gpus)}
            self.assertEqual(names, set(entry.providers))
            self.assertEqual({self.provider_uuid(n) for n in names},
                             set(entry.uuids))
            # The fake sysfs matches the fake libvirt host: what the
            # harness would have reported for it, the agent reported.
            expected = self.gpu_report(spec.name)['gpus']
            self.assertEqual(
                [(g['address'], g['model'], g['numa_node'], g['vgpu_types'],
                  g['nvlink_peers']) for g in expected],
                [(g.address, g.model.name, g.numa_node, list(g.vgpu_types),
                  sorted(g.nvlink_peers)) for g in entry.host.gpus])
            self.assertEqual([{}] * spec.gpus,
                             [dict(g.vgpus) for g in entry.host.gpus])
        # Only the agent's (faked) NVML knows the V100 NVLink pairs; PCI
        # order would pair GPUs 0 and 1, NVML links 0-2 and 1-3.
        server = self.boot(self.create_gpu_flavor(
            {'gpu:model': 'V100-32GB', 'gpu:count': '2',
             'gpu:topology': 'nvlink'}))
        self.assertEqual('v100', self.host_of(server))
        pair = {self.gpu_index(p) for p in self.gpu_providers_of(server)}
        self.assertIn(pair, [{0, 2}, {1, 3}])
        # Stopped with SIGTERM, each agent exits cleanly with every report
        # sent (its outbox is empty).
        for spec in HOSTS:
            agent = self.agents[spec.name]
            self.assertEqual(0, self.stop_gpu_agent(spec.name),
                             agent.log_tail())
            outbox = os.path.join(self.agent_dirs[spec.name], 'outbox')
            self.assertEqual([], os.listdir(outbox))

    def test_boot_packs_on_the_gpu_the_agent_reported_used(self):
        flavor = self.create_gpu_flavor({'gpu:model': 'T4'})
        first = self.boot(flavor, host='t4-b')
        (used,) = self.gpu_providers_of(first)
        index = self.gpu_index(used)
        # Nova made the mdev; the agent's periodic report after the boot
        # carries it, and that report replaced the entry in the view (the
        # scheduler's own pending claim went with the old one).
        entry = self.entry('t4-b')
        self.assertEqual([], entry.pending)
        self.assertEqual(
            {index: {'T4-4C': 1}},
            {g.index: dict(g.vgpus) for g in entry.host.gpus if g.vgpus})
        # Only the agent's report tells the scheduler that this GPU is
        # partly used; Nova's spreading weighers prefer the empty t4-a.
        # The plugin packs the next vGPU on it.
        second = self.boot(flavor)
        self.assertEqual('t4-b', self.host_of(second))
        self.assertEqual([used], self.gpu_providers_of(second))
        self.assertEqual(
            {index: {'T4-4C': 2}},
            {g.index: dict(g.vgpus) for g in self.entry('t4-b').host.gpus
             if g.vgpus})


class LostGpuTest(agent_process.AgentReportsMixin, cloud.GpuCloudTestCase):
    """A GPU fallen off the bus, end to end: the agent (its NVML faked at
    the pynvml module) reports the host without it and names its
    provider under ``left_out``; Nova's Placement still offers that
    provider, and GpuFilter drops the candidates using it.
    """

    HOSTS = (cloud.GpuHost('v100', 'V100-32GB', 'V100DX-8C', gpus=4,
                           numa=(0, 0, 1, 1), nvlink=((0, 2), (1, 3))),)
    LOST = 1

    def lost_gpus(self, hostname):
        return (self.LOST,)

    def test_lost_gpu_serves_no_guest_and_the_others_do(self):
        entry = self.gpu_view.get('v100')
        lost = self.provider_name('v100', self.LOST)
        self.assertEqual(3, len(entry.host.gpus))
        self.assertNotIn(lost, entry.providers)
        [left_out] = entry.left_out
        self.assertEqual('GPU is lost', left_out.reason)
        self.assertIn(lost, left_out.providers)
        # Placement still has the lost GPU's provider, with room.
        (rp,) = self.placement.get('/resource_providers?name=%s' % lost
                                   ).body['resource_providers']
        self.assertEqual(frozenset([rp['uuid']]), entry.lost_uuids)
        # Four GPUs at once need the lost one: no valid host, and why.
        server = self.boot(self.create_gpu_flavor(
            {'gpu:model': 'V100-32GB', 'gpu:count': '4'}),
            expected_state='ERROR')
        self.assertIn('No valid host', server['fault']['message'])
        self.assertIn('v100: 3 of 3 GPUs can take a vgpu device, 4 needed; '
                      'left out, its agent cannot read them: 0000:11:00.0 '
                      '(GPU is lost)', self.stdlog.logger.output)
        # Three fit on the others, whatever Placement offers first.
        server = self.boot(self.create_gpu_flavor(
            {'gpu:model': 'V100-32GB', 'gpu:count': '3'}))
        self.assertEqual([0, 2, 3], self.gpus_of(server))
