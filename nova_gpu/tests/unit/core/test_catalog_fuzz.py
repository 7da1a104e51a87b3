"""Random malformed catalog files: only CatalogError comes out.

Two kinds of input: arbitrary YAML structures, and a valid override file
with one value somewhere replaced by a random structure (the harder case:
the parser gets deep before it meets the bad value). Either the file loads,
or ``CatalogError`` names the file; nothing else may escape.
"""

import copy
import os
import tempfile

import hypothesis
from hypothesis import strategies as st
import yaml

from nova_gpu.core import catalog as catalog_mod
from nova_gpu.core import exceptions
from nova_gpu.tests.unit.core import base

SCALARS = (st.none() | st.booleans() | st.integers(-2 ** 70, 2 ** 70)
           | st.floats() | st.text(max_size=12)
           | st.sampled_from(['X1', '1g', 'A100', '20b0', 'mig-guide',
                              'sriov', 'A100-10C', '0', '']))
KEYS = st.sampled_from([
    'name', 'aliases', 'framebuffer_mib', 'vgpu_mode', 'mig', 'profiles',
    'starts', 'memory_slices', 'compute_slices', 'max_instances',
    'vgpu_profiles', 'mig_profile', 'pci_device_ids', 'nvml_names',
    'sources', 'models', 'schema_version', 'nvlink']) | st.text(max_size=6)
STRUCTURES = st.recursive(
    SCALARS, lambda inner: (st.lists(inner, max_size=4)
                            | st.dictionaries(KEYS, inner, max_size=4)),
    max_leaves=12)

GOOD = {
    'schema_version': 1,
    'sources': {'mine': 'my own measurements'},
    'models': [{
        'name': 'X1', 'framebuffer_mib': 16384, 'vgpu_mode': 'sriov',
        'aliases': ['X1-16GB'], 'pci_device_ids': ['ffe0'],
        'nvml_names': ['Example X1'], 'sources': ['mine'],
        'mig': {'memory_slices': 8, 'compute_slices': 7, 'profiles': [
            {'name': '1g', 'compute_slices': 1, 'memory_slices': 1,
             'framebuffer_mib': 2048, 'max_instances': 7,
             'starts': [0, 1, 2, 3, 4, 5, 6]}]},
        'vgpu_profiles': [
            {'name': 'X1-8C', 'framebuffer_mib': 8192, 'max_instances': 2},
            {'name': 'X1-1-2C', 'mig_profile': '1g'}]}],
}


def _paths(node, prefix=()):
    """Every (container path, key or index) in ``node``."""
    if isinstance(node, dict):
        items = node.items()
    elif isinstance(node, list):
        items = enumerate(node)
    else:
        return
    for key, value in items:
        yield prefix + (key,)
        yield from _paths(value, prefix + (key,))


PATHS = list(_paths(GOOD))


def _replace(doc, path, value):
    doc = copy.deepcopy(doc)
    node = doc
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return doc


class CatalogFuzzTest(base.TestCase):

    def setUp(self):
        super().setUp()
        fd, self.path = tempfile.mkstemp(suffix='.yaml')
        os.close(fd)
        self.addCleanup(os.unlink, self.path)

    def check(self, doc):
        with open(self.path, 'w') as f:
            yaml.safe_dump(doc, f)
        try:
            catalog_mod.load_catalog([self.path])
        except exceptions.CatalogError as e:
            self.assertIn(self.path, str(e))
            self.assertEqual(self.path, e.source)

    def test_good_file_loads(self):
        self.assertIn('X1', catalog_mod.load_catalog(
            [self._write(GOOD)]).models)

    def _write(self, doc):
        with open(self.path, 'w') as f:
            yaml.safe_dump(doc, f)
        return self.path

    @hypothesis.settings(max_examples=200, deadline=None, database=None)
    @hypothesis.given(STRUCTURES)
    def test_random_structures(self, doc):
        self.check(doc)

    @hypothesis.settings(max_examples=300, deadline=None, database=None)
    @hypothesis.given(st.sampled_from(PATHS), STRUCTURES)
    def test_one_value_replaced(self, path, value):
        self.check(_replace(GOOD, path, value))

    @hypothesis.settings(max_examples=200, deadline=None, database=None)
    @hypothesis.given(st.lists(st.sampled_from(PATHS), min_size=1,
                               max_size=4), st.lists(STRUCTURES, min_size=4,
                                                     max_size=4))
    def test_several_values_replaced(self, paths, values):
        doc = GOOD
        for path, value in zip(paths, values):
            try:
                doc = _replace(doc, path, value)
            except (KeyError, IndexError, TypeError):
                pass  # an earlier replacement removed that path
        self.check(doc)
