import os
import tempfile

import testtools

from nova_gpu.core import exceptions
from nova_gpu.core import layout as layout_mod
from nova_gpu.sim import carving

HEADER = 'name,num_gpu,gpu_milli,creation_time,deletion_time\n'


def write_trace(rows):
    fd, path = tempfile.mkstemp(suffix='.csv')
    with os.fdopen(fd, 'w') as f:
        f.write(HEADER)
        for i, (count, milli, start, end) in enumerate(rows):
            f.write('p%d,%d,%d,%d,%d\n' % (i, count, milli, start, end))
    return path


def shifting_demand():
    """Small vGPUs for a day, then whole GPUs, then 40 GiB ones."""
    rows = []
    # Day 0: 40 requests of 10 GiB, each for 6 hours.
    rows += [(1, 110, 60 * i, 60 * i + 6 * 3600) for i in range(40)]
    # Day 1: 12 whole GPUs for 6 hours.
    rows += [(1, 1000, 86400 + 60 * i, 86400 + 60 * i + 6 * 3600)
             for i in range(12)]
    # Day 2: 20 requests of 40 GiB.
    rows += [(1, 470, 2 * 86400 + 60 * i, 2 * 86400 + 60 * i + 6 * 3600)
             for i in range(20)]
    return rows


class LoadTest(testtools.TestCase):

    def test_reads_lifetimes_and_skips_cpu_only(self):
        path = write_trace([(1, 500, 10, 20), (0, 0, 5, 9), (1, 200, 7, 7),
                            (2, 1000, 3, 30)])
        self.addCleanup(os.unlink, path)
        reqs = carving.load_requests(path)
        self.assertEqual([3, 10], [r.arrival for r in reqs])
        self.assertEqual(2 * 27 / 3600.0, reqs[0].gpu_hours)

    def test_missing_times_are_named(self):
        fd, path = tempfile.mkstemp(suffix='.csv')
        with os.fdopen(fd, 'w') as f:
            f.write('name,num_gpu,gpu_milli\np,1,1000\n')
        self.addCleanup(os.unlink, path)
        e = self.assertRaises(exceptions.InvalidRequest,
                              carving.load_requests, path)
        self.assertIn('creation_time', str(e))


class ReplayTest(testtools.TestCase):

    def setUp(self):
        super().setUp()
        path = write_trace(shifting_demand())
        self.addCleanup(os.unlink, path)
        self.requests = carving.load_requests(path)

    def test_unknown_mode(self):
        self.assertRaises(exceptions.InvalidRequest, carving.replay,
                          self.requests, 1, 'magic')

    def test_carve_follows_a_shift_that_strands_a_static_mix(self):
        # One host of 8 GPUs. A static mix sized on the whole trace
        # keeps GPUs for every class all the time; carving re-carves the
        # idle ones for the class of the day.
        cluster = carving.Cluster(1)
        classes = cluster.classes_for(self.requests)
        mix = carving.proportional_mix(cluster, classes, self.requests)
        static = carving.replay(
            self.requests, 1, 'static',
            static_layouts=carving.static_layouts(cluster, classes, mix))
        carve = carving.replay(self.requests, 1, 'carve')
        ideal = carving.replay(self.requests, 1, 'ideal')
        self.assertEqual(72, static.arrived)
        self.assertGreater(static.refused, 0)
        self.assertLess(carve.refused, static.refused)
        self.assertLessEqual(ideal.refused, carve.refused)
        self.assertGreater(carve.recarves, 0)
        self.assertEqual(0, static.recarves)
        self.assertAlmostEqual(carve.offered_gpu_hours,
                               ideal.offered_gpu_hours)
        self.assertTrue(carve.curve)

    def test_devices_in_use_are_never_recarved(self):
        # set_layout refuses a GPU in use; a replay that tried would
        # raise, so a clean carve replay proves the planner never did.
        cluster = carving.Cluster(1)
        state = carving.CarvedCluster(cluster)
        state.set_layout(0, 0, layout_mod.Layout(layout_mod.PASSTHROUGH))
        cls = cluster.classes_for(self.requests)[(1000, 1)]
        found = state.place(cls)
        state.take(*found)
        self.assertRaises(exceptions.AllocationError, state.set_layout,
                          0, 0, layout_mod.Layout(layout_mod.PASSTHROUGH))
        state.release(*found)
        state.set_layout(0, 0, layout_mod.Layout(layout_mod.TIME_SLICED,
                                                 'A100D-10C'))

    def test_best_static_does_not_get_worse(self):
        cluster = carving.Cluster(1)
        classes = cluster.classes_for(self.requests)
        start = carving.replay(
            self.requests, 1, 'static',
            static_layouts=carving.static_layouts(
                cluster, classes,
                carving.proportional_mix(cluster, classes, self.requests)))
        mix, best = carving.best_static(self.requests, 1, budget=6)
        self.assertLessEqual(best.refused, start.refused)
        self.assertEqual(8, sum(mix.values()))

    def test_multi_gpu_requests_need_one_host(self):
        path = write_trace([(8, 1000, 0, 100), (8, 1000, 10, 50)])
        self.addCleanup(os.unlink, path)
        reqs = carving.load_requests(path)
        for mode in ('carve', 'ideal'):
            out = carving.replay(reqs, 1, mode)
            self.assertEqual(1, out.refused, mode)
            out = carving.replay(reqs, 2, mode)
            self.assertEqual(0, out.refused, mode)


class VerdictTest(testtools.TestCase):

    def outcome(self, mode, refused, pct):
        out = carving.CarvingOutcome(mode, 8, arrived=100, refused=refused,
                                     offered_gpu_hours=100.0,
                                     served_gpu_hours=pct)
        return out

    def test_targets(self):
        from nova_gpu.bench import carving_bench as bench
        ideal = self.outcome('ideal', 5, 99.0)
        self.assertEqual((True, True), bench.verdict(
            self.outcome('static', 100, 90.0),
            self.outcome('carve', 50, 97.5), ideal))
        self.assertEqual((False, False), bench.verdict(
            self.outcome('static', 100, 90.0),
            self.outcome('carve', 51, 96.9), ideal))
        # Where even the bound refuses more than half of static, carve
        # must come within 10% of the bound.
        self.assertEqual((True, True), bench.verdict(
            self.outcome('static', 100, 90.0),
            self.outcome('carve', 66, 98.0), self.outcome('ideal', 60,
                                                          99.0)))
