"""``gpu:preemptible``: spot flavors, validated like every gpu: key."""

from nova_gpu.bench import reliability_specs
from nova_gpu.core import flavor as grammar
from nova_gpu.core import host as host_mod
from nova_gpu.scheduler import gpu_spec
from nova_gpu.tests.unit.scheduler import base


class PreemptibleKeyTest(base.TestCase):

    def test_true_and_false(self):
        self.assertIs(True, gpu_spec.validate_value('gpu:preemptible', 'true',
                                                    base.CATALOG))
        self.assertIs(False, gpu_spec.validate_value('gpu:preemptible',
                                                     'false', base.CATALOG))
        self.assertIn('gpu:preemptible', grammar.KEYS)

    def test_bad_values_refused_naming_the_key(self):
        for value in ('True', 'yes', '1', '', ' true', 'truee'):
            err = self.assertRaises(grammar.ExtraSpecError,
                                    gpu_spec.validate_value, 'gpu:preemptible',
                                    value, base.CATALOG)
            self.assertIn('gpu:preemptible=', str(err))
            self.assertIn('allowed: true, false', str(err))

    def test_near_miss_key_refused(self):
        err = self.assertRaises(grammar.ExtraSpecError,
                                gpu_spec.validate_value, 'GPU:preemptible',
                                'true', base.CATALOG)
        self.assertIn('did you mean gpu:preemptible', str(err))

    def test_preemptible_of_a_flavor(self):
        self.assertFalse(grammar.preemptible({}))
        self.assertFalse(grammar.preemptible({'gpu:preemptible': 'false'}))
        self.assertTrue(grammar.preemptible({'gpu:preemptible': 'true',
                                            'resources:VGPU': '1'}))
        self.assertRaises(grammar.ExtraSpecError, grammar.preemptible,
                          {'gpu:preemptible': 'maybe'})

    def test_asks_no_device(self):
        # Alone it asks no GPU; on a stock flavor it changes nothing.
        self.assertIsNone(gpu_spec.parse({'gpu:preemptible': 'true'},
                                         base.CATALOG))
        stock = gpu_spec.parse({'resources:VGPU': '1'}, base.CATALOG)
        spot = gpu_spec.parse({'resources:VGPU': '1',
                               'gpu:preemptible': 'true'}, base.CATALOG)
        self.assertEqual(stock, spot)
        self.assertFalse(spot.explicit)

    def test_with_gpu_keys_same_request(self):
        specs = {'gpu:profile': 'A100-10C', 'resources:VGPU': '1'}
        plain = gpu_spec.parse(specs, base.CATALOG)
        spot = gpu_spec.parse(dict(specs, **{'gpu:preemptible': 'true'}),
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
