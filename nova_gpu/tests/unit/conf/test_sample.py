import io
import os

from oslo_config import generator
import testtools

from nova_gpu import tests

ROOT = tests.REPO_ROOT


class ConfigSampleTest(testtools.TestCase):
    """etc/nova-gpu.conf.sample must match the options in the code."""

    def test_sample_is_current(self):
        conf = generator.cfg.ConfigOpts()
        generator.register_cli_opts(conf)
        conf(['--config-file',
              os.path.join(ROOT, 'etc', 'nova-gpu-config-generator.conf'),
              '--output-file', ''])
        out = io.StringIO()
        generator.generate(conf, output_file=out)
        with open(os.path.join(ROOT, 'etc', 'nova-gpu.conf.sample')) as f:
            committed = f.read()
        self.assertEqual(committed, out.getvalue(),
                         'etc/nova-gpu.conf.sample is stale: run '
                         '"tox -e genconfig" and commit the result')
