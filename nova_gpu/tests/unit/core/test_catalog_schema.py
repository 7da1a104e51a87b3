"""The catalog schema at the file boundary (issue 10, item 4).

Malformed override files raise ``CatalogError`` naming the file, the entry
and the field, never AttributeError or TypeError; an override cannot take
over a name, alias, PCI id, NVML name or vGPU type of another model; MIG
start slices are a non-empty list of distinct integers.
"""

import os
import tempfile

import yaml

from nova_gpu.core import catalog as catalog_mod
from nova_gpu.core import exceptions
from nova_gpu.tests.unit.core import base

MIG = {'memory_slices': 8, 'compute_slices': 7, 'profiles': [
    {'name': '1g', 'compute_slices': 1, 'memory_slices': 1,
     'framebuffer_mib': 2048, 'max_instances': 7,
     'starts': [0, 1, 2, 3, 4, 5, 6]}]}


def model(**changes):
    raw = {'name': 'X1', 'framebuffer_mib': 16384, 'vgpu_mode': 'sriov',
           'aliases': ['X1-16GB'], 'pci_device_ids': ['ffe0'],
           'nvml_names': ['Example X1'], 'mig': MIG,
           'vgpu_profiles': [{'name': 'X1-8C', 'framebuffer_mib': 8192,
                              'max_instances': 2},
                             {'name': 'X1-1-2C', 'mig_profile': '1g'}]}
    raw.update(changes)
    return raw


def mig_profile(**changes):
    raw = dict(MIG['profiles'][0], **changes)
    return dict(MIG, profiles=[raw])


class CatalogSchemaTest(base.TestCase):

    def write(self, doc):
        fd, path = tempfile.mkstemp(suffix='.yaml')
        self.addCleanup(os.unlink, path)
        with os.fdopen(fd, 'w') as f:
            f.write(yaml.safe_dump(doc))
        return path

    def load(self, *models, **top):
        doc = {'schema_version': 1, 'models': list(models)}
        doc.update(top)
        return catalog_mod.load_catalog([self.write(doc)])

    def error(self, *models, **top):
        err = self.assertRaises(exceptions.CatalogError, self.load,
                                *models, **top)
        self.assertTrue(str(err).startswith(err.source), str(err))
        self.assertTrue(err.source.endswith('.yaml'), err.source)
        return err

    def test_good_model_loads(self):
        cat = self.load(model())
        x1 = cat.model('x1-16gb')
        self.assertEqual(2048, x1.vgpu_profile('X1-1-2C').framebuffer_mib)
        self.assertIs(x1, cat.model_for_pci('0xFFE0'))

    # -- wrong types that used to crash ----------------------------------

    def test_aliases_must_be_strings(self):
        for aliases in ([1], [None], [['a']], [{'a': 1}], 'X1-16GB'):
            err = self.error(model(aliases=aliases))
            self.assertEqual('X1', err.entry)
            self.assertTrue(err.field.startswith('aliases'), err.field)

    def test_nvml_names_must_be_strings(self):
        for names in ([3], [True], 'Example X1', {'a': 'b'}):
            err = self.error(model(nvml_names=names))
            self.assertTrue(err.field.startswith('nvml_names'), err.field)

    def test_sources_must_be_strings(self):
        for refs in ([['a']], [{'a': 1}], [1], 'mig-guide'):
            err = self.error(model(sources=refs))
            self.assertTrue(err.field.startswith('sources'), err.field)
        err = self.error(model(), sources=['not', 'a', 'mapping'])
        self.assertEqual('sources', err.field)

    def test_mig_profile_must_be_a_name(self):
        err = self.error(model(vgpu_profiles=[
            {'name': 'X1-1-2C', 'mig_profile': ['1g']}]))
        self.assertEqual('vgpu_profiles[X1-1-2C].mig_profile', err.field)
        self.assertIn("['1g']", str(err))

    def test_mig_backed_type_does_not_restate_its_size(self):
        err = self.error(model(vgpu_profiles=[
            {'name': 'X1-1-2C', 'mig_profile': '1g',
             'framebuffer_mib': 4096}]))
        self.assertEqual('vgpu_profiles[X1-1-2C].framebuffer_mib',
                         err.field)

    def test_pci_ids_are_quoted_hex(self):
        for ids in ([8368], ['20b'], ['xyzw'], ['20b0\n'], [None]):
            err = self.error(model(pci_device_ids=ids))
            self.assertEqual('pci_device_ids[0]', err.field)
        self.assertIn('quoted', str(err))

    def test_unknown_field_is_refused(self):
        err = self.error(model(max_instance=3))
        self.assertIn("'max_instance'", str(err))
        err = self.error(model(vgpu_profiles=[
            {'name': 'X1-8C', 'framebuffer_mib': 8192, 'max_instance': 2}]))
        self.assertEqual('vgpu_profiles[X1-8C]', err.field)

    def test_model_that_is_not_a_mapping(self):
        err = self.error(['X1'])
        self.assertEqual('models[0]', err.entry)
        self.assertIn('mapping', str(err))

    def test_bad_names(self):
        for name in ('', ' X1', 'X 1', 'X1\n', 7, None):
            err = self.error(model(name=name))
            self.assertEqual('name', err.field)

    # -- MIG starts ----------------------------------------------------

    def test_starts_must_be_distinct_integers(self):
        for starts, words in (([True], 'expected an integer'),
                              ([], 'must not be empty'),
                              ([0, 0], 'listed twice'),
                              ([0.5], 'expected an integer'),
                              ([-1], 'at least 0'),
                              ('0', 'expected a list'),
                              ([8], 'does not fit')):
            err = self.error(model(mig=mig_profile(starts=starts)))
            self.assertTrue(err.field.startswith('mig.profiles[1g].starts'),
                            err.field)
            self.assertIn(words, str(err))

    def test_more_instances_than_starts(self):
        err = self.error(model(mig=mig_profile(max_instances=8)))
        self.assertEqual('mig.profiles[1g].max_instances', err.field)

    # -- taking over what another model owns -----------------------------

    def test_new_model_cannot_take_a_shipped_identifier(self):
        for changes, field in (
                ({'aliases': ['A100']}, 'aliases'),
                ({'aliases': ['a100-40gb']}, 'aliases'),
                ({'name': 'a100'}, 'name'),
                ({'pci_device_ids': ['20B0']}, 'pci_device_ids'),
                ({'nvml_names': ['NVIDIA A100-SXM4-40GB']}, 'nvml_names'),
                ({'vgpu_profiles': [{'name': 'A100-10C',
                                     'framebuffer_mib': 8192,
                                     'max_instances': 2}]},
                 'vgpu_profiles')):
            err = self.error(model(**changes))
            self.assertEqual(field, err.field)
            self.assertIn('already belongs to model A100-40GB', str(err))

    def test_two_new_models_cannot_share_an_identifier(self):
        other = model(name='X2', aliases=[], pci_device_ids=[],
                      nvml_names=[], vgpu_profiles=[
                          {'name': 'X1-8C', 'framebuffer_mib': 8192,
                           'max_instances': 2}])
        err = self.error(model(), other)
        self.assertEqual('X2', err.entry)
        self.assertIn("'X1-8C' already belongs to model X1", str(err))

    def test_replacing_a_model_may_move_its_own_identifiers(self):
        shipped = self.model('T4')
        cat = self.load(model(name='T4', aliases=['Tesla-T4', 'T4-16GB'],
                              pci_device_ids=list(shipped.pci_device_ids),
                              nvml_names=list(shipped.nvml_names)))
        t4 = cat.model('T4-16GB')
        self.assertEqual('T4', t4.name)
        self.assertIs(t4, cat.model_for_pci('1eb8'))
        self.assertEqual(['X1-1-2C', 'X1-8C'], sorted(t4.vgpu_profiles))
        # What the replaced definition owned is free for others again.
        other = model(name='X2', aliases=[], pci_device_ids=[],
                      nvml_names=[], mig=None, vgpu_profiles=[
                          {'name': 'T4-16C', 'framebuffer_mib': 16384,
                           'max_instances': 1}])
        cat = self.load(model(name='T4', aliases=[], pci_device_ids=[],
                              nvml_names=[]), other)
        self.assertEqual('X2', cat.vgpu_profile('T4-16C')[0].name)

    def test_a_later_file_cannot_take_over_an_earlier_override(self):
        first = self.write({'schema_version': 1, 'models': [model()]})
        second = self.write({'schema_version': 1, 'models': [
            model(name='X2', pci_device_ids=[], nvml_names=[],
                  vgpu_profiles=[], mig=None)]})
        err = self.assertRaises(exceptions.CatalogError,
                                catalog_mod.load_catalog, [first, second])
        self.assertEqual(second, err.source)
        self.assertIn("'x1-16gb' already belongs to model X1 (%s)" % first,
                      str(err))

    # -- file level ------------------------------------------------------

    def test_not_utf8(self):
        fd, path = tempfile.mkstemp(suffix='.yaml')
        self.addCleanup(os.unlink, path)
        with os.fdopen(fd, 'wb') as f:
            f.write(b'schema_version: 1\nmodels: ["\xff\xfe"]\n')
        err = self.assertRaises(exceptions.CatalogError,
                                catalog_mod.load_catalog, [path])
        self.assertIn(path, str(err))

    def test_models_must_be_a_list(self):
        for models in (None, {'name': 'X1'}, 'X1'):
            err = self.assertRaises(
                exceptions.CatalogError, catalog_mod.load_catalog,
                [self.write({'schema_version': 1, 'models': models})])
            self.assertEqual('models', err.field)
