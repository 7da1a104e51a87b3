"""What the documentation and the code say about Nova 34, checked.

Issue 23 found statements about Nova that Nova 34's source contradicts.
These tests keep them from coming back where a test can read them (the
docs cite where each fact is stated; the functional tests
``nova_gpu/tests/functional/agent/test_nova_traits.py`` and
``nova_gpu/tests/functional/scheduler/test_vfio_unmanaged.py`` run Nova's own
code):

* every vendor-VFIO ``[pci] device_spec`` the docs and the sample
  configuration files show carries ``"managed": "no"``, read as Nova 34's
  ``PciDeviceSpec`` reads it (``nova/pci/devspec.py``,
  ``_normalize_device_spec_tag``: oslo's strict boolean strings), and the
  whole-GPU ones keep Nova's default (managed);
* Nova's method is ``RequestSpec.generate_request_groups_from_pci_requests``
  (``nova/objects/request_spec.py``), without a leading underscore;
* nova-compute does not hand the host's PCI devices to its PCI tracker at
  every period (``ResourceTracker._setup_pci_tracker``), and does not
  reset the traits of every GPU provider (``_ensure_pgpu_providers`` only
  adds ``OWNER_NOVA``).
"""

import json
import os
import re

from oslo_utils import strutils
import testtools

from nova_gpu.core import report
from nova_gpu import tests

ROOT = tests.REPO_ROOT
# Tools that fake Nova for the tests are kept out: they are checked where
# they are used.
SKIP_DIRS = {'.git', '.tox', '.stestr', 'build', 'dist', '__pycache__',
             os.path.join('nova_gpu', 'tests', 'harness')}
TEXT = ('.py', '.rst', '.txt', '.conf', '.sample', '.yaml', '.yml', '.sh',
        '.service', '.md', '.ini', '.cfg')
DEVICE_SPEC = re.compile(r'device_spec\s*=\s*(\{[^\n]*\})')
# Spelt in two parts so that this file does not match itself.
WRONG_NAME = '_generate' + '_request_groups_from_pci_requests'


def _files(*tops, suffixes=TEXT):
    for top in tops:
        base = os.path.join(ROOT, top)
        if os.path.isfile(base):
            yield top
            continue
        for dirpath, dirnames, filenames in os.walk(base):
            rel = os.path.relpath(dirpath, ROOT)
            dirnames[:] = sorted(
                d for d in dirnames
                if d not in SKIP_DIRS and
                os.path.normpath(os.path.join(rel, d)) not in SKIP_DIRS)
            for name in sorted(filenames):
                if name.endswith(suffixes):
                    yield os.path.normpath(os.path.join(rel, name))


def _read(rel):
    with open(os.path.join(ROOT, rel), encoding='utf-8',
              errors='replace') as f:
        return f.read()


class TestDeviceSpecExamples(testtools.TestCase):
    """``"managed": "no"`` on every vendor-VFIO VF the docs configure."""

    def specs(self):
        found = []
        for rel in _files(os.path.join('doc', 'source'), 'etc',
                          suffixes=('.rst', '.conf', '.sample')):
            for lineno, line in enumerate(_read(rel).splitlines(), 1):
                match = DEVICE_SPEC.search(line)
                if not match:
                    continue
                try:
                    spec = json.loads(match.group(1))
                except ValueError:
                    continue  # prose about the option, not an entry
                found.append(('%s:%d' % (rel, lineno), spec))
        return found

    def test_vendor_vfio_vfs_are_not_managed(self):
        vfio = [(where, spec) for where, spec in self.specs()
                if spec.get('resource_class') == report.VFIO_VGPU_RC]
        self.assertNotEqual([], vfio, 'no vendor-VFIO device_spec found')
        for where, spec in vfio:
            self.assertIn('managed', spec, where)
            # as PciDeviceSpec._normalize_device_spec_tag reads it
            self.assertFalse(strutils.bool_from_string(spec['managed'],
                                                       strict=True), where)

    def test_whole_gpus_keep_the_managed_default(self):
        for where, spec in self.specs():
            if spec.get('resource_class') != report.WHOLE_GPU_RC:
                continue
            self.assertTrue(strutils.bool_from_string(
                spec.get('managed', 'true'), strict=True), where)


class TestNovaNames(testtools.TestCase):

    def test_request_groups_method_name(self):
        # Without blanks: the docs break long names across lines.
        wrong = [rel for rel in _files('.')
                 if WRONG_NAME in re.sub(r'\s+', '', _read(rel))]
        self.assertEqual([], wrong)


class TestNovaBehaviourClaims(testtools.TestCase):
    """Claims Nova 34's source contradicts, in the docs and the code."""

    CLAIMS = (
        # resource_tracker.py _setup_pci_tracker: only when it builds the
        # tracker
        (r're-?discovers the host.s PCI devices', 'PCI devices'),
        (r'(resource tracker|nova-compute) sees (it |them )?at its next '
         r'period', 'PCI devices'),
        # driver.py _ensure_pgpu_providers only adds OWNER_NOVA
        (r'(resets|replaces|rewrites) (the|their) traits( of the (physical '
         r')?GPU providers)? at every periodic', 'traits'),
    )

    def test_no_contradicted_claim(self):
        found = []
        for rel in _files(os.path.join('doc', 'source'), 'nova_gpu'):
            text = ' '.join(_read(rel).split())
            text = re.sub(r'\s*#\s*', ' ', text)  # comments' line starts
            for pattern, what in self.CLAIMS:
                for match in re.finditer(pattern, text, re.IGNORECASE):
                    found.append('%s: %s: %r' % (rel, what, match.group(0)))
        self.assertEqual([], found)
