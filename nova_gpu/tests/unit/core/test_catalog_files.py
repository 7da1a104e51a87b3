"""Catalog files that are no files: refused where the core reads them.

The catalog is loaded by nova-scheduler and nova-api (the extra-spec
validator) as well as by nova-gpu's own programs, so the loader itself
must neither hang on a FIFO nor read ``/dev/zero`` until the memory ends.
"""

import os

import fixtures
import testtools

from nova_gpu.core import catalog as catalog_mod
from nova_gpu.core import exceptions


class CatalogFileTest(testtools.TestCase):

    def setUp(self):
        super().setUp()
        # The loader waited on a FIFO forever: a hang fails the test here.
        self.useFixture(fixtures.Timeout(10, gentle=True))
        self.dir = self.useFixture(fixtures.TempDir()).path

    def refused(self, path):
        err = self.assertRaises(exceptions.CatalogError,
                                catalog_mod.load_catalog, [path])
        self.assertEqual(path, err.source)
        return str(err)

    def test_fifo(self):
        fifo = os.path.join(self.dir, 'catalog.yaml')
        os.mkfifo(fifo)
        self.assertIn('not a regular file', self.refused(fifo))

    def test_device_and_directory(self):
        self.assertIn('not a regular file', self.refused('/dev/zero'))
        self.assertIn('not a regular file', self.refused(self.dir))

    def test_larger_than_a_catalog_may_be(self):
        path = os.path.join(self.dir, 'huge.yaml')
        with open(path, 'w') as f:
            f.write('# %s\n' % ('x' * 77) * (catalog_mod.MAX_FILE_BYTES // 80
                                             + 1))
        self.assertIn('larger than %d bytes' % catalog_mod.MAX_FILE_BYTES,
                      self.refused(path))
