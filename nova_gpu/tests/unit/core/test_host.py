from nova_gpu.core import exceptions
from nova_gpu.core import host as H
from nova_gpu.tests.unit.core import base


class GpuStateTest(base.TestCase):

    def gpu(self, model='A100-40GB', **kw):
        return H.Gpu(0, self.model(model), **kw)

    def test_whole_needs_a_free_gpu(self):
        gpu = self.gpu()
        gpu.take(H.Slot(0, H.SHARE, 100))
        self.assertRaises(exceptions.AllocationError, gpu.take,
                          H.Slot(0, H.WHOLE))
        gpu.give_back(H.Slot(0, H.SHARE, 100))
        gpu.take(H.Slot(0, H.WHOLE))
        self.assertEqual(0, gpu.free_milli)

    def test_shares_never_exceed_one_gpu(self):
        gpu = self.gpu()
        gpu.take(H.Slot(0, H.SHARE, 600))
        gpu.take(H.Slot(0, H.SHARE, 400))
        self.assertRaises(exceptions.AllocationError, gpu.take,
                          H.Slot(0, H.SHARE, 1))
        self.assertEqual(0, gpu.free_milli)

    def test_time_sliced_profiles_must_match(self):
        gpu = self.gpu()
        gpu.take(H.Slot(0, H.VGPU, 'A100-10C'))
        self.assertEqual(250, gpu.used_milli)
        err = self.assertRaises(exceptions.AllocationError, gpu.take,
                                H.Slot(0, H.VGPU, 'A100-20C'))
        self.assertIn('A100-20C', str(err))

    def test_vgpu_max_instances(self):
        gpu = self.gpu()
        for _ in range(4):
            gpu.take(H.Slot(0, H.VGPU, 'A100-10C'))
        self.assertRaises(exceptions.AllocationError, gpu.take,
                          H.Slot(0, H.VGPU, 'A100-10C'))

    def test_mixing_allowed_counts_framebuffer(self):
        model = self.model('A100-40GB')
        import dataclasses
        mixed = dataclasses.replace(model, time_sliced_mixing=True)
        gpu = H.Gpu(0, mixed)
        gpu.take(H.Slot(0, H.VGPU, 'A100-20C'))
        gpu.take(H.Slot(0, H.VGPU, 'A100-10C'))
        gpu.take(H.Slot(0, H.VGPU, 'A100-10C'))
        self.assertRaises(exceptions.AllocationError, gpu.take,
                          H.Slot(0, H.VGPU, 'A100-4C'))
        self.assertEqual(0, gpu.free_milli)

    def test_vgpu_types_restrict(self):
        gpu = self.gpu(vgpu_types=['A100-10C'])
        self.assertRaises(exceptions.AllocationError, gpu.take,
                          H.Slot(0, H.VGPU, 'A100-20C'))

    def test_mig_needs_mig_mode(self):
        gpu = self.gpu()
        self.assertRaises(exceptions.AllocationError, gpu.take,
                          H.Slot(0, H.MIG, ('3g.20gb', 0, None)))

    def test_mig_mode_refused_on_t4(self):
        self.assertRaises(exceptions.InvalidRequest, self.gpu, 'T4',
                          mig_enabled=True)

    def test_mig_placement_rules(self):
        gpu = self.gpu(mig_enabled=True)
        four = self.model('A100-40GB').mig_profile('4g.20gb')
        three = self.model('A100-40GB').mig_profile('3g.20gb')
        self.assertEqual((0,), gpu.mig_starts(four))
        self.assertEqual((0, 4), gpu.mig_starts(three))
        # 4g.20gb is only allowed at slice 0.
        self.assertRaises(exceptions.AllocationError, gpu.take,
                          H.Slot(0, H.MIG, ('4g.20gb', 4, None)))
        gpu.take(H.Slot(0, H.MIG, ('3g.20gb', 4, None)))
        self.assertEqual((0,), gpu.mig_starts(three))
        gpu.take(H.Slot(0, H.MIG, ('4g.20gb', 0, None)))
        self.assertEqual(0, gpu.free_milli)
        self.assertEqual(7, gpu.mig_compute)

    def test_mig_compute_slices_limit(self):
        gpu = self.gpu(mig_enabled=True)
        for start in range(7):
            gpu.take(H.Slot(0, H.MIG, ('1g.5gb', start, None)))
        # Slice 7's memory is free but no compute slice is left.
        self.assertEqual((), gpu.mig_starts(
            self.model('A100-40GB').mig_profile('1g.5gb')))

    def test_give_back_what_was_never_taken(self):
        gpu = self.gpu(mig_enabled=True)
        for slot in (H.Slot(0, H.WHOLE), H.Slot(0, H.SHARE, 5),
                     H.Slot(0, H.VGPU, 'A100-10C'),
                     H.Slot(0, H.MIG, ('1g.5gb', 3, None))):
            self.assertRaises(exceptions.AllocationError, gpu.give_back,
                              slot)

    def test_unknown_kind(self):
        gpu = self.gpu()
        self.assertRaises(exceptions.AllocationError, gpu.take,
                          H.Slot(0, 'teleport'))


class HostTest(base.TestCase):

    def host(self):
        a100 = self.model('A100-40GB')
        gpus = [H.Gpu(i, a100, numa_node=i) for i in range(2)]
        cells = [H.NumaCell(0, 8000, 1000), H.NumaCell(1, 8000, 1000)]
        return H.Host('h', gpus, 16000, 2000, cells)

    def test_allocate_is_all_or_nothing(self):
        host = self.host()
        before = host.snapshot()
        bad = H.Assignment('h', (H.Slot(0, H.WHOLE), H.Slot(1, H.WHOLE),
                                 H.Slot(1, H.WHOLE)), None, 100, 10)
        self.assertRaises(exceptions.AllocationError, host.allocate, bad)
        self.assertEqual(before, host.snapshot())

    def test_allocate_free_inverse_with_numa(self):
        host = self.host()
        before = host.snapshot()
        p = H.Assignment('h', (H.Slot(1, H.VGPU, 'A100-10C'),), 1, 4000, 500)
        host.allocate(p)
        self.assertEqual(4000, host.cells[1].cpu_used)
        self.assertEqual(12000, host.cpu_free)
        host.free(p)
        self.assertEqual(before, host.snapshot())

    def test_cpu_and_cell_limits(self):
        host = self.host()
        self.assertRaises(exceptions.AllocationError, host.allocate,
                          H.Assignment('h', (), None, 16001, 0))
        self.assertRaises(exceptions.AllocationError, host.allocate,
                          H.Assignment('h', (), 0, 9000, 0))
        self.assertRaises(exceptions.AllocationError, host.allocate,
                          H.Assignment('h', (), 5, 1, 0))

    def test_wrong_host_and_gpu(self):
        host = self.host()
        self.assertRaises(exceptions.AllocationError, host.allocate,
                          H.Assignment('other', ()))
        self.assertRaises(exceptions.AllocationError, host.allocate,
                          H.Assignment('h', (H.Slot(9, H.WHOLE),)))

    def test_free_more_than_used(self):
        host = self.host()
        self.assertRaises(exceptions.AllocationError, host.free,
                          H.Assignment('h', (), None, 1, 0))

    def test_gpu_indices_in_order(self):
        a100 = self.model('A100-40GB')
        self.assertRaises(exceptions.InvalidRequest, H.Host, 'h',
                          [H.Gpu(1, a100)])
