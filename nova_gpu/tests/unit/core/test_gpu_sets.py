"""The set traits keep every GPU set reachable and the product small."""

import itertools

import testtools

from nova_gpu.core import gpu_sets
from nova_gpu.core import report as report_mod


def _domains(gpus, count):
    """Positions whose stand-in carries trait(count, k), for each k."""
    return [{p for p in range(gpus)
             if gpu_sets.trait(count, k) in gpu_sets.traits_at(p, gpus)}
            for k in range(count)]


class TraitsTest(testtools.TestCase):

    def test_every_gpu_set_is_one_assignment(self):
        # Sorted, any N of G GPUs is an assignment of group k to a GPU
        # carrying trait(N, k): no choice is lost.
        for gpus in range(1, 11):
            for count in range(2, min(gpus, gpu_sets.MAX_COUNT) + 1):
                domains = _domains(gpus, count)
                for chosen in itertools.combinations(range(gpus), count):
                    self.assertTrue(all(p in domains[k]
                                        for k, p in enumerate(chosen)),
                                    (gpus, count, chosen))

    def test_each_group_walks_g_minus_n_plus_one_gpus(self):
        for gpus in range(2, 17):
            for count in range(2, min(gpus, gpu_sets.MAX_COUNT) + 1):
                for k, domain in enumerate(_domains(gpus, count)):
                    self.assertEqual(set(range(k, gpus - count + k + 1)),
                                     domain)

    def test_a_host_too_small_carries_none(self):
        self.assertEqual(frozenset(), gpu_sets.traits_at(0, 1))
        # 4 GPUs: nothing for 5 to 8 devices.
        counts = {gpu_sets.parse_trait(t)[0]
                  for p in range(4) for t in gpu_sets.traits_at(p, 4)}
        self.assertEqual({2, 3, 4}, counts)

    def test_names(self):
        self.assertEqual('CUSTOM_NOVA_GPU_SET4_3', gpu_sets.trait(4, 3))
        self.assertEqual((4, 3),
                         gpu_sets.parse_trait('CUSTOM_NOVA_GPU_SET4_3'))
        self.assertIsNone(gpu_sets.parse_trait('CUSTOM_GPU_NUMA_0'))
        self.assertRaises(ValueError, gpu_sets.trait, 4, 4)
        self.assertRaises(ValueError, gpu_sets.trait, 9, 0)
        self.assertEqual('nvidia-gpu-set8-7',
                         gpu_sets.alias_name('nvidia-gpu', 8, 7))
        self.assertEqual(('nvidia-gpu', 8, 7),
                         gpu_sets.parse_alias('nvidia-gpu-set8-7'))
        self.assertIsNone(gpu_sets.parse_alias('nvidia-gpu-set2-2'))
        self.assertIsNone(gpu_sets.parse_alias('nvidia-gpu'))
        aliases = gpu_sets.pci_aliases('a', 'CUSTOM_A', 'type-PF')
        self.assertEqual(sum(range(2, 9)), len(aliases))
        self.assertEqual({'name': 'a-set2-0', 'resource_class': 'CUSTOM_A',
                          'traits': 'CUSTOM_NOVA_GPU_SET2_0',
                          'device_type': 'type-PF'}, aliases[0])


def _gpu(index, kind, names, rc=report_mod.VGPU_RC):
    return {'index': index, 'providers': [
        {'name': n, 'kind': kind, 'resource_class': rc} for n in names]}


class StandInTest(testtools.TestCase):

    def test_single_provider_gpus_stand_for_themselves(self):
        gpus = [_gpu(i, report_mod.PCI_DEVICE, ['h_%d' % i],
                     report_mod.WHOLE_GPU_RC) for i in range(3)]
        static = gpu_sets.static_traits(gpus)
        self.assertEqual({'h_0', 'h_1', 'h_2'}, set(static))
        self.assertEqual(gpu_sets.traits_at(1, 3), static['h_1'])
        self.assertEqual({}, gpu_sets.heads(gpus, lambda n: True))

    def test_positions_count_per_resource_class(self):
        # A whole GPU between two PF mdev GPUs: the mdev ones are 0 and 1
        # of 2, the whole one 0 of 1 (no set traits).
        gpus = [_gpu(0, report_mod.PF_MDEV, ['a']),
                _gpu(1, report_mod.PCI_DEVICE, ['b'],
                     report_mod.WHOLE_GPU_RC),
                _gpu(2, report_mod.PF_MDEV, ['c'])]
        static = gpu_sets.static_traits(gpus)
        self.assertEqual(gpu_sets.traits_at(1, 2), static['c'])
        self.assertEqual(frozenset(), static['b'])

    def _vf_gpus(self, gpus, vfs=4):
        return [_gpu(i, report_mod.VF_MDEV,
                     ['g%d_vf%d' % (i, v) for v in range(vfs)])
                for i in range(gpus)]

    def test_heads_are_free_vfs_within_the_budget(self):
        gpus = self._vf_gpus(8)
        used = {'g0_vf0'} | {'g1_vf%d' % v for v in range(4)}
        plan = gpu_sets.heads(gpus, lambda n: n not in used)
        # GPU 1 is full: no VF carries set traits.
        self.assertEqual({frozenset()},
                         {plan['g1_vf%d' % v] for v in range(4)})
        self.assertEqual(frozenset(), plan['g0_vf0'])
        for count in range(2, 9):
            depth = gpu_sets.heads_per_gpu(count, 8)
            for gpu in (0, 2, 5):
                carrying = [n for n in sorted(plan) if n.startswith(
                    'g%d_' % gpu) and any(
                        gpu_sets.parse_trait(t)[0] == count
                        for t in plan[n])]
                free = [n for n in sorted(plan)
                        if n.startswith('g%d_' % gpu) and n not in used]
                self.assertEqual(free[:depth], carrying, (count, gpu))
        # Every walk of one request stays within the budget.
        for count in range(2, 9):
            span = 8 - count + 1
            self.assertLessEqual(
                (gpu_sets.heads_per_gpu(count, 8) * span) ** count,
                gpu_sets.BUDGET)
        self.assertEqual(1, gpu_sets.heads_per_gpu(4, 8))
        self.assertEqual(2, gpu_sets.heads_per_gpu(8, 8))

    def test_a_free_head_stays(self):
        gpus = self._vf_gpus(8, vfs=3)  # 4 devices: one head per GPU
        four = gpu_sets.trait(4, 0)

        def heads_of_gpu0(plan):
            return [n for n in sorted(plan) if n.startswith('g0_')
                    and four in plan[n]]
        plan = gpu_sets.heads(gpus, lambda n: True, current={'g0_vf2'})
        self.assertEqual(['g0_vf2'], heads_of_gpu0(plan))
        # Taken: the first free VF becomes the head.
        plan = gpu_sets.heads(gpus, lambda n: n != 'g0_vf2',
                              current={'g0_vf2'})
        self.assertEqual(['g0_vf0'], heads_of_gpu0(plan))

    def test_a_quarantined_gpu_has_no_head(self):
        gpus = self._vf_gpus(2)
        gpus[1]['health'] = {'quarantined': True, 'reason': 'Xid 48'}
        plan = gpu_sets.heads(gpus, lambda n: True)
        self.assertTrue(plan['g0_vf0'])
        self.assertEqual({frozenset()},
                         {plan['g1_vf%d' % v] for v in range(4)})

    def test_mixed_pf_and_vf_gpus_share_positions(self):
        gpus = [_gpu(0, report_mod.PF_MDEV, ['pf']),
                _gpu(1, report_mod.VF_MDEV, ['vf0', 'vf1'])]
        self.assertEqual(gpu_sets.traits_at(0, 2),
                         gpu_sets.static_traits(gpus)['pf'])
        self.assertEqual(gpu_sets.traits_at(1, 2),
                         gpu_sets.heads(gpus, lambda n: True)['vf0'])
