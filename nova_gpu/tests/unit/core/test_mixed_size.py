"""Mixed-size vGPU mode: catalog data and the placement-ID fit rule."""

from nova_gpu.core import exceptions
from nova_gpu.core import mixed_size
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
