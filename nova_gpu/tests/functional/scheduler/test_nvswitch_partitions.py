"""NVSwitch partitions (Shared NVSwitch mode), end to end through Nova.

Two HGX H100 8-GPU hosts of whole GPUs (passthrough) report Fabric
Manager's published partition table (``core/data/nvswitch_partitions.yaml``:
0: all 8; 1, 2: the two 4-GPU halves; 3-6: the pairs 0+2, 1+3, 4+6, 5+7;
7-14: single GPUs), a partition active while a guest holds exactly its
GPUs, as the qemu hook activates it. On ``hgx-nvl`` the pair partition 4
(GPUs 1, 3) is unsupported (failed NVLinks). Servers boot through Nova's
API onto a named host; their GPUs are read from the domain XML Nova wrote.
"""

from nova_gpu.core import partitions as partitions_mod
from nova_gpu.tests.harness import cloud

BOARD = 'HGX-H100-8GPU'
HOSTS = (
    cloud.GpuHost('hgx', 'H100-80GB', gpus=8, path=cloud.PASSTHROUGH,
                  partitions=partitions_mod.published_table(BOARD)),
    cloud.GpuHost('hgx-nvl', 'H100-80GB', gpus=8, path=cloud.PASSTHROUGH,
                  partitions=partitions_mod.published_table(
                      BOARD, unsupported={4})),
)
HALVES = ({0, 1, 2, 3}, {4, 5, 6, 7})


class NvswitchPartitionsTest(cloud.GpuCloudTestCase):
    HOSTS = HOSTS

    def setUp(self):
        super().setUp()
        self.pair = self.create_gpu_flavor({'gpu:kind': 'whole',
                                            'gpu:count': '2'})

    def gpus(self, server):
        gpus = sorted(d.gpu for d in self.guest_devices(server))
        self.assertEqual(gpus, self.gpus_of(server))
        return set(gpus)

    def assert_partition(self, host, gpus):
        table = {h.name: h for h in HOSTS}[host].partitions
        part = table.find(gpus)
        self.assertIsNotNone(part, '%s: GPUs %s form no partition'
                             % (host, sorted(gpus)))
        self.assertTrue(part.supported, '%s: unsupported partition %d used'
                        % (host, part.id))
        return part

    def test_pairs_fill_one_half_and_keep_four_gpus_free(self):
        first = self.gpus(self.boot(self.pair, host='hgx'))
        self.assert_partition('hgx', first)
        second = self.gpus(self.boot(self.pair, host='hgx'))
        self.assert_partition('hgx', second)
        self.assertFalse(first & second)
        # The second pair takes the half the first broke: the other
        # 4-GPU partition stays free.
        self.assertIn(first | second, HALVES)
        quad = self.create_gpu_flavor({'gpu:kind': 'whole',
                                       'gpu:count': '4'})
        four = self.gpus(self.boot(quad, host='hgx'))
        # The 4-GPU server still finds the half kept free.
        self.assertEqual(set(range(8)) - first - second, four)

    def test_unsupported_partition_is_never_used(self):
        got = [self.gpus(self.boot(self.pair, host='hgx-nvl'))
               for _ in range(3)]
        for gpus in got:
            self.assertNotEqual({1, 3}, gpus)
            self.assert_partition('hgx-nvl', gpus)
        # The three supported pairs are taken; GPUs 1 and 3 are free but
        # form no partition that can be activated.
        self.assertEqual({0, 2, 4, 5, 6, 7}, set().union(*got))
        server = self.boot(self.pair, host='hgx-nvl', expected_state='ERROR')
        self.assertIn('No valid host', server['fault']['message'])
        self.assertIn('no free NVSwitch partition of 2 GPUs',
                      self.stdlog.logger.output)

    def test_size_no_partition_has_is_refused_with_the_reason(self):
        three = self.create_gpu_flavor({'gpu:kind': 'whole',
                                        'gpu:count': '3'})
        server = self.boot(three, expected_state='ERROR')
        self.assertIn('No valid host', server['fault']['message'])
        self.assertIn('no NVSwitch partition of 3 GPUs',
                      self.stdlog.logger.output)
