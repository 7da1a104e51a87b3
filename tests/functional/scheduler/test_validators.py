"""The API validators, through Nova's own validator registry."""

from nova.api.validation.extra_specs import validators
from nova import exception

from tests.unit.scheduler import base


class ValidatorTest(base.TestCase):

    def test_registered_through_the_entry_point(self):
        for key in ('gpu:profile', 'gpu:mig', 'gpu:count', 'gpu:model',
                    'gpu:topology', 'gpu:memory', 'gpu:compute',
                    'gpu:kind'):
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
