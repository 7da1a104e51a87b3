"""The systemd units give the long-running services room for descriptors
(issue 25, item 5): systemd's default soft limit is 1024.
"""

import configparser
import os

import testtools

from nova_gpu import tests

ROOT = tests.REPO_ROOT
UNITS = os.path.join(ROOT, 'etc', 'systemd')


def service_section(name):
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str
    parser.read(os.path.join(UNITS, name))
    return parser['Service']


class DescriptorLimitTest(testtools.TestCase):

    def test_long_running_services_raise_nofile(self):
        for name in sorted(os.listdir(UNITS)):
            service = service_section(name)
            if service.get('Type') == 'oneshot':
                continue  # nova-gpu-restore: runs once, at boot
            self.assertIn('LimitNOFILE', service, name)
            self.assertGreaterEqual(int(service['LimitNOFILE']), 65536,
                                    name)
