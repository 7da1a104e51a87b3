"""Mixed-size vGPU mode: catalog data and the placement-ID fit rule."""

from nova_gpu.core import engine as engine_mod
from nova_gpu.core import exceptions
from nova_gpu.core import fragmentation as frag
from nova_gpu.core import host as host_mod
from nova_gpu.core import mixed_size
from nova_gpu.core import report
from nova_gpu.core import request
from nova_gpu.tests.unit.core import base
from nova_gpu.tests.unit.core import test_catalog_schema as schema


class MixedSizeCatalogTest(base.TestCase):

    def test_maxima_reproduce_nvidia_tables(self):
        # NVIDIA's mixed-size maxima (nvaie6-vgpu-types) come back from
        # the grid: slots // placement size.
        l40s = self.model('L40S')
        expect = {'L40S-4C': 8, 'L40S-6C': 8, 'L40S-8C': 4, 'L40S-12C': 4,
                  'L40S-16C': 2, 'L40S-24C': 2, 'L40S-48C': 1}
        got = {n: len(mixed_size.placement_ids(l40s, p))
               for n, p in l40s.vgpu_profiles.items()}
        self.assertEqual(expect, got)
        self.assertEqual(8, mixed_size.grid(l40s))

    def test_aligned_placement_ids(self):
        l4 = self.model('L4')
        self.assertEqual((0, 2), mixed_size.placement_ids(
            l4, l4.vgpu_profile('L4-8C')))
        self.assertEqual((0,), mixed_size.placement_ids(
            l4, l4.vgpu_profile('L4-24C')))

    def test_models_without_the_mode(self):
        for name in ('T4', 'V100-32GB', 'H100-80GB'):
            model = self.model(name)
            self.assertFalse(mixed_size.supported(model), name)
            profile = next(iter(model.vgpu_profiles.values()))
            self.assertRaises(exceptions.InvalidRequest,
                              mixed_size.Placements, model)
            self.assertRaises(exceptions.InvalidRequest,
                              mixed_size.size, model, profile)


class MixedSizeSchemaTest(base.TestCase):
    # The schema tests' file helpers, without running their tests again.
    write = schema.CatalogSchemaTest.write
    load = schema.CatalogSchemaTest.load
    error = schema.CatalogSchemaTest.error

    def test_good_maxima_load(self):
        cat = self.load(schema.model(mixed_size_maxima={'X1-8C': 2}))
        self.assertEqual({'X1-8C': 2}, cat.model('X1').mixed_size_maxima)

    def test_unknown_type_named(self):
        err = self.error(schema.model(mixed_size_maxima={'X1-9C': 1}))
        self.assertIn('mixed_size_maxima.X1-9C', str(err))
        self.assertIn('not a time-sliced vGPU type', str(err))

    def test_mig_backed_type_refused(self):
        err = self.error(schema.model(mixed_size_maxima={'X1-1-2C': 1}))
        self.assertIn('mixed_size_maxima.X1-1-2C', str(err))

    def test_above_equal_size_maximum(self):
        err = self.error(schema.model(mixed_size_maxima={'X1-8C': 3}))
        self.assertIn('above the equal-size maximum 2', str(err))

    def test_maximum_must_divide_grid(self):
        profiles = [{'name': 'X1-4C', 'framebuffer_mib': 4096,
                     'max_instances': 4},
                    {'name': 'X1-5C', 'framebuffer_mib': 5120,
                     'max_instances': 3}]
        err = self.error(schema.model(mig=None, vgpu_profiles=profiles,
                                      mixed_size_maxima={}))
        self.assertIn('mixed_size_maxima.X1-5C', str(err))
        self.assertIn('does not divide the 4 placement slots', str(err))

    def test_bad_values(self):
        for bad in ([1], {'X1-8C': 0}, {'X1-8C': 'two'}, 'X1-8C'):
            err = self.error(schema.model(mixed_size_maxima=bad))
            self.assertIn('mixed_size_maxima', str(err))


class PlacementRuleTest(base.TestCase):

    def setUp(self):
        super().setUp()
        self.l40s = self.model('L40S')
        self.gpu = mixed_size.Placements(self.l40s)

    def p(self, name):
        return self.l40s.vgpu_profile(name)

    def test_sizes_share_one_gpu(self):
        self.gpu.place(self.p('L40S-24C'))
        self.gpu.place(self.p('L40S-12C'))
        self.gpu.place(self.p('L40S-4C'))
        self.gpu.place(self.p('L40S-6C'))
        self.assertEqual(8, self.gpu.used_slots)
        self.assertFalse(self.gpu.fits(self.p('L40S-4C')))

    def test_refused_at_a_misaligned_id(self):
        self.gpu.place(self.p('L40S-4C'), start=1)
        # slot 0 is free but an 8C must start at an even slot: 0-1 is
        # broken by the 4C at 1.
        self.assertEqual((2, 4, 6), self.gpu.free_ids(self.p('L40S-8C')))
        err = self.assertRaises(exceptions.InvalidRequest, self.gpu.place,
                                self.p('L40S-8C'), start=1)
        self.assertIn('placement ID 1 is not free for L40S-8C', str(err))
        self.assertRaises(exceptions.InvalidRequest, self.gpu.place,
                          self.p('L40S-8C'), start=0)

    def test_free_frame_buffer_at_wrong_offsets_does_not_fit(self):
        # 4C at 1, 3, 5, 7: half the frame buffer is free, no 8C fits.
        for start in (1, 3, 5, 7):
            self.gpu.place(self.p('L40S-4C'), start=start)
        self.assertEqual(16384, self.gpu.used_mib)
        self.assertFalse(self.gpu.fits(self.p('L40S-8C')))
        self.assertTrue(self.gpu.fits(self.p('L40S-6C')))
        self.assertEqual(4, self.gpu.fragment_slots([self.p('L40S-8C')]))
        self.assertEqual(0, self.gpu.fragment_slots([self.p('L40S-4C')]))

    def test_mixed_size_maximum_holds(self):
        for _ in range(4):
            self.gpu.place(self.p('L40S-8C'))
        self.assertFalse(self.gpu.fits(self.p('L40S-8C')))

    def test_choose_keeps_large_room(self):
        # The chooser packs small vGPUs together, so a 24C still fits
        # after three 4C.
        for _ in range(3):
            self.gpu.place(self.p('L40S-4C'))
        self.assertEqual([0, 1, 2], sorted(self.gpu.taken))
        self.assertTrue(self.gpu.fits(self.p('L40S-24C')))

    def test_remove_frees_placement(self):
        start = self.gpu.place(self.p('L40S-48C'))
        self.assertFalse(self.gpu.fits(self.p('L40S-4C')))
        self.gpu.remove(start)
        self.assertEqual(8, len(self.gpu.free_ids(self.p('L40S-4C'))))

    def test_unknown_type_refused(self):
        err = self.assertRaises(exceptions.InvalidRequest, self.gpu.place,
                                self.model('L4').vgpu_profile('L4-4C'))
        self.assertIn('L4-4C is not a time-sliced vGPU type of L40S',
                      str(err))


class MixedSizeGpuTest(base.TestCase):
    """A GPU in mixed-size mode: the fit rule in ``host.Gpu``, the
    fragmentation measure, the engine and the report.
    """

    def setUp(self):
        super().setUp()
        self.l40s = self.model('L40S')

    def p(self, name):
        return self.l40s.vgpu_profile(name)

    def gpu(self, *held, mixed=True):
        gpu = host_mod.Gpu(0, self.l40s, mixed_size=mixed)
        for name in held:
            gpu.take(host_mod.Slot(0, host_mod.VGPU, name))
        return gpu

    def test_two_sizes_share_a_gpu_then_a_size_no_longer_fits(self):
        gpu = self.gpu('L40S-24C', 'L40S-8C')
        self.assertEqual(750, gpu.used_milli)  # 6 of 8 slots
        self.assertEqual(0, gpu.vgpu_room(self.p('L40S-24C')))
        self.assertEqual(1, gpu.vgpu_room(self.p('L40S-8C')))
        self.assertEqual(2, gpu.vgpu_room(self.p('L40S-4C')))
        self.assertRaises(exceptions.AllocationError, gpu.take,
                          host_mod.Slot(0, host_mod.VGPU, 'L40S-24C'))
        # Equal-size mode: one type per GPU.
        equal = self.gpu('L40S-24C', mixed=False)
        self.assertEqual(0, equal.vgpu_room(self.p('L40S-8C')))

    def test_mixed_size_maximum_applies(self):
        gpu = self.gpu(*['L40S-8C'] * 4)
        # 6 in equal-size mode, 4 in mixed-size mode (NVIDIA's maxima).
        self.assertEqual(0, gpu.vgpu_room(self.p('L40S-8C')))
        self.assertEqual(1000, gpu.used_milli)

    def test_only_models_with_the_mode(self):
        err = self.assertRaises(exceptions.InvalidRequest, host_mod.Gpu,
                                0, self.model('T4'), mixed_size=True)
        self.assertIn('T4 has no mixed-size vGPU mode', str(err))

    def test_fragmentation_counts_slots(self):
        host = host_mod.Host('h', [self.gpu('L40S-24C', 'L40S-8C')])
        demand = frag.Demand.from_requests(
            [request.GpuRequest(host_mod.VGPU, profile='L40S-24C')])
        # 2 free slots (250 milli) no 24C can use: all lost.
        self.assertEqual(250.0, frag.host_fragmentation(host, demand))
        demand = frag.Demand.from_requests(
            [request.GpuRequest(host_mod.VGPU, profile='L40S-4C')])
        self.assertEqual(0.0, frag.host_fragmentation(host, demand))
        # An unnamed vGPU ask may take any size on a mixed-size GPU.
        any_vgpu = request.GpuRequest(host_mod.VGPU)
        self.assertIn(host_mod.Slot(0, host_mod.VGPU, 'L40S-4C'),
                      frag.unit_slots(host.gpus[0], any_vgpu))

    def test_engine_places_two_sizes_and_says_why_not(self):
        host = host_mod.Host('h', [self.gpu('L40S-24C')])
        engine = engine_mod.PlacementEngine()
        small = request.GpuRequest(host_mod.VGPU, profile='L40S-8C')
        best = engine.best(host, small)
        self.assertIsNotNone(best)
        host.allocate(best.placement)
        self.assertEqual({'L40S-24C': 1, 'L40S-8C': 1}, host.gpus[0].vgpus)
        big = request.GpuRequest(host_mod.VGPU, profile='L40S-24C')
        err = self.assertRaises(exceptions.NoFit, engine.best, host, big)
        self.assertEqual(err.reason, engine.why_not(host, big))
        self.assertIn('mixed-size L40S has no free 4-slot placement for '
                      'L40S-24C (holds 1 L40S-24C, 1 L40S-8C: 6 of 8 '
                      'slots)', engine.why_not(host, big))

    def test_report_round_trip_and_refusal(self):
        host = host_mod.Host('h', [self.gpu('L40S-24C')])
        devices = {0: [{'kind': 'vgpu', 'detail': 'L40S-24C'},
                       {'kind': 'vgpu', 'detail': 'L40S-8C'}]}
        data = report.host_to_dict(host, generation=1, devices=devices)
        self.assertIs(True, data['gpus'][0]['mixed_size'])
        back = report.parse(data, self.catalog).host.gpus[0]
        self.assertTrue(back.mixed_size)
        self.assertEqual(1, back.vgpu_room(self.p('L40S-8C')))
        data['gpus'][0]['model'] = 'T4'
        data['gpus'][0]['devices'] = []
        err = self.assertRaises(report.ReportError, report.parse,
                                data, self.catalog)
        self.assertIn('gpus[0].mixed_size', str(err))
        self.assertIn('T4 has no mixed-size vGPU mode', str(err))
        data['gpus'][0]['mixed_size'] = 'yes'
        self.assertRaises(report.ReportError, report.parse,
                          data, self.catalog)


class FuzzedMixedSizeTest(base.TestCase):

    def test_fuzzed_mixed_size_gpus_are_refused_naming_the_gpu(self):
        # The reliability suite's bad mixed-size GPUs
        # (bench.reliability_reports).
        import copy
        import random

        from nova_gpu.bench import reliability_reports
        valid = reliability_reports._valid(self.catalog, 'h1', 1, 5)
        self.assertTrue(report.parse(valid, self.catalog)
                        .host.gpus[1].mixed_size)
        rng = random.Random(28)
        fields = set()
        for _ in range(200):
            data = copy.deepcopy(valid)
            reliability_reports._bad_mixed_size(rng, data)
            err = self.assertRaises(report.ReportError, report.parse, data,
                                    self.catalog)
            self.assertTrue(err.field.startswith('gpus[1]'), err)
            fields.add(err.field)
        self.assertEqual({'gpus[1].mixed_size', 'gpus[1].devices[2]'},
                         fields)
