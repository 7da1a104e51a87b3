"""MIG-backed vGPU honours the vGPU types enabled on a GPU (issue 10, 1).

A GPU whose only enabled type is A100-2-10C (10 GB, on a 2g.10gb GPU
instance) must not serve A100-3-20C or A100-7-40C, although the MIG
instances under them would fit: the guest would get a device other than
the one the GPU is set up for. Every path decides this with one rule,
``Gpu.vgpu_enabled``: the engine's choices, rank, evaluate and why_not,
the fragmentation fit checks and slots, and ``Host.allocate``.
"""

import hypothesis
from hypothesis import strategies as st

from nova_gpu.core import engine as engine_mod
from nova_gpu.core import exceptions
from nova_gpu.core import fixtures
from nova_gpu.core import flavor as core_flavor
from nova_gpu.core import fragmentation as frag
from nova_gpu.core import host as H
from nova_gpu.core import request as R
from nova_gpu.tests.unit.core import base

ENABLED = 'A100-2-10C'
# What gpu:profile=A100-3-20C, gpu:memory=12GB and gpu:memory=40GB become
# on an A100-40GB in MIG mode (the smallest MIG-backed types that fit).
NOT_ENABLED = ('A100-3-20C', 'A100-4-20C', 'A100-7-40C', 'A100X-2-10C')


def vgpu(profile, **kw):
    return R.GpuRequest(H.VGPU, profile, **kw)


class MigVgpuTypesTest(base.TestCase):

    def setUp(self):
        super().setUp()
        self.model_ = self.model('A100-40GB')
        self.host = fixtures.hgx_host('h', self.model_, gpus=2, mig=True,
                                      vgpu_types=[ENABLED])
        self.engine = engine_mod.PlacementEngine(frag.Demand([
            frag.DemandItem(vgpu(ENABLED), 1),
            frag.DemandItem(vgpu('A100-3-20C'), 1)]))

    def test_engine_offers_no_choice_for_a_type_not_enabled(self):
        for name in NOT_ENABLED:
            r = vgpu(name)
            self.assertEqual([], self.engine.choices(self.host, r), name)
            self.assertEqual([], self.engine.rank(self.host, r), name)
            self.assertIsNone(self.engine.evaluate(self.host, r, [0]), name)
            err = self.assertRaises(exceptions.NoFit, self.engine.best,
                                    self.host, r)
            self.assertIn('0 of 2 GPUs can take a %s device' % name,
                          err.reason)

    def test_engine_still_serves_the_enabled_type(self):
        r = vgpu(ENABLED)
        choices = self.engine.choices(self.host, r)
        # Two GPUs, 2g.10gb at starts 0, 2 and 4 on each.
        self.assertEqual(6, len(choices))
        for placement in choices:
            (slot,) = placement.slots
            self.assertEqual((H.MIG, '2g.10gb', ENABLED),
                             (slot.kind, slot.detail[0], slot.detail[2]))
        self.assertIsNotNone(self.engine.evaluate(self.host, r, [1]))

    def test_need_based_alternatives_fall_to_the_enabled_type(self):
        # gpu:memory=12GB lists A100-3-20C among its alternatives; on this
        # host only a request the GPU is set up for may be placed.
        for name in ('A100-3-20C', 'A100-7-40C'):
            self.assertEqual([], self.engine.choices(
                self.host, vgpu(name, models={'A100-40GB'})))

    def test_fragmentation_checks_the_enabled_type(self):
        gpu = self.host.gpus[0]
        for name in NOT_ENABLED:
            r = vgpu(name)
            self.assertEqual((), frag.unit_slots(gpu, r), name)
            self.assertFalse(frag.fit_checker(r)(gpu), name)
            self.assertFalse(frag.unit_fits(gpu, r), name)
            self.assertFalse(frag.host_fits(self.host, r), name)
        self.assertTrue(frag.unit_fits(gpu, vgpu(ENABLED)))

    def test_fragmentation_counts_capacity_a_disabled_type_cannot_use(self):
        # Every GPU is free (2000 milli); a typical A100-3-20C request can
        # use none of it here, so all of it is a fragment for that request.
        demand = frag.Demand([frag.DemandItem(vgpu('A100-3-20C'), 1)])
        self.assertEqual(2000, frag.host_fragmentation(self.host, demand))
        usable = frag.Demand([frag.DemandItem(vgpu(ENABLED), 1)])
        self.assertEqual(0, frag.host_fragmentation(self.host, usable))

    def test_unspecified_profile_takes_the_enabled_type(self):
        # A stock VGPU request ("whatever the GPU is set up for").
        r = R.GpuRequest(H.VGPU)
        slots = frag.unit_slots(self.host.gpus[0], r)
        self.assertEqual({(H.MIG, '2g.10gb', ENABLED)},
                         {(s.kind, s.detail[0], s.detail[2])
                          for s in slots})

    def test_allocate_refuses_a_mig_vgpu_of_a_type_not_enabled(self):
        slot = H.Slot(0, H.MIG, ('3g.20gb', 0, 'A100-3-20C'))
        err = self.assertRaises(exceptions.AllocationError,
                                self.host.allocate,
                                H.Assignment('h', (slot,)))
        self.assertIn('A100-3-20C is not enabled', str(err))
        self.assertEqual(0, self.host.gpus[0].mig_mask)

    def test_allocate_refuses_a_vgpu_on_the_wrong_mig_profile(self):
        slot = H.Slot(0, H.MIG, ('3g.20gb', 0, ENABLED))
        err = self.assertRaises(exceptions.AllocationError,
                                self.host.allocate,
                                H.Assignment('h', (slot,)))
        self.assertIn('not backed by MIG 3g.20gb', str(err))

    def test_no_enabled_list_allows_every_type_of_the_model(self):
        host = fixtures.hgx_host('any', self.model_, gpus=1, mig=True)
        for name in NOT_ENABLED + (ENABLED,):
            self.assertTrue(self.engine.choices(host, vgpu(name)), name)

    def test_gpu_rule_is_shared_by_both_vgpu_kinds(self):
        gpu = self.host.gpus[0]
        profiles = self.model_.vgpu_profiles
        self.assertTrue(gpu.fits_vgpu(profiles[ENABLED]))
        self.assertFalse(gpu.fits_vgpu(profiles['A100-3-20C']))
        self.assertEqual((), gpu.vgpu_mig_starts(profiles['A100-3-20C']))
        self.assertEqual((0, 2, 4), gpu.vgpu_mig_starts(profiles[ENABLED]))
        # A MIG-backed type never counts as time-sliced room.
        self.assertEqual(0, H.Gpu(0, self.model_).vgpu_room(
            profiles[ENABLED]))


MIG_MODELS = [m for m in base.CATALOG.models.values() if m.mig]


class EnabledTypesPropertyTest(base.TestCase):
    """Every path agrees with ``Gpu.vgpu_enabled``, whatever is enabled."""

    @hypothesis.settings(max_examples=150, deadline=None, database=None)
    @hypothesis.given(st.data())
    def test_paths_agree_with_the_gpu_rule(self, data):
        model = data.draw(st.sampled_from(MIG_MODELS))
        names = sorted(model.vgpu_profiles)
        enabled = data.draw(st.lists(st.sampled_from(names), max_size=3,
                                     unique=True))
        gpu = H.Gpu(0, model, mig_enabled=data.draw(st.booleans()),
                    vgpu_types=enabled or None)
        host = H.Host('h', [gpu])
        engine = engine_mod.PlacementEngine()
        for name in names:
            profile = model.vgpu_profiles[name]
            r = vgpu(name)
            slots = frag.unit_slots(gpu, r)
            allowed = gpu.vgpu_enabled(profile)
            self.assertEqual(not enabled or name in enabled, allowed)
            if not allowed:
                self.assertEqual((), slots, name)
            self.assertEqual(bool(slots), frag.fit_checker(r)(gpu), name)
            self.assertEqual(bool(slots), gpu.fits_vgpu(profile), name)
            self.assertEqual(bool(slots), bool(engine.choices(host, r)),
                             name)
            self.assertEqual(bool(slots),
                             engine.evaluate(host, r, [0]) is not None, name)
            for slot in slots:
                vgpu_name = (slot.detail if slot.kind == H.VGPU
                             else slot.detail[2])
                self.assertEqual(name, vgpu_name)
                host.allocate(H.Assignment('h', (slot,)))
                host.free(H.Assignment('h', (slot,)))


def flavor_alts(specs):
    """The GpuRequests a flavor's gpu: keys become (core.flavor)."""
    return core_flavor.parse(dict(specs, **{'resources:VGPU': '1'}),
                             base.CATALOG).alternatives


class BareMigAsksTest(base.TestCase):
    """A bare MIG ask honours the vGPU types enabled on a GPU (issue 25, 4).

    On a GPU in MIG mode set up for A100-2-10C, Nova hands a guest the
    vGPU type the VF carries: ``gpu:mig=3g.20gb`` (or ``gpu:memory=12GB,
    gpu:kind=mig``) would get a 2g.10gb-backed 10 GiB vGPU. Every path
    decides with one rule, ``Gpu.serves_mig``.
    """

    def setUp(self):
        super().setUp()
        self.model_ = self.model('A100-40GB')
        self.host = fixtures.hgx_host('h', self.model_, gpus=2, mig=True,
                                      vgpu_types=[ENABLED])
        self.engine = engine_mod.PlacementEngine(frag.Demand([
            frag.DemandItem(R.GpuRequest(H.MIG, '3g.20gb'), 1),
            frag.DemandItem(vgpu(ENABLED), 1)]))

    def test_a_mig_size_no_enabled_type_backs_is_not_offered(self):
        for alts in (flavor_alts({'gpu:mig': '3g.20gb'}),
                     flavor_alts({'gpu:memory': '12GB', 'gpu:kind': 'mig'})):
            self.assertTrue(any('A100-40GB' in r.models for r in alts))
            for r in alts:
                self.assertEqual(H.MIG, r.kind)
                self.assertEqual([], self.engine.choices(self.host, r), r)
                self.assertEqual([], self.engine.rank(self.host, r), r)
                self.assertIsNone(self.engine.evaluate(self.host, r, [0]))
                err = self.assertRaises(exceptions.NoFit, self.engine.best,
                                        self.host, r)
                if 'A100-40GB' in r.models:
                    self.assertIn('0 of 2 GPUs can take a %s device'
                                  % r.profile, err.reason)
        # The size the enabled type backs is served, on both GPUs at
        # starts 0, 2 and 4; a GPU listing no types serves every size.
        (r,) = flavor_alts({'gpu:mig': '2g.10gb'})
        choices = self.engine.choices(self.host, r)
        self.assertEqual(6, len(choices))
        self.assertEqual({'2g.10gb'},
                         {p.slots[0].detail[0] for p in choices})
        host = fixtures.hgx_host('any', self.model_, gpus=1, mig=True)
        for name in self.model_.mig.profiles:
            self.assertTrue(self.engine.choices(
                host, R.GpuRequest(H.MIG, name)), name)

    def test_fragmentation_and_gpu_agree(self):
        gpu = self.host.gpus[0]
        r = R.GpuRequest(H.MIG, '3g.20gb')
        profile = self.model_.mig.profiles['3g.20gb']
        self.assertFalse(gpu.serves_mig(profile))
        self.assertFalse(gpu.fits_mig(profile))
        self.assertEqual((), gpu.mig_offers(profile))
        self.assertEqual((), frag.unit_slots(gpu, r))
        self.assertFalse(frag.fit_checker(r)(gpu))
        self.assertFalse(frag.host_fits(self.host, r))
        self.assertTrue(gpu.serves_mig(self.model_.mig.profiles['2g.10gb']))
        # No MIG mode, no MIG, whatever the types.
        self.assertFalse(H.Gpu(0, self.model_, vgpu_types=['A100-10C'])
                         .serves_mig(self.model_.mig.profiles['2g.10gb']))
        # What the GPU could make stays what it is: the agent's MIG
        # commands, the layout planner and report accounting read it. The
        # agent lists a MIG-backed vGPU's GPU instance as a bare mig
        # device; one of a type since disabled is still counted.
        self.assertEqual((0, 4), gpu.mig_starts(profile))
        gpu.take(H.Slot(0, H.MIG, ('3g.20gb', 4, None)))
        self.assertEqual((0, 2), gpu.mig_offers(
            self.model_.mig.profiles['2g.10gb']))

    def test_fragmentation_counts_what_the_bare_ask_cannot_use(self):
        demand = frag.Demand([frag.DemandItem(
            R.GpuRequest(H.MIG, '3g.20gb'), 1)])
        self.assertEqual(2000, frag.host_fragmentation(self.host, demand))


class BareMigPropertyTest(base.TestCase):
    """Bare MIG asks: every path agrees with ``Gpu.serves_mig``."""

    @hypothesis.settings(max_examples=150, deadline=None, database=None)
    @hypothesis.given(st.data())
    def test_paths_agree_with_the_gpu_rule(self, data):
        model = data.draw(st.sampled_from(MIG_MODELS))
        enabled = data.draw(st.lists(st.sampled_from(
            sorted(model.vgpu_profiles)), max_size=3, unique=True))
        gpu = H.Gpu(0, model, mig_enabled=data.draw(st.booleans()),
                    vgpu_types=enabled or None)
        host = H.Host('h', [gpu])
        engine = engine_mod.PlacementEngine()
        backing = {model.vgpu_profiles[n].mig_profile for n in enabled
                   if model.vgpu_profiles[n].mig_backed}
        for name, profile in model.mig.profiles.items():
            r = R.GpuRequest(H.MIG, name)
            served = gpu.mig_enabled and (not enabled or name in backing)
            self.assertEqual(served, gpu.serves_mig(profile), name)
            slots = frag.unit_slots(gpu, r)
            self.assertEqual(bool(slots), served and bool(
                gpu.mig_starts(profile)), name)
            self.assertEqual(bool(slots), frag.fit_checker(r)(gpu), name)
            self.assertEqual(bool(slots), gpu.fits_mig(profile), name)
            self.assertEqual(bool(slots), bool(engine.choices(host, r)),
                             name)
