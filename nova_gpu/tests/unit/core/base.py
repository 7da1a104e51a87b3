"""Shared helpers for the core unit tests."""

import testtools

from nova_gpu.core import catalog as catalog_mod

CATALOG = catalog_mod.load_catalog()


class TestCase(testtools.TestCase):
    catalog = CATALOG

    def model(self, name):
        return self.catalog.model(name)
