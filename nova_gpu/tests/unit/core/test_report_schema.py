"""The JSON Schema of a GPU report (core.report_schema)."""

import copy

import jsonschema
import testtools

from nova_gpu.core import report
from nova_gpu.core import report_schema
from nova_gpu.tests.unit.core import base
from nova_gpu.tests.unit.core import test_report


class SchemaTest(testtools.TestCase):

    def test_schemas_are_valid_draft_2020_12(self):
        for schema in (report_schema.HEADER, report_schema.LISTS,
                       *report_schema.REPORTS.values()):
            jsonschema.Draft202012Validator.check_schema(schema)

    def test_paths_are_the_parsers(self):
        self.assertEqual('report', report_schema.path([]))
        self.assertEqual('gpus[0].providers[1].name', report_schema.path(
            ['gpus', 0, 'providers', 1, 'name']))

    def test_integers_are_strict(self):
        # JSON Schema takes 1.0 for an integer; the report does not.
        for value, problem in ((1.0, 'must be an integer, got float'),
                               (True, 'must be an integer, got bool'),
                               (float('nan'),
                                'must be a finite integer, got nan')):
            self.assertEqual(('generation', problem), report_schema.
                             first_error({'version': 2, 'host': 'h',
                                          'generation': value},
                                         report_schema.HEADER))


class ValidCacheTest(base.TestCase):

    def test_a_gpu_entry_found_valid_hides_no_fault(self):
        data = test_report._v2(self.catalog)
        report.parse(data, self.catalog)
        bad = copy.deepcopy(data)
        bad['gpus'][2]['providers'][0]['vfs'].append('nope')
        err = self.assertRaises(report.ReportError, report.parse, bad,
                                self.catalog)
        self.assertEqual('gpus[2].providers[0].vfs[2]', err.field)
        # Refused again: a bad entry is never taken for a valid one.
        err = self.assertRaises(report.ReportError, report.parse, bad,
                                self.catalog)
        self.assertEqual('gpus[2].providers[0].vfs[2]', err.field)
        # The same entry under another version is checked again.
        v1 = copy.deepcopy(data)
        v1['version'] = 1
        v1['gpus'][0]['provider'] = 7
        err = self.assertRaises(report.ReportError, report.parse, v1,
                                self.catalog)
        self.assertEqual('gpus[0].provider', err.field)
