import os
import tempfile

import yaml

from nova_gpu.core import catalog as catalog_mod
from nova_gpu.core import exceptions
from nova_gpu.tests.unit.core import base

GOOD_MODEL = {
    'name': 'X1', 'framebuffer_mib': 16384, 'vgpu_mode': 'mdev',
    'vgpu_profiles': [{'name': 'X1-8C', 'framebuffer_mib': 8192,
                       'max_instances': 2}],
}


class CatalogFileTest(base.TestCase):

    def write(self, doc, raw=None):
        fd, path = tempfile.mkstemp(suffix='.yaml')
        self.addCleanup(os.unlink, path)
        with os.fdopen(fd, 'w') as f:
            f.write(raw if raw is not None else yaml.safe_dump(doc))
        return path

    def load_error(self, doc=None, raw=None):
        path = self.write(doc, raw)
        err = self.assertRaises(exceptions.CatalogError,
                                catalog_mod.load_catalog, [path])
        self.assertIn(path, str(err))
        return err

    def doc(self, **changes):
        model = dict(GOOD_MODEL, **changes)
        return {'schema_version': 1, 'models': [model]}

    def test_extra_file_adds_and_overrides(self):
        # T4 replaces the shipped T4 (same name): allowed, and it may
        # keep or drop what the shipped definition owned.
        t4 = dict(GOOD_MODEL, name='T4', framebuffer_mib=16384,
                  aliases=['Tesla-T4'], pci_device_ids=['1eb8'],
                  vgpu_profiles=[{'name': 'T4-8C', 'framebuffer_mib': 8192,
                                  'max_instances': 2}])
        path = self.write({'schema_version': 1, 'models': [GOOD_MODEL, t4]})
        cat = catalog_mod.load_catalog([path])
        self.assertEqual(['X1-8C'], sorted(cat.model('X1').vgpu_profiles))
        self.assertEqual(['T4-8C'], sorted(cat.model('T4').vgpu_profiles))
        self.assertIs(cat.model('T4'), cat.model('tesla-t4'))
        self.assertIs(cat.model('T4'), cat.model_for_pci('1eb8'))
        self.assertRaises(exceptions.UnknownProfile, cat.vgpu_profile,
                          'T4-16C')
        self.assertIn('A100-40GB', cat.models)

    def test_not_yaml(self):
        err = self.load_error(raw='models: [unclosed')
        self.assertIn('not valid YAML', str(err))

    def test_missing_file(self):
        err = self.assertRaises(exceptions.CatalogError,
                                catalog_mod.load_catalog, ['/nonexistent.y'])
        self.assertIn('/nonexistent.y', str(err))
        self.assertIn('cannot read', str(err))

    def test_wrong_schema_version(self):
        err = self.load_error({'schema_version': 7, 'models': []})
        self.assertEqual('schema_version', err.field)

    def test_missing_field_names_entry_and_field(self):
        doc = self.doc()
        del doc['models'][0]['framebuffer_mib']
        err = self.load_error(doc)
        self.assertEqual('X1', err.entry)
        self.assertEqual('framebuffer_mib', err.field)
        self.assertIn('required', str(err))

    def test_wrong_type(self):
        err = self.load_error(self.doc(framebuffer_mib='lots'))
        self.assertEqual('framebuffer_mib', err.field)
        self.assertIn("'lots'", str(err))

    def test_bool_is_not_an_int(self):
        err = self.load_error(self.doc(framebuffer_mib=True))
        self.assertEqual('framebuffer_mib', err.field)

    def test_bad_vgpu_mode(self):
        err = self.load_error(self.doc(vgpu_mode='magic'))
        self.assertEqual('vgpu_mode', err.field)

    def test_overcommitting_profile(self):
        err = self.load_error(self.doc(vgpu_profiles=[
            {'name': 'X1-8C', 'framebuffer_mib': 8192, 'max_instances': 3}]))
        self.assertEqual('vgpu_profiles[X1-8C]', err.field)
        self.assertIn('exceed', str(err))

    def test_profile_field_is_named(self):
        err = self.load_error(self.doc(vgpu_profiles=[
            {'name': 'X1-8C', 'framebuffer_mib': 8192}]))
        self.assertEqual('vgpu_profiles[X1-8C].max_instances', err.field)

    def test_mig_start_out_of_range(self):
        mig = {'memory_slices': 8, 'compute_slices': 7, 'profiles': [
            {'name': '4g', 'compute_slices': 4, 'memory_slices': 4,
             'framebuffer_mib': 8192, 'max_instances': 1, 'starts': [6]}]}
        err = self.load_error(self.doc(mig=mig))
        self.assertEqual('mig.profiles[4g].starts', err.field)

    def test_mig_backed_profile_needs_mig(self):
        err = self.load_error(self.doc(vgpu_profiles=[
            {'name': 'X1-1-5C', 'mig_profile': '1g.5gb'}]))
        self.assertIn('mig_profile', err.field)

    def test_unknown_source(self):
        err = self.load_error(self.doc(sources=['nowhere']))
        self.assertEqual('sources', err.field)

    def test_duplicate_model(self):
        err = self.load_error({'schema_version': 1,
                               'models': [GOOD_MODEL, GOOD_MODEL]})
        self.assertIn('twice', str(err))


class CatalogLookupTest(base.TestCase):

    def test_alias_pci_and_nvml(self):
        a100 = self.model('A100-40GB')
        self.assertIs(a100, self.catalog.model('a100'))
        self.assertIs(a100, self.catalog.model_for_pci('0x20B0'))
        self.assertIs(a100, self.catalog.model_for_nvml_name(
            'NVIDIA A100-SXM4-40GB'))
        self.assertIsNone(self.catalog.model_for_pci('ffff'))

    def test_unknown_model_lists_known(self):
        err = self.assertRaises(exceptions.UnknownModel, self.catalog.model,
                                'B9000')
        self.assertIn("'B9000'", str(err))
        self.assertIn('A100-40GB', str(err))

    def test_unknown_profile(self):
        err = self.assertRaises(exceptions.UnknownProfile,
                                self.catalog.vgpu_profile, 'NOPE')
        self.assertIn("'NOPE'", str(err))
        err = self.assertRaises(exceptions.UnknownProfile,
                                self.model('T4').mig_profile, '1g.5gb')
        self.assertIn('MIG on T4', str(err))

    def test_profile_owner(self):
        model, profile = self.catalog.vgpu_profile('A100-3-20C')
        self.assertEqual('A100-40GB', model.name)
        self.assertEqual('3g.20gb', profile.mig_profile)
        self.assertTrue(profile.mig_backed)
