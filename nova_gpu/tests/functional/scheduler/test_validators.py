"""The API validators, through Nova's own validator registry and API."""

from nova.api.validation.extra_specs import validators
from nova import exception
from oslo_serialization import jsonutils

from nova_gpu.bench import reliability_specs
from nova_gpu.tests.harness import cloud
from nova_gpu.tests.unit.scheduler import base

# Keys that differ from the gpu: namespace only by case or spaces: Nova
# used to accept them unchecked (no validator, unknown namespace) and the
# scheduler ignored them.
NEAR_MISSES = ('GPU:profile', ' gpu:profile', 'gpu :count', 'gpu:Count',
               'Gpu:memory', 'gpu: count', 'gpu:count ', 'GPU :KIND')
# Values the old parsers took through int()/float(), or that round to 0.
HOSTILE = (('gpu:count', '\u0661\u0666'), ('gpu:count', '1_0'),
           ('gpu:count', '+2'), ('gpu:count', '9'), ('gpu:count', '16'),
           ('gpu:count', '0'),
           ('gpu:memory', '0.0001GB'), ('gpu:memory', '\u0661\u0666GB'),
           ('gpu:memory', '1_0GB'), ('gpu:memory', '1000TB'),
           ('gpu:compute', '\u0660.\u0665'), ('gpu:compute', 'nan'),
           ('gpu:profile', 'A100-10C\x1c'), ('gpu:rdma', 'True'),
           ('gpu:rdma', 'pcie-switch'), ('gpu:rdma', 'yes'))


class ValidatorTest(base.TestCase):

    def test_registered_through_the_entry_point(self):
        for key in ('gpu:profile', 'gpu:mig', 'gpu:count', 'gpu:model',
                    'gpu:topology', 'gpu:memory', 'gpu:compute',
                    'gpu:kind', 'gpu:rdma'):
            self.assertIn(key, validators.VALIDATORS)

    def test_bad_value_names_key_and_allowed(self):
        err = self.assertRaises(exception.ValidationError,
                                validators.validate, 'gpu:profile', 'NOPE')
        self.assertIn('gpu:profile=NOPE', str(err))
        self.assertIn('A100-10C', str(err))

    def test_unknown_key_in_namespace_refused(self):
        self.assertRaises(exception.ValidationError, validators.validate,
                          'gpu:colour', 'red')

    def test_good_values_pass(self):
        validators.validate('gpu:profile', 'A100-10C')
        validators.validate('gpu:model', 'H100-80GB,H200-141GB')
        validators.validate('gpu:topology', 'nvlink')
        validators.validate('gpu:count', '4')
        validators.validate('gpu:memory', '0.5GB')

    def test_near_miss_keys_refused_naming_the_key(self):
        for key in NEAR_MISSES:
            err = self.assertRaises(exception.ValidationError,
                                    validators.validate, key, '2')
            self.assertTrue(key in str(err) or repr(key) in str(err),
                            str(err))
            self.assertIn('did you mean gpu:', str(err))

    def test_hostile_values_refused_naming_the_key(self):
        for key, value in HOSTILE:
            err = self.assertRaises(exception.ValidationError,
                                    validators.validate, key, value)
            self.assertIn(key + '=', str(err))

    def test_other_keys_left_to_nova(self):
        # The near-miss pattern must not make a namespace of its own (Nova
        # splits every pattern at its first colon) nor catch other keys.
        self.assertFalse([ns for ns in validators.NAMESPACES
                          if 'gpu' in ns.lower() and ns != 'gpu'])
        validators.validate('gpus:count', '2')       # unknown namespace
        validators.validate('gpu_count', '2')        # no namespace
        validators.validate('aggregate_instance_extra_specs:gpu', 'x')
        err = self.assertRaises(exception.ValidationError,
                                validators.validate, 'hw:gpu', '1')
        self.assertIn("'hw:gpu' does not appear to be a valid", str(err))


class ApiTest(cloud.GpuCloudTestCase):
    """The real Nova API at microversion 2.86, where it validates."""

    def setUp(self):
        super().setUp()
        self.client = self.api_fixture.admin_api
        self.flavor_id = self._create_flavor()

    def post(self, key, value):
        old = self.client.microversion
        self.client.microversion = '2.86'
        try:
            return self.client.api_request(
                '/flavors/%s/os-extra_specs' % self.flavor_id,
                method='POST',
                body=jsonutils.dumps({'extra_specs': {key: value}}),
                headers={'Content-Type': 'application/json'})
        finally:
            self.client.microversion = old

    def test_near_misses_and_hostile_values_get_400_naming_the_key(self):
        for key, value in [(k, 'A100-10C') for k in NEAR_MISSES] + list(
                HOSTILE):
            response = self.post(key, value)
            self.assertEqual(400, response.status_code, (key, value))
            message = response.json()['badRequest']['message']
            self.assertTrue(reliability_specs._names_key(message, key),
                            message)
        self.assertEqual({}, self.client.api_get(
            '/flavors/%s/os-extra_specs' % self.flavor_id).body[
            'extra_specs'])

    def test_valid_specs_accepted(self):
        for key, value in (('gpu:profile', 'A100-10C'), ('gpu:count', '4'),
                           ('gpu:memory', '20GB'), ('gpu:compute', '25%'),
                           ('gpu:rdma', 'true')):
            self.assertEqual(200, self.post(key, value).status_code)

    def test_fuzzed_specs(self):
        """~300 fuzzed specs: the reliability figures, checked in CI."""
        tally = reliability_specs.Run(self.client, seed=10).run(300)
        self.assertEqual(300, tally.sent)
        self.assertEqual([], tally.failures)
        self.assertEqual(0, tally.bad)
        self.assertGreater(tally.accepted, 30)
        self.assertGreater(tally.refused, 100)
