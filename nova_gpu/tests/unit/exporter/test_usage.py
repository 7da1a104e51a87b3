"""Usage for billing in the exporter: ledger on disk, counters, /v1/usage."""

import json
import os
import types

import fixtures
import prometheus_client
from prometheus_client import parser
import testtools

from nova_gpu.core import usage as core_usage
from nova_gpu.exporter import api
from nova_gpu.exporter import cloud
from nova_gpu.exporter import collector
from nova_gpu.exporter import usage
from nova_gpu.tests.unit.exporter import test_cloud

CATALOG = test_cloud.CATALOG
S1 = '6f1c8d2e-0000-4000-8000-000000000001'


def report(generation, held=True):
    devices = {1: [{'kind': 'vgpu', 'detail': 'L4-6C', 'uuid': 'mdev-1',
                    'instance': S1}]} if held else None
    return test_cloud.mixed_report(generation=generation, devices=devices)


class Projects:
    def __init__(self, known):
        self.known = known
        self.asked = []

    def __call__(self, server):
        self.asked.append(server)
        return self.known.get(server)


class UsageBookTest(testtools.TestCase):

    def setUp(self):
        super().setUp()
        self.path = os.path.join(self.useFixture(fixtures.TempDir()).path,
                                 'usage.json')
        self.clock = test_cloud.Clock()
        self.clock.now = 1000.0
        self.projects = Projects({S1: 'project-a'})
        self.start_exporter()

    def start_exporter(self):
        self.state = cloud.CloudState(CATALOG, clock=self.clock)
        self.book = usage.UsageBook(self.path, max_interval=180,
                                    projects=self.projects,
                                    clock=self.clock)
        self.state.report_observers.append(self.book.observe)
        self.registry = prometheus_client.CollectorRegistry()
        self.registry.register(collector.CloudCollector(
            self.state, usage=self.book))
        self.app = api.Api(self.state, self.registry, 180, usage=self.book)

    def at(self, t, generation, held=True):
        self.clock.now = t
        self.state.ingest_report(report(generation, held))

    def samples(self, name):
        text = prometheus_client.generate_latest(self.registry).decode()
        return {tuple(sorted(s.labels.items())): s.value
                for f in parser.text_string_to_metric_families(text)
                for s in f.samples if s.name == name}

    def get(self, query):
        out = {}

        def start_response(status, headers):
            out['status'] = int(status.split()[0])
        body = self.app({'PATH_INFO': '/v1/usage', 'REQUEST_METHOD': 'GET',
                         'QUERY_STRING': query}, start_response)
        return out['status'], json.loads(b''.join(body))

    def test_counters_show_the_ledger_as_written(self):
        self.at(1000, 1)
        self.at(1060, 2)
        # not written yet: nothing served
        self.assertEqual({}, self.samples('nova_gpu_usage_gpu_seconds_total'))
        self.assertTrue(self.book.write())
        labels = (('model', 'L4'), ('profile', 'L4-6C'),
                  ('project_id', 'project-a'), ('server_id', S1))
        # L4-6C: 4 per L4, a quarter of it
        self.assertEqual({labels: 15.0}, self.samples(
            'nova_gpu_usage_gpu_seconds_total'))
        self.assertEqual({labels: 360.0}, self.samples(
            'nova_gpu_usage_framebuffer_gib_seconds_total'))
        self.assertEqual({labels: 60.0}, self.samples(
            'nova_gpu_usage_device_seconds_total'))
        self.assertEqual({(): 1060.0}, self.samples(
            'nova_gpu_usage_ledger_write_timestamp_seconds'))
        self.assertEqual({(('host', 'gpu-1'),): 0.0}, self.samples(
            'nova_gpu_usage_unattributed_devices'))

    def test_restart_resumes_from_the_file(self):
        self.at(1000, 1)
        self.at(1060, 2)
        self.book.write()
        # taken, never written: lost with the process
        self.at(1120, 3)
        self.start_exporter()
        self.assertEqual(60.0, self.book.published().totals[
            (S1, 'L4', 'L4-6C')].seconds)
        # the exporter was down 10 minutes; the guest kept its device
        self.at(1720, 4)
        self.at(1780, 5, held=False)
        self.book.write()
        self.assertEqual(780.0, self.book.published().totals[
            (S1, 'L4', 'L4-6C')].seconds)

    def test_unreadable_ledger_stops_the_exporter(self):
        with open(self.path, 'w') as f:
            f.write('{"version": 1, "views": ')
        e = self.assertRaises(core_usage.LedgerError, usage.UsageBook,
                              self.path)
        self.assertIn(self.path, str(e))
        self.assertIn('move it aside', str(e))

    def test_failed_write_keeps_what_was_served(self):
        log = self.useFixture(fixtures.FakeLogger())
        self.at(1000, 1)
        self.at(1060, 2)
        self.book.write()
        self.at(1120, 3)
        self.book.path = os.path.join(self.path, 'not-a-directory', 'x')
        self.assertFalse(self.book.write())
        self.assertIn('counters held at the last write', log.output)
        self.assertEqual(60.0, self.book.published().totals[
            (S1, 'L4', 'L4-6C')].seconds)

    def test_server_waits_for_its_project(self):
        self.projects.known = {}
        self.at(1000, 1)
        self.at(1060, 2)
        self.book.write()
        self.assertEqual({}, self.samples('nova_gpu_usage_gpu_seconds_total'))
        self.projects.known = {S1: 'project-a'}
        self.book.write()
        self.assertEqual([S1, S1], self.projects.asked)
        self.assertEqual(1, len(self.samples(
            'nova_gpu_usage_gpu_seconds_total')))

    def test_usage_api(self):
        self.at(1000, 1)
        self.at(1060, 2)
        self.at(1120, 3, held=False)
        self.book.write()
        status, body = self.get('project=project-a&start=1970-01-01T00:16:'
                                '40&end=1970-01-01T00:17:30%2B00:00')
        self.assertEqual(200, status)
        (row,) = body['usage']
        self.assertEqual(50.0, row['seconds'])
        self.assertEqual(12.5, row['gpu_seconds'])
        self.assertEqual('1970-01-01T00:16:40+00:00', row['first'])
        self.assertEqual('1970-01-01T00:17:30+00:00', row['last'])
        self.assertEqual('1970-01-01T00:16:40+00:00', body['ledger_since'])
        status, body = self.get('project=other&start=1970-01-01')
        self.assertEqual((200, []), (status, body['usage']))

    def test_usage_api_bad_input(self):
        for query, words in (
                ('', 'start is required'),
                ('start=yesterday', "start='yesterday' is not an ISO 8601"),
                ('start=1970-01-02&end=1970-01-01', 'must be after'),
                ('start=1970-01-01&start=1970-01-02', 'given 2 times'),
                ('start=1970-01-01&projet=p', 'unknown parameter projet')):
            status, body = self.get(query)
            self.assertEqual(400, status, query)
            self.assertIn(words, body['error'])


class NovaProjectsTest(testtools.TestCase):

    def conn(self, found=None, deleted=()):
        calls = []

        def find_server(name, ignore_missing=True, all_projects=False):
            calls.append(('find', name, all_projects))
            return found

        def servers(**query):
            calls.append(('list', query))
            return iter(deleted)
        return calls, types.SimpleNamespace(compute=types.SimpleNamespace(
            find_server=find_server, servers=servers))

    def test_project_of_a_server(self):
        calls, conn = self.conn(types.SimpleNamespace(project_id='p1'))
        self.assertEqual('p1', usage.NovaProjects(lambda: conn)(S1))
        self.assertEqual([('find', S1, True)], calls)

    def test_deleted_server(self):
        calls, conn = self.conn(None, [types.SimpleNamespace(
            project_id='p2')])
        self.assertEqual('p2', usage.NovaProjects(lambda: conn)(S1))
        self.assertEqual({'details': True, 'all_projects': True,
                          'deleted': True, 'uuid': S1}, calls[1][1])

    def test_nova_unreachable(self):
        def connect():
            raise OSError('no route to host')
        log = self.useFixture(fixtures.FakeLogger())
        projects = usage.NovaProjects(connect)
        self.assertIsNone(projects(S1))
        self.assertIsNone(projects(S1))
        # logged once a minute, not once a server
        self.assertEqual(1, log.output.count('no route to host'))


class ExporterWiringTest(testtools.TestCase):

    def test_options_make_the_book(self):
        from oslo_config import cfg
        from oslo_config import fixture as config_fixture

        from nova_gpu.exporter import service
        conf = self.useFixture(config_fixture.Config(cfg.CONF)).conf
        path = os.path.join(self.useFixture(fixtures.TempDir()).path,
                            'ledger.json')
        conf.set_override('usage_ledger', path, 'gpu_exporter')
        conf.set_override('usage_max_interval', 90, 'gpu_exporter')
        book = service.make_usage_book(cfg.CONF)
        self.assertEqual(path, book.path)
        self.assertEqual(90.0, book.ledger.max_interval)
        self.assertIsInstance(book.projects, usage.NovaProjects)
        conf.set_override('usage_ledger', '/nonexistent/dir/ledger.json',
                          'gpu_exporter')
        e = self.assertRaises(ValueError, service.make_usage_book, cfg.CONF)
        self.assertIn('directory does not exist', str(e))
