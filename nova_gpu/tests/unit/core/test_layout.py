from nova_gpu.core import exceptions
from nova_gpu.core import fragmentation
from nova_gpu.core import host as host_mod
from nova_gpu.core import layout as L
from nova_gpu.core import request as request_mod
from nova_gpu.tests.unit.core import base

A100 = 'A100-80GB'


class LayoutTest(base.TestCase):

    def test_kinds_are_checked(self):
        self.assertRaises(exceptions.InvalidRequest, L.Layout, 'sliced')
        self.assertRaises(exceptions.InvalidRequest, L.Layout,
                          L.TIME_SLICED)
        self.assertRaises(exceptions.InvalidRequest, L.Layout, L.MIG)
        self.assertRaises(exceptions.InvalidRequest, L.Layout,
                          L.PASSTHROUGH, 'A100D-20C')

    def test_check_layout_uses_the_mig_rules(self):
        model = self.model(A100)
        L.check_layout(model, L.Layout(L.MIG, instances=(
            ('3g.40gb', 0, 'A100D-3-40C'), ('3g.40gb', 4, None))))
        # 3g.40gb cannot start at slice 2.
        self.assertRaises(exceptions.InvalidRequest, L.check_layout, model,
                          L.Layout(L.MIG, instances=(('3g.40gb', 2, None),)))
        # Overlapping instances.
        self.assertRaises(exceptions.InvalidRequest, L.check_layout, model,
                          L.Layout(L.MIG, instances=(
                              ('7g.80gb', 0, None), ('1g.10gb', 3, None))))
        # A vGPU type backed by another GPU instance profile.
        self.assertRaises(exceptions.InvalidRequest, L.check_layout, model,
                          L.Layout(L.MIG, instances=(
                              ('3g.40gb', 0, 'A100D-1-10C'),)))
        self.assertRaises(exceptions.InvalidRequest, L.check_layout, model,
                          L.Layout(L.TIME_SLICED, 'A100D-3-40C'))
        self.assertRaises(exceptions.InvalidRequest, L.check_layout,
                          self.model('L40S'),
                          L.Layout(L.MIG, instances=(('1g.10gb', 0, None),)))

    def test_need_options_take_the_smallest_fitting_profile(self):
        model = self.model(A100)
        types = [n for n in model.vgpu_profiles if n.startswith('A100D-')]
        self.assertEqual((('vgpu', 'A100D-10C'),
                          ('mig', '1g.10gb', 'A100D-1-10C')),
                         L.need_options(model, 9000, types))
        # 13 GiB: the 16C time-sliced type; no MIG profile is that small.
        self.assertEqual((('vgpu', 'A100D-16C'),),
                         L.need_options(model, 13000, types))
        # 20 GiB: 1g.20gb (1 compute slice), not 2g.20gb.
        self.assertEqual((('vgpu', 'A100D-20C'),
                          ('mig', '1g.20gb', 'A100D-1-20C')),
                         L.need_options(model, 20480, types))
        self.assertEqual((L.WHOLE,), L.need_options(model, 81920, types))

    def test_classes_from_the_scheduler_demand(self):
        demand = fragmentation.Demand([
            fragmentation.DemandItem(request_mod.GpuRequest(
                host_mod.VGPU, 'A100D-20C'), 2),
            fragmentation.DemandItem(request_mod.GpuRequest(
                host_mod.VGPU, 'A100D-3-40C'), 1),
            fragmentation.DemandItem(request_mod.GpuRequest(
                host_mod.WHOLE, count=2), 1),
            fragmentation.DemandItem(request_mod.GpuRequest(
                host_mod.SHARE, milli=300), 1)])
        classes, skipped = L.classes_from_demand(
            demand, [self.model(A100), self.model('L40S')])
        by_name = {c.name: c for c in classes}
        self.assertEqual({A100: (('vgpu', 'A100D-20C'),)},
                         by_name['vgpu A100D-20C'].options)
        self.assertEqual({A100: (('mig', '3g.40gb', 'A100D-3-40C'),)},
                         by_name['vgpu A100D-3-40C'].options)
        self.assertEqual(2, by_name['2x whole'].units)
        self.assertEqual({A100, 'L40S'}, set(by_name['2x whole'].options))
        self.assertEqual(['share 300'], skipped)


def classes(model, **weights):
    """Demand classes on ``model``: small (10G), large (40G), whole."""
    options = {
        'small': (('vgpu', 'A100D-10C'), ('mig', '1g.10gb', 'A100D-1-10C')),
        'large': (('mig', '3g.40gb', 'A100D-3-40C'),),
        'sliced40': (('vgpu', 'A100D-40C'),),
        'whole': (L.WHOLE,),
    }
    return [L.DemandClass(name, w, {model.name: options[name]})
            for name, w in weights.items()]


class PlannerTest(base.TestCase):

    def setUp(self):
        super().setUp()
        self.model_ = self.model(A100)
        self.host = host_mod.Host('h', [host_mod.Gpu(i, self.model_)
                                        for i in range(4)])

    def apply(self, layouts, decisions):
        for d in decisions:
            if d.changed:
                self.assertTrue(self.host.gpus[d.gpu].is_free, d.reason)
                self.host.gpus[d.gpu] = L.gpu_for_layout(
                    self.host.gpus[d.gpu], d.layout)
                layouts[d.gpu] = d.layout

    def test_idle_gpus_follow_the_demand_mix(self):
        planner = L.LayoutPlanner()
        layouts = {}
        decisions = planner.plan(self.host, layouts,
                                 classes(self.model_, small=4, whole=1), 0)
        self.apply(layouts, decisions)
        kinds = sorted(d.layout.kind for d in decisions)
        self.assertIn(L.PASSTHROUGH, kinds)
        self.assertTrue({L.TIME_SLICED, L.MIG} & set(kinds))
        for d in decisions:
            self.assertTrue(d.reason)
            self.assertNotIn('\n', d.reason)
            L.check_layout(self.model_, d.layout)

    def test_mig_mix_on_one_gpu(self):
        planner = L.LayoutPlanner()
        host = host_mod.Host('h', [host_mod.Gpu(0, self.model_)])
        mig_small = [L.DemandClass(
            'small', 3, {A100: (('mig', '1g.10gb', 'A100D-1-10C'),)}),
            L.DemandClass('large', 1,
                          {A100: (('mig', '3g.40gb', 'A100D-3-40C'),)})]
        [d] = planner.plan(host, {}, mig_small, 0)
        self.assertEqual(L.MIG, d.layout.kind)
        gis = sorted(gi for gi, _s, _v in d.layout.instances)
        self.assertIn('3g.40gb', gis)
        self.assertIn('1g.10gb', gis)
        L.check_layout(self.model_, d.layout)

    def test_gpus_in_use_are_never_touched(self):
        planner = L.LayoutPlanner(min_hold=0, max_changes=10)
        layouts = {i: L.Layout(L.TIME_SLICED, 'A100D-10C') for i in range(4)}
        for i in range(4):
            self.host.gpus[i] = L.gpu_for_layout(self.host.gpus[i],
                                                 layouts[i])
        for i in (0, 1):
            self.host.gpus[i].take(host_mod.Slot(i, host_mod.VGPU,
                                                 'A100D-10C'))
        before = [g.snapshot() for g in self.host.gpus[:2]]
        decisions = planner.plan(self.host, layouts,
                                 classes(self.model_, whole=1), 1000)
        for d in decisions[:2]:
            self.assertFalse(d.changed)
            self.assertIn('in use', d.reason)
        self.assertTrue(all(d.changed for d in decisions[2:]))
        self.assertEqual(before, [g.snapshot() for g in self.host.gpus[:2]])

    def test_mixed_size_gpus_are_never_carved(self):
        # Mixed-size vGPU mode: each guest's VF is typed at its start;
        # the planner keeps such a GPU, idle or not.
        model = self.catalog.model('A100-40GB')
        host = host_mod.Host('h', [host_mod.Gpu(0, model, mixed_size=True),
                                   host_mod.Gpu(1, model)])
        demand = [L.DemandClass('small', 1,
                                {model.name: (('vgpu', 'A100-10C'),)})]
        planner = L.LayoutPlanner(min_hold=0)
        mixed, plain = planner.plan(host, {}, demand, 0)
        self.assertFalse(mixed.changed)
        self.assertIn('mixed-size vGPU mode: kept', mixed.reason)
        self.assertTrue(plain.changed)
        host.gpus[1].take(host_mod.Slot(1, host_mod.VGPU, 'A100-10C'))
        self.assertIsNone(planner.carve_for(host, {}, demand[0], demand, 0))

    def test_hold_time_and_rate_limit(self):
        planner = L.LayoutPlanner(min_hold=600, max_changes=1)
        layouts = {}
        self.apply(layouts, planner.plan(
            self.host, layouts, classes(self.model_, small=1), 0))
        self.assertTrue(all(v.kind != L.PASSTHROUGH
                            for v in layouts.values()))
        # Demand turns to whole GPUs: nothing changes before the hold.
        whole = classes(self.model_, whole=1)
        decisions = planner.plan(self.host, layouts, whole, 100)
        self.assertFalse(any(d.changed for d in decisions))
        self.assertIn('minimum', decisions[0].reason)
        # After it, at most max_changes GPUs per plan.
        decisions = planner.plan(self.host, layouts, whole, 700)
        self.assertEqual(1, sum(d.changed for d in decisions))
        self.apply(layouts, decisions)
        self.assertTrue(any('re-carves per plan' in d.reason
                            for d in decisions))

    def test_hysteresis_keeps_a_near_equal_layout(self):
        planner = L.LayoutPlanner(min_hold=0, hysteresis=0.5, max_changes=10)
        layouts = {}
        self.apply(layouts, planner.plan(
            self.host, layouts, classes(self.model_, small=1, whole=1), 0))
        # A small shift of the mix does not re-carve anything.
        decisions = planner.plan(self.host, layouts,
                                 classes(self.model_, small=1, whole=1.2),
                                 10)
        self.assertFalse(any(d.changed for d in decisions),
                         [d.reason for d in decisions])
        # The same plan again is stable too.
        decisions = planner.plan(self.host, layouts,
                                 classes(self.model_, small=1, whole=1), 20)
        self.assertFalse(any(d.changed for d in decisions))

    def test_carve_for_a_missed_request(self):
        planner = L.LayoutPlanner(min_hold=10 ** 6)
        layouts = {}
        self.apply(layouts, planner.plan(
            self.host, layouts, classes(self.model_, whole=1), 0))
        large = classes(self.model_, large=1)[0]
        d = planner.carve_for(self.host, layouts, large,
                              classes(self.model_, whole=1), 5)
        self.assertIsNotNone(d)
        self.assertIn(('mig', '3g.40gb', 'A100D-3-40C'),
                      L.layout_units(self.model_, d.layout))
        self.assertIn('found no device', d.reason)
        # Nothing idle: no carve.
        for i, gpu in enumerate(self.host.gpus):
            gpu.take(host_mod.Slot(i, host_mod.WHOLE))
        self.assertIsNone(planner.carve_for(self.host, layouts, large, [],
                                            6))

    def test_supply_elsewhere_is_counted(self):
        # Other hosts already offer plenty of whole GPUs: this host carves
        # every idle GPU for the small class instead.
        planner = L.LayoutPlanner()
        demand = classes(self.model_, small=1, whole=1)
        decisions = planner.plan(self.host, {}, demand, 0,
                                 elsewhere={'whole': 100})
        self.assertNotIn(L.PASSTHROUGH,
                         [d.layout.kind for d in decisions])
        decisions = L.LayoutPlanner().plan(self.host, {}, demand, 0)
        self.assertIn(L.PASSTHROUGH, [d.layout.kind for d in decisions])

    def test_no_demand_keeps_everything(self):
        planner = L.LayoutPlanner()
        decisions = planner.plan(self.host, {}, [], 0)
        self.assertFalse(any(d.changed for d in decisions))
        self.assertIn('no demand', decisions[0].reason)

    def test_unknown_model_is_left_alone(self):
        planner = L.LayoutPlanner()
        decisions = planner.plan(
            self.host, {}, [L.DemandClass('x', 1, {'L40S': (L.WHOLE,)})], 0)
        self.assertFalse(any(d.changed for d in decisions))
        self.assertIn('no demand class', decisions[0].reason)

    def test_negative_settings_are_refused(self):
        self.assertRaises(exceptions.InvalidRequest, L.LayoutPlanner,
                          hysteresis=-1)
