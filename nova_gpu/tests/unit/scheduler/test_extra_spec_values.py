"""Hostile and near-miss ``gpu:`` extra specs (issue 10, items 3 and 9).

Each case was accepted (or crashed) before: Unicode digits, underscores,
signs and surrounding whitespace went through int()/float(), sizes that
round to 0 MiB passed, and keys that differ from the namespace only by
case or spaces were ignored by the scheduler.
"""

from unittest import mock

import fixtures

from nova_gpu.core import flavor as grammar
from nova_gpu.scheduler import gpu_spec
from nova_gpu.tests.unit.scheduler import base


class ValueTest(base.TestCase):

    def refused(self, key, value, *words):
        err = self.assertRaises(grammar.ExtraSpecError,
                                gpu_spec.validate_value, key, value,
                                base.CATALOG)
        self.assertEqual(key, err.key)
        for word in words:
            self.assertIn(word, str(err))
        return err

    def test_count_is_ascii_digits_only(self):
        for value in ('\u0661\u0666',      # Arabic-Indic 16
                      '\u0968',            # Devanagari 2
                      '\uff12',            # fullwidth 2
                      '1_0', '+2', '-2', ' 2', '2 ', '2\n', '0x2', '2.0',
                      '', '\u00b2'):
            self.refused('gpu:count', value, 'gpu:count=')

    def set_limit(self, limit):
        """[gpu_scheduler] max_gpu_count."""
        self.conf.set_override('max_gpu_count', limit, 'gpu_scheduler')

    def test_count_bound_says_why(self):
        # 9 to 16 groups stall Placement (issue 10, item 3); up to 8 are
        # quick with the set traits (core.gpu_sets).
        self.assertEqual(8, gpu_spec.max_count())
        self.assertEqual(8, gpu_spec.validate_value('gpu:count', '8'))
        for value in ('0', '9', '16', '9' * 200):
            self.refused('gpu:count', value, 'from 1 to 8', 'Placement',
                         'max_gpu_count')

    def test_stored_flavor_above_the_limit_has_a_problem(self):
        # Flavors stored before the limit reach the scheduler: the filter
        # refuses them with the reason instead of serving them.
        items = tuple(sorted({'gpu:kind': 'whole', 'gpu:count': '12'}.items()))
        spec = gpu_spec.parse_cached(items, 2, 2048, base.CATALOG)
        self.assertEqual((), spec.alternatives)
        self.assertIn('gpu:count=12: must be an integer from 1 to 8',
                      spec.problem)

    def test_count_limit_raised_up_to_eight(self):
        self.set_limit(8)
        self.assertEqual(8, gpu_spec.validate_value('gpu:count', '8'))
        self.refused('gpu:count', '9', 'from 1 to 8')

    def test_count_limit_never_above_eight(self):
        # Even where the option is not range-checked.
        self.useFixture(fixtures.MockPatchObject(
            gpu_spec, 'CONF', mock.Mock(gpu_scheduler=mock.Mock(
                max_gpu_count=16))))
        self.assertEqual(8, gpu_spec.max_count())
        self.refused('gpu:count', '16', 'from 1 to 8')

    def test_memory_that_rounds_to_nothing(self):
        for value in ('0.0001GB', '0.5MB', '0.0000001TB', '0GB', '0.0MB'):
            self.refused('gpu:memory', value, 'gpu:memory=' + value)

    def test_memory_rounds_up_to_whole_mib(self):
        # "At least 10.1GB" must not be served by 10342 MiB.
        self.assertEqual(10343, gpu_spec.validate_value('gpu:memory',
                                                        '10.1GB'))
        self.assertEqual(2, gpu_spec.validate_value('gpu:memory', '1.5MB'))
        self.assertEqual(20480, gpu_spec.validate_value('gpu:memory',
                                                        '20 GiB'))

    def test_memory_numbers_are_ascii(self):
        for value in ('\u0661\u0666GB', '1_0GB', '+10GB', '1e3GB', 'infGB',
                      'nanGB', '10GB\n', ' 10GB', '10\u00a0GB', '.5GB',
                      '10', 'GB', '-1GB'):
            self.refused('gpu:memory', value)

    def test_memory_larger_than_any_gpu(self):
        self.refused('gpu:memory', '1000TB', 'no GPU in the catalog')
        self.refused('gpu:memory', '9' * 9 + 'TB', 'no GPU in the catalog')
        self.refused('gpu:memory', '9' * 200 + 'GB')

    def test_compute_numbers_are_ascii(self):
        for value in ('\u0660.\u0665', '0_5', '+0.5', 'nan', 'inf', '1e-1',
                      ' 0.5', '50 %', '0', '0%', '0.0', '1.0000001', '101%'):
            self.refused('gpu:compute', value)
        self.assertEqual(1, gpu_spec.validate_value('gpu:compute', '0.0001'))
        self.assertEqual(1000, gpu_spec.validate_value('gpu:compute', '100%'))

    def test_control_and_non_ascii_characters(self):
        for key, value in (('gpu:profile', 'A100-10C\x1c'),
                           ('gpu:profile', 'A100-10C\u3000'),
                           ('gpu:mig', '3g.40gb\x85'),
                           ('gpu:model', '\uff21100'),
                           ('gpu:topology', 'any\x00'),
                           ('gpu:kind', 'whole\u200b')):
            self.refused(key, value, 'not printable ASCII')

    def test_message_shows_invisible_values(self):
        err = self.refused('gpu:profile', 'A100-10C\x1c')
        self.assertIn(r"'A100-10C\x1c'", str(err))
        err = self.refused('gpu:kind', 'x' * 300)
        self.assertLess(len(str(err)), 200)

    def test_long_keys_named_in_full(self):
        key = 'gpu:' + 'x' * 251
        err = self.assertRaises(grammar.ExtraSpecError,
                                gpu_spec.validate_value, key, '1',
                                base.CATALOG)
        self.assertIn(key + '=1', str(err))

    def test_numbers_from_json_are_checked_as_text(self):
        self.assertEqual(2, gpu_spec.validate_value('gpu:count', 2))
        self.refused('gpu:count', 2.0)
        self.refused('gpu:count', float('inf'))
        self.refused('gpu:compute', float('nan'))


class NearMissKeyTest(base.TestCase):

    def test_namespace_near_misses_refused_naming_key(self):
        for key, meant in (('GPU:profile', 'gpu:profile'),
                           ('Gpu:count', 'gpu:count'),
                           (' gpu:profile', 'gpu:profile'),
                           ('gpu :count', 'gpu:count'),
                           ('gpu: count', 'gpu:count'),
                           ('gpu:Count', 'gpu:count'),
                           ('gpu:count ', 'gpu:count'),
                           ('gpu:MODEL', 'gpu:model')):
            err = self.assertRaises(grammar.ExtraSpecError,
                                    gpu_spec.validate_value, key, '2',
                                    base.CATALOG)
            self.assertEqual(key, err.key)
            self.assertIn(repr(key).strip("'") if key == key.strip()
                          else repr(key), str(err))
            self.assertIn('did you mean %s?' % meant, str(err))

    def test_unknown_name_in_near_namespace(self):
        err = self.assertRaises(grammar.ExtraSpecError,
                                gpu_spec.validate_value, 'GPU:colour', 'red',
                                base.CATALOG)
        self.assertIn('start with exactly "gpu:"', str(err))

    def test_near_miss(self):
        for key in ('GPU:profile', ' gpu:count', 'gpu :x', 'gpu:Count',
                    'gpu::count', 'gpu:'):
            self.assertTrue(grammar.near_miss(key), key)
        for key in ('gpu:count', 'gpu_count', 'gpus:count', 'hw:gpu',
                    'resources:VGPU', 'xgpu:count', 'gpu'):
            self.assertFalse(grammar.near_miss(key), key)

    def test_parse_refuses_near_misses_instead_of_ignoring(self):
        # Flavors stored before the validator (or below microversion
        # 2.86) reach the scheduler: they must not be read as stock vGPU
        # flavors, silently serving another type than asked.
        for key in ('GPU:profile', ' gpu:profile', 'gpu :profile',
                    'gpu:Profile'):
            err = self.assertRaises(grammar.ExtraSpecError, gpu_spec.parse,
                                    {key: 'A100-10C',
                                     'resources:VGPU': '1'}, base.CATALOG)
            self.assertIn('did you mean gpu:profile?', str(err))
            spec = gpu_spec.parse_cached(
                ((key, 'A100-10C'), ('resources:VGPU', '1')), 2, 2048,
                base.CATALOG)
            self.assertIn('gpu:profile', spec.problem)
            self.assertEqual((), spec.alternatives)

    def test_other_namespaces_untouched(self):
        spec = gpu_spec.parse({'gpu_model': 'a100', 'resources:VGPU': '1',
                               'aggregate_instance_extra_specs:gpu': 'yes'},
                              base.CATALOG)
        self.assertFalse(spec.explicit)


class MultiGpuPlacementTest(base.TestCase):

    def test_whole_gpus_are_one_pci_alias_count(self):
        # Whole GPUs are PCI devices in Placement (Nova publishes no PGPU):
        # Nova turns the alias count into one request group per device,
        # and each GPU is a provider of one, so 4 groups land on 4 GPUs.
        spec = gpu_spec.parse({'gpu:kind': 'whole', 'gpu:count': '4'},
                              base.CATALOG)
        self.assertEqual({'pci_passthrough:alias': ','.join(
            'nvidia-gpu-set4-%d:1' % k for k in range(4))},
            gpu_spec.placement_extra_specs(spec))
        spec = gpu_spec.parse({'gpu:kind': 'whole'}, base.CATALOG)
        self.assertEqual({'pci_passthrough:alias': 'nvidia-gpu:1'},
                         gpu_spec.placement_extra_specs(spec))

    def test_whole_alias_count_matches_the_count(self):
        specs = {'gpu:kind': 'whole', 'gpu:count': '2',
                 'pci_passthrough:alias': 'nvidia-gpu:2'}
        spec = gpu_spec.parse(specs, base.CATALOG)
        self.assertIsNone(spec.problem)
        self.assertEqual((2, 2), (spec.units, spec.groups))
        self.assertEqual('CUSTOM_NVIDIA_GPU', spec.resource_class)
        self.assertEqual(grammar.PATH_PASSTHROUGH, spec.path)
