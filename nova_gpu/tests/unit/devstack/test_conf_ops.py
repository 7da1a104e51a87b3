"""devstack/conf_ops.py --set-multi and tools/devstack/constraints.py.

--set-multi exists because devstack's own iniset_multiline splits its
values at blanks (found by a real stack.sh: nova-api refused the [pci]
alias lines it made). constraints.py raises upper-constraints pins for
tools/devstack-check.sh; PyPI is replaced by a fixed list of releases.
"""

import importlib.util
import os
import subprocess
import sys
import tarfile
import textwrap

import fixtures
from oslo_config import cfg
import testtools

from nova_gpu import tests

ROOT = tests.REPO_ROOT
CONF_OPS = os.path.join(ROOT, 'devstack', 'conf_ops.py')
CONSTRAINTS = os.path.join(ROOT, 'tools', 'devstack', 'constraints.py')

ALIASES = ['{"name": "nvidia-vgpu", "resource_class": "CUSTOM_NVIDIA_VGPU"}',
           '{"name": "nvidia-gpu", "resource_class": "CUSTOM_NVIDIA_GPU"}']


def parse_ini(path):
    sections = {}
    cfg.ConfigParser(path, sections).parse()
    return sections


def load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class SetMultiTest(testtools.TestCase):

    def setUp(self):
        super().setUp()
        self.conf = os.path.join(self.useFixture(fixtures.TempDir()).path,
                                 'nova.conf')

    def set_multi(self, section, option, *values):
        subprocess.run([sys.executable, CONF_OPS, '--set-multi', self.conf,
                        section, option] + list(values), check=True,
                       timeout=60)

    def test_values_with_blanks_stay_whole(self):
        with open(self.conf, 'w') as f:
            f.write(textwrap.dedent("""\
                [DEFAULT]
                debug = True

                [pci]
                # kept
                alias = {"name": "old"}
                passthrough_whitelist = x

                [other]
                alias = untouched
                """))
        self.set_multi('pci', 'alias', *ALIASES)
        conf = parse_ini(self.conf)
        self.assertEqual(ALIASES, conf['pci']['alias'])
        self.assertEqual(['x'], conf['pci']['passthrough_whitelist'])
        self.assertEqual(['untouched'], conf['other']['alias'])
        self.assertEqual(['True'], conf['DEFAULT']['debug'])
        with open(self.conf) as f:
            self.assertIn('# kept', f.read())

    def test_missing_section_is_added(self):
        with open(self.conf, 'w') as f:
            f.write('[DEFAULT]\ndebug = True\n')
        self.set_multi('pci', 'alias', *ALIASES)
        self.set_multi('pci', 'alias', *ALIASES)
        self.assertEqual(ALIASES, parse_ini(self.conf)['pci']['alias'])


class ConstraintsTest(testtools.TestCase):

    def setUp(self):
        super().setUp()
        self.tmp = self.useFixture(fixtures.TempDir()).path
        self.module = load(CONSTRAINTS, 'devstack_check_constraints')
        self.useFixture(fixtures.MockPatchObject(
            self.module, 'releases', side_effect=self.releases))
        self.uc = os.path.join(self.tmp, 'upper-constraints.txt')
        with open(self.uc, 'w') as f:
            f.write('keystoneauth1===5.15.0\noslo.log===8.3.0\n'
                    "pywin32===306;sys_platform=='win32'\n")
        # An sdist as PyPI serves it: requirements.txt at the top level.
        src = os.path.join(self.tmp, 'nova-34.0.0')
        os.mkdir(src)
        with open(os.path.join(src, 'requirements.txt'), 'w') as f:
            f.write('keystoneauth1>=5.16.0 # Apache-2.0\noslo.log>=5.0.0\n')
        self.sdist = os.path.join(self.tmp, 'nova-34.0.0.tar.gz')
        with tarfile.open(self.sdist, 'w:gz') as tar:
            tar.add(src, arcname='nova-34.0.0')

    @staticmethod
    def releases(name):
        from packaging.version import Version
        return [Version(v) for v in ('5.15.0', '5.16.0', '5.17.0')]

    def test_excluded_pin_raised_to_lowest_fit(self):
        self.assertEqual(0, self.module.main([self.uc, self.sdist]))
        with open(self.uc) as f:
            lines = f.read().splitlines()
        self.assertEqual(['keystoneauth1===5.16.0', 'oslo.log===8.3.0',
                          "pywin32===306;sys_platform=='win32'"], lines)

    def test_nothing_to_raise_leaves_file(self):
        req = os.path.join(self.tmp, 'requirements.txt')
        with open(req, 'w') as f:
            f.write('oslo.log>=5.0.0\n')
        with open(self.uc) as f:
            before = f.read()
        self.assertEqual(0, self.module.main([self.uc, req]))
        with open(self.uc) as f:
            self.assertEqual(before, f.read())
