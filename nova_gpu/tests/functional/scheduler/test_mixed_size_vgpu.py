"""Mixed-size vGPUs in real Nova: two sizes on one GPU, a third refused.

NVIDIA's mixed-size (heterogeneous) time-sliced mode (vGPU 17+) lets one
GPU run vGPUs of different frame-buffer sizes. Nova 34 maps one mdev type
to each parent device, so the shape where one GPU gets several types is
vendor-VFIO VFs typed on demand (doc/source/hgx.rst): Nova's PCI tracker
hands out any VF of the GPU's pool, ``nova-gpu-qemu-hook`` types it with
the flavor's ``gpu:profile`` at start, and the real agent reports the GPU
in mixed-size mode (NVML, faked at its boundary, says so), so GpuFilter
places each size by ``core.mixed_size``'s placement slots.
"""

from nova_gpu.tests.harness import agent_process
from nova_gpu.tests.harness import cloud
from nova_gpu.tests.harness import qemu_hook

LARGE, SMALL = 'L40S-24C', 'L40S-8C'
HOSTS = (
    # One L40S, 6 VFs (L40S-8C's equal-size maximum), no type until a
    # guest starts. Mixed-size slots: 24C takes 4 of 8, 8C 2.
    cloud.GpuHost('l40s-mixed', 'L40S', SMALL, gpus=1, path=cloud.VFIO,
                  vf_types=cloud.ON_DEMAND, mixed_size=True),
)


class MixedSizeVgpuTest(qemu_hook.QemuHookMixin,
                        agent_process.AgentReportsMixin,
                        cloud.GpuCloudTestCase):
    HOSTS = HOSTS

    def types_held(self):
        return sorted(t for t in self.vf_types_of('l40s-mixed')[0].values()
                      if t)

    def test_two_sizes_on_one_gpu_then_a_size_that_no_longer_fits(self):
        large = self.create_gpu_flavor({'gpu:profile': LARGE,
                                        'gpu:backend': 'vfio'})
        small = self.create_gpu_flavor({'gpu:profile': SMALL,
                                        'gpu:backend': 'vfio'})
        self.sync_gpu_reports()
        for view in self.report_views():
            self.assertTrue(view.get('l40s-mixed').host.gpus[0].mixed_size)

        self.boot(large)
        self.sync_gpu_reports()
        self.boot(small)
        self.sync_gpu_reports()
        self.assertEqual([LARGE, SMALL], self.types_held())

        # 6 of 8 slots taken: no 4-slot placement is left for a second
        # L40S-24C (equal-size mode would have refused the L40S-8C).
        server = self.boot(large, expected_state='ERROR')
        self.assertIn('No valid host', server['fault']['message'])
        self.assertIn('mixed-size L40S has no free 4-slot placement for '
                      'L40S-24C (holds 1 L40S-24C, 1 L40S-8C: 6 of 8 '
                      'slots)', self.stdlog.logger.output)
        # A small one still fits the 2 slots left.
        self.boot(small)
        self.assertEqual([LARGE, SMALL, SMALL], self.types_held())
