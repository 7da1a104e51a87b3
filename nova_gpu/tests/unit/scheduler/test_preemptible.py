"""``gpu:preemptible``: spot flavors, validated like every gpu: key."""

from nova_gpu.bench import reliability_specs
from nova_gpu.core import host as host_mod
from nova_gpu.scheduler import flavor
from nova_gpu.tests.unit.scheduler import base


class PreemptibleKeyTest(base.TestCase):

    def test_true_and_false(self):
        self.assertIs(True, flavor.validate_value('gpu:preemptible', 'true',
                                                  base.CATALOG))
        self.assertIs(False, flavor.validate_value('gpu:preemptible',
                                                   'false', base.CATALOG))
        self.assertIn('gpu:preemptible', flavor.KEYS)

    def test_bad_values_refused_naming_the_key(self):
        for value in ('True', 'yes', '1', '', ' true', 'truee'):
            err = self.assertRaises(flavor.ExtraSpecError,
                                    flavor.validate_value, 'gpu:preemptible',
                                    value, base.CATALOG)
            self.assertIn('gpu:preemptible=', str(err))
            self.assertIn('allowed: true, false', str(err))

    def test_near_miss_key_refused(self):
        err = self.assertRaises(flavor.ExtraSpecError, flavor.validate_value,
                                'GPU:preemptible', 'true', base.CATALOG)
        self.assertIn('did you mean gpu:preemptible', str(err))

    def test_preemptible_of_a_flavor(self):
        self.assertFalse(flavor.preemptible({}))
        self.assertFalse(flavor.preemptible({'gpu:preemptible': 'false'}))
        self.assertTrue(flavor.preemptible({'gpu:preemptible': 'true',
                                            'resources:VGPU': '1'}))
        self.assertRaises(flavor.ExtraSpecError, flavor.preemptible,
                          {'gpu:preemptible': 'maybe'})

    def test_asks_no_device(self):
        # Alone it asks no GPU; on a stock flavor it changes nothing.
        self.assertIsNone(flavor.parse({'gpu:preemptible': 'true'},
                                       base.CATALOG))
        stock = flavor.parse({'resources:VGPU': '1'}, base.CATALOG)
        spot = flavor.parse({'resources:VGPU': '1',
                             'gpu:preemptible': 'true'}, base.CATALOG)
        self.assertEqual(stock, spot)
        self.assertFalse(spot.explicit)

    def test_with_gpu_keys_same_request(self):
        specs = {'gpu:profile': 'A100-10C', 'resources:VGPU': '1'}
        plain = flavor.parse(specs, base.CATALOG)
        spot = flavor.parse(dict(specs, **{'gpu:preemptible': 'true'}),
                            base.CATALOG)
        self.assertEqual(plain.alternatives, spot.alternatives)
        self.assertEqual(host_mod.VGPU, spot.alternatives[0].kind)
        self.assertIsNone(spot.problem)


class FuzzerKnowsTheKeyTest(base.TestCase):

    def test_grammar(self):
        self.assertFalse(reliability_specs.outside_grammar(
            'gpu:preemptible', 'true'))
        self.assertTrue(reliability_specs.outside_grammar(
            'gpu:preemptible', 'True'))

    def test_valid_values_drawn(self):
        fuzzer = reliability_specs.Fuzzer(1, base.CATALOG)
        values = {fuzzer._valid('preemptible') for _ in range(20)}
        self.assertEqual({'true', 'false'}, values)
        self.assertIn('preemptible', reliability_specs._NAMES)
