"""A real Prometheus scrapes both exporters of a running cloud.

Host reports go through the agent's publisher, a scheduler refusal and a
placement through the scheduler's emitter, over a real RabbitMQ (the one
on 127.0.0.1:5672, else a private node; a topic of its own), to a
running nova-gpu-exporter; an agent-side exporter serves a host's GPUs
(NVML faked: there is no GPU here). Prometheus (Debian's package,
bindep.txt) runs on a free port of 127.0.0.1 with the shipped rules,
scrapes both every second, and its HTTP API must answer PromQL queries
with the figures nova-gpu computed.
"""

import json
import os
import shutil
import socket
import subprocess
import time
import types
import urllib.parse
import urllib.request
import uuid

import fixtures
from oslo_config import cfg
from oslo_config import fixture as config_fixture
import oslo_messaging as messaging
import testtools

from nova_gpu.agent import host_metrics as host_exporter
from nova_gpu.agent import nvml as nvml_mod
from nova_gpu.agent import publisher
from nova_gpu.core import catalog as catalog_mod
from nova_gpu.core import report as report_mod
from nova_gpu.exporter import cloud
from nova_gpu.exporter import service
from nova_gpu.scheduler import notifier as notifications
from nova_gpu import tests
from nova_gpu.tests.functional.agent import rabbit
from nova_gpu.tests.unit.exporter import test_cloud
from nova_gpu.tests.unit.exporter import test_host_exporter

PROMETHEUS = shutil.which('prometheus')
RULES = os.path.join(tests.REPO_ROOT, 'etc', 'prometheus',
                     'nova-gpu-rules.yaml')
CATALOG = catalog_mod.load_catalog()


def _free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


@testtools.skipUnless(PROMETHEUS, 'prometheus not installed (bindep.txt)')
class PrometheusScrapesExportersTest(testtools.TestCase):

    def setUp(self):
        super().setUp()
        self.tmp = self.useFixture(fixtures.TempDir()).path
        self.url = self.useFixture(rabbit.SharedOrPrivateRabbit()).url
        conf = self.useFixture(config_fixture.Config(cfg.CONF)).conf
        self.topic = 'nova_gpu_reports_prom_%s' % uuid.uuid4().hex[:8]
        conf.set_override('report_topic', self.topic, 'gpu_exporter')
        conf.set_override('report_topic', self.topic, 'gpu_scheduler')
        conf.set_override('listen', '127.0.0.1:0', 'gpu_exporter')
        conf.set_override('pool', 'prom-test-%s' % self.topic,
                          'gpu_exporter')
        # nova-scheduler's control exchange ("nova", where the agents
        # publish too); building a transport registers the option
        messaging.get_notification_transport(
            cfg.CONF, url=self.url).cleanup()
        conf.set_override('control_exchange', 'nova')
        self.transport = messaging.get_notification_transport(
            cfg.CONF, url=self.url)
        self.addCleanup(self.transport.cleanup)
        self.cloud = service.Exporter(cfg.CONF, transport=self.transport,
                                      catalog=CATALOG).start()
        self.addCleanup(self.cloud.stop)
        # the agent-side exporter of host "gpu-1"
        agent = types.SimpleNamespace(
            host='gpu-1', catalog=CATALOG, libvirt=None,
            nvml=nvml_mod.Nvml(lib=test_host_exporter._lib()),
            journal=types.SimpleNamespace(intents=lambda: {}))
        self.agent = host_exporter.MetricsServer(agent, '127.0.0.1', 0)
        self.addCleanup(self.agent.stop)
        self.agent.observe(test_host_exporter._cycle())
        self.prometheus = self.start_prometheus()

    def start_prometheus(self):
        port = _free_port()
        config = os.path.join(self.tmp, 'prometheus.yml')
        with open(config, 'w') as f:
            json.dump({  # JSON is YAML
                'global': {'scrape_interval': '1s',
                           'evaluation_interval': '1s'},
                'rule_files': [os.path.abspath(RULES)],
                'scrape_configs': [
                    {'job_name': 'nova-gpu-exporter', 'static_configs': [
                        {'targets': ['127.0.0.1:%d' % self.cloud.port]}]},
                    {'job_name': 'nova-gpu-agent', 'static_configs': [
                        {'targets': ['127.0.0.1:%d' % self.agent.port]}]},
                ]}, f)
        log = open(os.path.join(self.tmp, 'prometheus.log'), 'w')
        self.addCleanup(log.close)
        proc = subprocess.Popen(
            [PROMETHEUS, '--config.file=' + config,
             '--storage.tsdb.path=' + os.path.join(self.tmp, 'data'),
             '--web.listen-address=127.0.0.1:%d' % port],
            stdout=log, stderr=subprocess.STDOUT, cwd=self.tmp)

        def stop():
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.addCleanup(stop)
        url = 'http://127.0.0.1:%d' % port
        deadline = time.time() + 60
        while time.time() < deadline:
            if proc.poll() is not None:
                with open(os.path.join(self.tmp, 'prometheus.log')) as f:
                    self.fail('prometheus exited: %s' % f.read()[-2000:])
            try:
                with urllib.request.urlopen(url + '/-/ready', timeout=2):
                    return url
            except OSError:
                time.sleep(0.3)
        self.fail('prometheus not ready in 60 s')

    def query(self, promql):
        with urllib.request.urlopen('%s/api/v1/query?%s' % (
                self.prometheus, urllib.parse.urlencode({'query': promql})),
                timeout=10) as r:
            body = json.load(r)
        self.assertEqual('success', body['status'])
        return {tuple(sorted(s['metric'].items())): float(s['value'][1])
                for s in body['data']['result']}

    def wait_value(self, promql, expected, timeout=60):
        deadline = time.time() + timeout
        last = None
        while time.time() < deadline:
            last = self.query(promql)
            if len(last) == 1 and abs(list(last.values())[0]
                                      - expected) < 1e-9:
                return
            time.sleep(0.5)
        self.fail('%s: expected %s, Prometheus answers %s'
                  % (promql, expected, last))

    def test_promql_answers_with_the_plugins_figures(self):
        outbox = self.useFixture(fixtures.TempDir()).path
        pub = publisher.ReportPublisher(cfg.CONF, self.topic, outbox,
                                        url=self.url, exchange='nova')
        self.addCleanup(pub.close)
        busy = test_cloud.mixed_report(devices=test_cloud.BUSY)
        self.assertEqual(0, pub.publish(busy))
        self.assertEqual(0, pub.publish(test_cloud.mixed_report(
            name='gpu-2')))
        notifications.set_notifier(messaging.Notifier(
            self.transport, driver='messagingv2',
            publisher_id='nova-gpu-scheduler:test', topics=[self.topic]))
        self.addCleanup(notifications.set_notifier, None)
        self.assertTrue(notifications.refused(
            None, {'no_gpu_fits': 3, 'topology': 1}, 0))
        # What the scheduler sends once an instance is placed (its real
        # boot path: nova_gpu/tests/functional/scheduler/test_gpu_scheduling).
        self.assertTrue(notifications.placed(
            'gpu-1', [1], instance_uuid=str(uuid.uuid4()),
            slots=[(1, 'vgpu', 'L4-6C')], request='l4.6c',
            fragmentation_delta=0.25))

        # What the core computes for gpu-1, independently of the exporter
        parsed = report_mod.parse(busy, CATALOG)
        figures = cloud.host_figures(parsed.host,
                                     cloud.offered_requests(parsed))
        self.assertGreater(figures.fragmentation_milli, 0)

        self.wait_value('nova_gpu_host_fragmentation_gpus{host="gpu-1"}',
                        figures.fragmentation_milli / 1000)
        self.wait_value('nova_gpu_cloud_fragmentation_ratio',
                        figures.fragmentation_milli / 6000)
        self.wait_value('nova_gpu_cloud_free_devices{model="L4",'
                        'profile="L4-6C"}',
                        figures.free_devices[('L4', 'vgpu', 'L4-6C')] + 8)
        self.wait_value('nova_gpu_cloud_free_gpus', 4.75)
        self.wait_value('sum(nova_gpu_scheduler_refusals_total)', 4)
        self.wait_value('nova_gpu_scheduler_refusals_total{reason='
                        '"no_gpu_fits"}', 3)
        self.wait_value('nova_gpu_placements_total', 1)
        # the host exporter, and a recording rule of the shipped rules
        self.wait_value('nova_gpu_gpu_utilization_ratio{job="nova-gpu-agent"'
                        ',gpu="0"}', 0.87)
        self.wait_value('nova_gpu:host_gpu_utilization:avg{host="gpu-1"}',
                        (0.87 + 0.05) / 2)
        self.wait_value('nova_gpu_gpu_free_ratio{host="gpu-1",gpu="0"}',
                        0.25)
        self.assertEqual({}, self.query('nova_gpu_host_stale == 1'))
