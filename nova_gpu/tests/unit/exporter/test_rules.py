"""The Prometheus rules and Grafana dashboard shipped in etc/.

``promtool`` (Debian's prometheus package, bindep.txt) checks the rules
and runs their unit tests; every series the rules and the dashboard name
must be one the exporters actually emit, so a renamed metric fails here.
"""

import json
import os
import re
import shutil
import subprocess

import prometheus_client
import testtools

from nova_gpu.agent import host_metrics as host_exporter
from nova_gpu.agent import nvml as nvml_mod
from nova_gpu.core import catalog as catalog_mod
from nova_gpu.exporter import cloud
from nova_gpu.exporter import collector
from nova_gpu.exporter import idle_notices
from nova_gpu.exporter import usage
from nova_gpu import tests
from nova_gpu.tests.unit.exporter import test_cloud
from nova_gpu.tests.unit.exporter import test_host_exporter

ROOT = tests.REPO_ROOT
RULES_DIR = os.path.join(ROOT, 'etc', 'prometheus')
RULES = os.path.join(RULES_DIR, 'nova-gpu-rules.yaml')
RULE_TESTS = os.path.join(RULES_DIR, 'nova-gpu-rules.test.yaml')
DASHBOARD = os.path.join(ROOT, 'etc', 'grafana', 'nova-gpu.json')
PROMTOOL = shutil.which('promtool')
CATALOG = catalog_mod.load_catalog()
# nova_gpu_... names, without PromQL's recording-rule names (a colon)
NAME_RE = re.compile(r'\bnova_gpu_[a-z0-9_]+\b(?!:)')


def emitted_names():
    """Every series name the two exporters emit (samples included)."""
    host = host_exporter.HostCollector(
        'h', nvml_mod.Nvml(lib=test_host_exporter._lib()), CATALOG)
    cycle = test_host_exporter._cycle(
        {'errors': [], 'rolled_back': [], 'removed': [], 'waiting': []}, 0)
    # A GPU NVML cannot read, so that its series are emitted too.
    cycle['unreadable_gpus'] = [{'address': '0000:3b:00.0',
                                 'nvml_index': 1, 'reason': 'GPU is lost'}]
    host.observe(cycle, journal_intents=0)
    state = cloud.CloudState(CATALOG)
    report = test_cloud.mixed_report()
    # A quarantined GPU (core.health), so that its series is emitted too.
    report['gpus'][0]['health'] = {'quarantined': True, 'faults': [],
                                   'reason': 'Xid 48: double-bit ECC error'}
    # An idle guest device (core.idle), so that its series is emitted too.
    report['gpus'][0]['devices'] = [{
        'kind': 'mig', 'detail': ['3g.20gb', 0, None], 'instance': 's1',
        'idle': {'since': 0.0, 'seconds': 1800.0, 'peak_compute': 0.0,
                 'peak_memory_mib': 100.0, 'suggestion': '1g.5gb'}}]
    # Usage for billing and idle-owner notices, so that theirs are too.
    clock = test_cloud.Clock()
    state.clock = clock
    book = usage.UsageBook(projects=lambda server: 'p1', clock=clock)
    state.report_observers.append(book.observe)
    notices = idle_notices.IdleNotices(lambda: None, None)
    for generation in (1, 2):
        report = dict(report, generation=generation)
        state.ingest_report(report)
        clock.now += 60
    book.write()
    names = set()
    for c in (host, collector.CloudCollector(state, usage=book,
                                             idle_notices=notices)):
        registry = prometheus_client.CollectorRegistry()
        registry.register(c)
        for family in registry.collect():
            names.update(s.name for s in family.samples)
    return names


def names_in(text):
    return set(NAME_RE.findall(text)) - {'nova_gpu_'}


@testtools.skipUnless(PROMTOOL, 'promtool not installed (Debian package '
                      'prometheus, bindep.txt)')
class PromtoolTest(testtools.TestCase):

    def promtool(self, *args):
        proc = subprocess.run([PROMTOOL] + list(args), cwd=RULES_DIR,
                              capture_output=True, text=True, timeout=120)
        self.assertEqual(0, proc.returncode, proc.stdout + proc.stderr)
        return proc.stdout

    def test_check_rules(self):
        self.assertIn('SUCCESS', self.promtool('check', 'rules', RULES))

    def test_rule_unit_tests(self):
        self.assertIn('SUCCESS', self.promtool('test', 'rules', RULE_TESTS))


class NamesTest(testtools.TestCase):

    def test_rules_use_emitted_series(self):
        with open(RULES) as f:
            used = names_in(f.read())
        self.assertGreater(len(used), 10)
        self.assertEqual(set(), used - emitted_names())

    def test_every_emitted_series_is_documented(self):
        docs = ''
        for name in ('observability.rst', 'billing.rst'):
            with open(os.path.join(ROOT, 'doc', 'source', name)) as f:
                docs += f.read()
        shown = names_in(docs)
        missing = {n for n in emitted_names()
                   if re.sub(r'_(total|created)$', '', n) not in shown
                   and n not in shown}
        self.assertEqual(set(), missing)

    def test_dashboard_uses_emitted_series(self):
        with open(DASHBOARD) as f:
            dashboard = json.load(f)
        exprs = [t['expr'] for p in dashboard['panels']
                 for t in p.get('targets', ())]
        used = names_in('\n'.join(exprs))
        self.assertGreater(len(used), 15)
        # #27: GPU health, idle devices and usage per project are shown
        for name in ('nova_gpu_cloud_quarantined_gpus',
                     'nova_gpu_gpu_quarantined',
                     'nova_gpu_device_idle_seconds',
                     'nova_gpu_usage_gpu_seconds_total'):
            self.assertIn(name, used)
        self.assertEqual(set(), used - emitted_names())
        ids = [p['id'] for p in dashboard['panels']]
        self.assertEqual(len(ids), len(set(ids)))
