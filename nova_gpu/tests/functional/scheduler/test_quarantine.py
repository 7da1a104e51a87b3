"""A quarantined GPU takes no new guest on any path; guests stay.

The report's ``health`` (what the agent's NVML pass found,
``core.health``) reaches every scheduler's view; the one capacity rule
(``core.fragmentation.unit_slots``) then offers nothing on that GPU, so
GpuFilter drops the candidates using any of its providers and, where no
GPU is left, refuses the host naming the fault.
"""

from nova_gpu.core import health
from nova_gpu.tests.harness import cloud


def faulty(xid=48):
    return health.observe(health.Health(), health.Sample(
        xids=(xid,), ecc_volatile=1, boot_id='b'), 1000.0)


class QuarantineTest(cloud.GpuCloudTestCase):

    HOSTS = (cloud.GpuHost('t4', 'T4', 'T4-8C', gpus=2),
             cloud.GpuHost('h100', 'H100-80GB', 'H100-20C', gpus=2),
             cloud.GpuHost('h200', 'H200-141GB', gpus=2,
                           path=cloud.PASSTHROUGH))

    def test_every_path_skips_the_quarantined_gpu(self):
        for host in ('t4', 'h100', 'h200'):
            self.set_gpu_health(host, 0, faulty())
        self.sync_gpu_reports()
        for keys in ({'gpu:profile': 'T4-8C'}, {'gpu:profile': 'H100-20C'},
                     {'gpu:kind': 'whole'}):
            server = self.boot(self.create_gpu_flavor(keys))
            self.assertEqual([1], self.gpus_of(server), keys)

    def test_guests_stay_and_the_refusal_names_the_fault(self):
        flavor = self.create_gpu_flavor({'gpu:kind': 'whole'})
        first = self.boot(flavor)
        (gpu,) = self.gpus_of(first)
        self.set_gpu_health('h200', 1 - gpu, faulty(79))
        self.set_gpu_health('h200', gpu, faulty())
        self.sync_gpu_reports()
        refused = self.boot(flavor, expected_state='ERROR')
        self.assertIn('No valid host', refused['fault']['message'])
        log = self.stdlog.logger.output
        self.assertIn('quarantined', log)
        self.assertIn('Xid 79: GPU has fallen off the bus', log)
        # The guest on the quarantined GPU keeps running.
        self.assertEqual('ACTIVE',
                         self.api.get_server(first['id'])['status'])
        # Back after the reset (the agent's evidence): boots again.
        self.set_gpu_health('h200', 1 - gpu, None)
        self.sync_gpu_reports()
        self.assertEqual([1 - gpu], self.gpus_of(self.boot(flavor)))
