"""The scheduler's glue around the core grammar: ``[gpu_scheduler]`` and
``[gpu] catalog_files``. The grammar itself:
nova_gpu/tests/unit/core/test_flavor.py.
"""

from nova_gpu.core import flavor as core_flavor
from nova_gpu.scheduler import gpu_spec
from nova_gpu.tests.unit.scheduler import base


def parse(**specs):
    return gpu_spec.parse({k.replace('__', ':'): v for k, v in specs.items()},
                          base.CATALOG, vcpus=4, memory_mb=8192)


class GlueTest(base.TestCase):

    def test_defaults_are_the_catalog_and_the_options(self):
        self.assertEqual(20480, gpu_spec.validate_value('gpu:memory', '20GB'))
        spec = gpu_spec.parse({'gpu:profile': 'A100-10C'})
        self.assertEqual('A100-10C', spec.alternatives[0].profile)
        self.assertEqual({'resources:VGPU': '1'},
                         gpu_spec.placement_extra_specs(spec))
        self.assertEqual({'resources:CUSTOM_X': '1'},
                         gpu_spec.placement_extra_specs(spec, 'CUSTOM_X'))

    def test_names_from_conf(self):
        self.conf.set_override('max_gpu_count', 6, 'gpu_scheduler')
        self.conf.set_override('vfio_vgpu_alias', 'vf', 'gpu_scheduler')
        names = gpu_spec.PathNames.from_conf(whole_rc='CUSTOM_W')
        self.assertIsInstance(names, core_flavor.PathNames)
        self.assertEqual((6, 'vf', 'CUSTOM_W', 'VGPU'),
                         (names.max_gpu_count, names.vfio_alias,
                          names.whole_rc, names.vgpu_rc))
        self.assertEqual(6, gpu_spec.max_count())

    def test_the_core_grammar_re_exported(self):
        self.assertIs(core_flavor.ExtraSpecError, core_flavor.ExtraSpecError)
        self.assertIs(core_flavor.GpuSpec, core_flavor.GpuSpec)
        self.assertEqual(core_flavor.KEYS, core_flavor.KEYS)
        self.assertIs(core_flavor.preemptible, core_flavor.preemptible)


class PathTest(base.TestCase):
    """The paths' names come from ``[gpu_scheduler]``."""

    def test_backend_default_from_conf(self):
        self.conf.set_override('vgpu_backend', 'vfio', 'gpu_scheduler')
        spec = parse(gpu__profile='H100-20C')
        self.assertEqual(core_flavor.PATH_VFIO, spec.path)
        # Keys already on the flavor say which path it was made for.
        spec = parse(gpu__profile='H100-20C', resources__VGPU='1')
        self.assertEqual(core_flavor.PATH_MDEV, spec.path)
        self.assertIsNone(spec.problem)

    def test_alias_names_from_conf(self):
        self.conf.set_override('whole_gpu_alias', 'gpu-pt', 'gpu_scheduler')
        spec = parse(gpu__kind='whole')
        self.assertEqual({'pci_passthrough:alias': 'gpu-pt:1'},
                         gpu_spec.placement_extra_specs(spec))

    def test_cached_parse_follows_conf(self):
        items = (('gpu:profile', 'H100-20C'),)
        spec = gpu_spec.parse_cached(items, 2, 2048, base.CATALOG)
        self.assertEqual(core_flavor.PATH_MDEV, spec.path)
        self.conf.set_override('vgpu_backend', 'vfio', 'gpu_scheduler')
        spec = gpu_spec.parse_cached(items, 2, 2048, base.CATALOG)
        self.assertEqual(core_flavor.PATH_VFIO, spec.path)
