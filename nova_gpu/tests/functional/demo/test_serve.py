"""The served demo cloud, driven by the real ``openstack`` command.

``python -m nova_gpu.demo.serve`` runs in its own process (as
``tools/run-demo.sh --serve`` runs it) with two of the demo's hosts; the
test then runs python-openstackclient as a subprocess against the
clouds.yaml it wrote, as a user would from another terminal, and stops
it with SIGTERM.
"""

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

import fixtures
import testtools
import yaml

from nova_gpu.demo import serve

START_TIMEOUT = 180   # a loaded CI machine; about 10 s on a quiet one
COMMAND_TIMEOUT = 90
HOSTS = ('h100-1', 't4-1')


class ServeTest(testtools.TestCase):

    def setUp(self):
        super().setUp()
        self.useFixture(fixtures.Timeout(600, gentle=True))
        bindir = os.path.dirname(sys.executable)
        self.openstack_bin = os.path.join(bindir, 'openstack')
        if not os.access(self.openstack_bin, os.X_OK):
            self.fail('%s not found: python-openstackclient is in '
                      'functional-requirements.txt' % self.openstack_bin)
        tmp = self.useFixture(fixtures.TempDir()).path
        self.clouds_yaml = os.path.join(tmp, 'clouds.yaml')
        self.log_path = os.path.join(tmp, 'serve.log')
        # Nothing of the caller's own cloud may leak in.
        env = {k: v for k, v in os.environ.items()
               if not k.startswith('OS_') or k.startswith('OS_TEST')
               or k == 'OS_NOVA_DISABLE_EVENTLET_PATCHING'}
        self.server_env = env
        self.client_env = dict(env, OS_CLIENT_CONFIG_FILE=self.clouds_yaml,
                               OS_CLOUD='nova-gpu-demo')
        cmd = [sys.executable, '-m', 'nova_gpu.demo.serve',
               '--clouds-yaml', self.clouds_yaml, '--report-interval', '0.5']
        for host in HOSTS:
            cmd += ['--host', host]
        self.log = open(self.log_path, 'wb')
        self.addCleanup(self.log.close)
        self.proc = subprocess.Popen(cmd, stdout=self.log,
                                     stderr=subprocess.STDOUT, env=env)
        self.addCleanup(self._kill)
        self._wait_ready()

    def _log_tail(self, chars=4000):
        with open(self.log_path, 'rb') as f:
            return f.read().decode(errors='replace')[-chars:]

    def _kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)

    def _wait_ready(self):
        deadline = time.monotonic() + START_TIMEOUT
        while not os.path.exists(self.clouds_yaml):
            if self.proc.poll() is not None:
                self.fail('the demo server exited (%s) before serving:\n%s'
                          % (self.proc.returncode, self._log_tail()))
            if time.monotonic() > deadline:
                self.fail('no clouds.yaml after %d s:\n%s'
                          % (START_TIMEOUT, self._log_tail()))
            time.sleep(0.2)

    def openstack(self, *args, expect_ok=True):
        """Run ``openstack ARGS``; (return code, stdout, stderr)."""
        result = subprocess.run(
            [self.openstack_bin] + list(args), env=self.client_env,
            capture_output=True, text=True, timeout=COMMAND_TIMEOUT)
        if expect_ok and result.returncode != 0:
            self.fail('openstack %s failed (%d):\n%s\n%s\nserver log:\n%s'
                      % (' '.join(args), result.returncode, result.stdout,
                         result.stderr, self._log_tail()))
        return result.returncode, result.stdout, result.stderr

    def json_of(self, *args):
        return json.loads(self.openstack(*(args + ('-f', 'json')))[1])

    def cloud(self):
        with open(self.clouds_yaml) as f:
            return yaml.safe_load(f)['clouds']['nova-gpu-demo']

    def compute(self, method, path, body=None):
        """Call the demo's compute API as its admin; the JSON reply."""
        cloud = self.cloud()
        request = urllib.request.Request(
            cloud['compute_endpoint_override'] + path, method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={'X-Auth-Token': cloud['auth']['token'],
                     'Content-Type': 'application/json',
                     'OpenStack-API-Version': 'compute %s'
                     % cloud['compute_api_version']})
        with urllib.request.urlopen(request, timeout=COMMAND_TIMEOUT) as r:
            return json.load(r)

    def metric(self, name, labels=''):
        """A sample of the demo exporter's /metrics (0 when absent)."""
        url = self.cloud()['gpu_exporter_url']
        with urllib.request.urlopen(url + '/metrics', timeout=10) as r:
            text = r.read().decode()
        wanted = name + ('{%s}' % labels if labels else '')
        for line in text.splitlines():
            key, _sep, value = line.rpartition(' ')
            if key == wanted:
                return float(value)
        return 0

    def free(self, profile):
        rows = self.json_of('gpu', 'capacity', '--profile', profile)
        return sum(r['Free'] for r in rows)

    def test_openstack_client_drives_the_demo(self):
        names = {f['Name'] for f in self.json_of('flavor', 'list')}
        self.assertTrue({'gpu.20g', 'h100.40c', 't4.8c'} <= names, names)

        # The API's extra spec validator is nova-gpu's: a bad gpu: value
        # is refused with its message, a good one is kept.
        rc, _out, err = self.openstack(
            'flavor', 'set', '--property', 'gpu:memory=lots', 'gpu.20g',
            expect_ok=False)
        self.assertNotEqual(0, rc)
        self.assertIn('gpu:memory=lots: expected a positive size with a '
                      'unit', err)
        self.openstack('flavor', 'set', '--property', 'gpu:topology=nvlink',
                       'h100.40c.x4')
        specs = self.json_of('flavor', 'show', 'h100.40c.x4')['properties']
        self.assertEqual('nvlink', specs['gpu:topology'])
        self.assertEqual('20GB', self.json_of(
            'flavor', 'show', 'gpu.20g')['properties']['gpu:memory'])

        # Two VFs of H100-40C on each of h100-1's 8 GPUs.
        self.assertEqual(16, self.free('H100-40C'))

        server = self.json_of(
            'server', 'create', '--flavor', 'gpu.20g', '--image',
            'nova-gpu-demo', '--no-network', '--wait', 'vm1')
        self.assertEqual('ACTIVE', server['status'])
        self.assertEqual('h100-1', server['OS-EXT-SRV-ATTR:host'])

        (listed,) = self.json_of('server', 'list')
        self.assertEqual(('vm1', 'ACTIVE', 'nova-gpu-demo', 'gpu.20g'),
                         (listed['Name'], listed['Status'], listed['Image'],
                          listed['Flavor']))

        # The exporter counts the VF taken once the stand-in agent has
        # reported the new device (every 0.5 s here).
        deadline = time.monotonic() + 30
        while self.free('H100-40C') != 15:
            self.assertLess(time.monotonic(), deadline,
                            'gpu capacity never showed the VF taken')
            time.sleep(0.5)
        capacity = self.json_of('gpu', 'capacity')
        self.assertIn({'Model': 'T4', 'Kind': 'vgpu', 'Profile': 'T4-8C',
                       'Free': 4, 'Hosts': 1}, capacity)

        # Nova, Placement and the exporter together: which GPU it got.
        shown = self.json_of('gpu', 'server', 'show', 'vm1')
        (device,) = shown['GPU Devices']
        self.assertEqual(('h100-1', 'H100-40C'),
                         (device['host'], device['vgpu_type']))

        # The scheduler's notifications reach the demo's exporter: the
        # placement of vm1, and a request GpuFilter refuses (no A100 here;
        # t4-1 offers a VGPU, of the wrong model).
        self.assertEqual(1, self.metric('nova_gpu_placements_total'))
        # Through the compute API directly: a second ``openstack`` process
        # would cost this test seconds of start-up for nothing it checks.
        flavors = self.compute('GET', '/flavors')['flavors']
        (flavor_id,) = [f['id'] for f in flavors if f['name'] == 'a100.mig']
        self.compute('POST', '/servers', {'server': {
            'name': 'vm2', 'imageRef': serve.IMAGE_ID,
            'flavorRef': flavor_id, 'networks': 'none'}})
        deadline = time.monotonic() + 30
        while not self.metric('nova_gpu_scheduler_refusals_total',
                              'reason="gpu_model"'):
            self.assertLess(time.monotonic(), deadline,
                            'the exporter never counted the refusal')
            time.sleep(0.5)
        self.assertEqual(1, self.metric('nova_gpu_placements_total'))

        # SIGTERM stops the cloud cleanly and takes the clouds.yaml away.
        self.proc.send_signal(signal.SIGTERM)
        self.assertEqual(0, self.proc.wait(60), self._log_tail())
        self.assertFalse(os.path.exists(self.clouds_yaml))
