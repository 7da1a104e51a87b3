"""The settings the docs show are the files in etc/, and nothing else.

Every ``[group] option = value`` an operator may copy from a code block
of ``doc/source`` must be held by a file of ``etc/nova`` or
``etc/nova-gpu`` (which the docs include with ``literalinclude``, the
harness loads service by service and the devstack plugin writes): a
setting shown but in no file is one no test ran with.
"""

import glob
import os
import re

from oslo_config import cfg
import testtools

from nova_gpu import tests

ROOT = tests.REPO_ROOT
DOCS = os.path.join(ROOT, 'doc', 'source')
CONF_DIRS = (os.path.join(ROOT, 'etc', 'nova'),
             os.path.join(ROOT, 'etc', 'nova-gpu'))

_SECTION = re.compile(r'^\[([A-Za-z0-9_.-]+)\]$')
_OPTION = re.compile(r'^([a-z_][a-z0-9_]*)\s*=')
_INCLUDE = re.compile(r'^\s*\.\. literalinclude:: (\S+)')


def code_blocks(text):
    """(line number, [lines]) of each literal block of an rst text."""
    lines = text.split('\n')
    i = 0
    while i < len(lines):
        line = lines[i]
        opens = (line.rstrip().endswith('::')
                 and not line.strip().startswith('.. ')
                 or re.match(r'\s*\.\. code-block::', line))
        if not opens:
            i += 1
            continue
        indent = len(line) - len(line.lstrip())
        j = i + 1
        while j < len(lines) and (
                not lines[j].strip()
                or len(lines[j]) - len(lines[j].lstrip()) > indent):
            j += 1
        yield i + 1, lines[i + 1:j]
        i = j


def shown_options(text):
    """[(line, group, option)] an rst text shows in its code blocks."""
    found = []
    for number, block in code_blocks(text):
        group = None
        for line in block:
            stripped = line.strip()
            match = _SECTION.match(stripped)
            if match:
                group = match.group(1)
                continue
            match = _OPTION.match(stripped)
            if match and group:
                found.append((number, group, match.group(1)))
    return found


def file_options():
    """{(group, option)} of every file of etc/nova and etc/nova-gpu."""
    held = set()
    for directory in CONF_DIRS:
        for path in glob.glob(os.path.join(directory, '*.conf')):
            sections = {}
            cfg.ConfigParser(path, sections).parse()
            held.update((group, option) for group, options in
                        sections.items() for option in options)
    return held


def _normal(group, option):
    # [mdev_nvidia-222]: the type id is the host's.
    return ('mdev_*' if group.startswith('mdev_') else group), option


class DocsShowOnlyFileSettingsTest(testtools.TestCase):

    def test_every_shown_option_is_in_a_file(self):
        held = {_normal(*k) for k in file_options()}
        missing = []
        for path in sorted(glob.glob(os.path.join(DOCS, '*.rst'))):
            with open(path) as f:
                text = f.read()
            for number, group, option in shown_options(text):
                if _normal(group, option) not in held:
                    missing.append('%s:%d [%s] %s' % (
                        os.path.basename(path), number, group, option))
        self.assertEqual([], missing)

    def test_included_files_exist(self):
        for path in sorted(glob.glob(os.path.join(DOCS, '*.rst'))):
            with open(path) as f:
                for line in f:
                    match = _INCLUDE.match(line)
                    if match:
                        target = os.path.normpath(os.path.join(
                            DOCS, match.group(1)))
                        self.assertTrue(os.path.isfile(target),
                                        '%s: %s' % (path, match.group(1)))

    def test_a_shown_option_missing_from_the_files_is_found(self):
        text = ('Set::\n\n    [filter_scheduler]\n'
                '    pci_in_placement = True\n    nope_option = 1\n')
        shown = {(g, o) for _, g, o in shown_options(text)}
        self.assertEqual({('filter_scheduler', 'pci_in_placement'),
                          ('filter_scheduler', 'nope_option')}, shown)
        self.assertIn(('filter_scheduler', 'pci_in_placement'),
                      file_options())
        self.assertNotIn(('filter_scheduler', 'nope_option'),
                         file_options())

    def test_no_inline_comments_in_files(self):
        # oslo.config takes "cmp1  # a comment" as the value.
        for directory in CONF_DIRS:
            for path in glob.glob(os.path.join(directory, '*.conf')):
                with open(path) as f:
                    for number, line in enumerate(f, 1):
                        if _OPTION.match(line):
                            self.assertNotIn(' #', line, '%s:%d' % (
                                path, number))

    def test_list_options_on_one_line(self):
        # A second line of a single-valued list option replaces the first
        # (oslo.config): weight_classes on three lines kept only the last.
        for directory in CONF_DIRS:
            for path in glob.glob(os.path.join(directory, '*.conf')):
                sections = {}
                cfg.ConfigParser(path, sections).parse()
                for group, option in (('filter_scheduler', 'weight_classes'),
                                      ('filter_scheduler',
                                       'enabled_filters')):
                    values = sections.get(group, {}).get(option, [])
                    self.assertLessEqual(len(values), 1, path)


class PciAliasesTest(testtools.TestCase):
    """nova-gpu-pci.conf holds the set aliases ``core.gpu_sets`` names."""

    def test_set_aliases_are_the_rule(self):
        import json

        from nova_gpu.core import gpu_sets
        from nova_gpu.core import report

        with open(os.path.join(CONF_DIRS[0], 'nova-gpu-pci.conf')) as f:
            aliases = [json.loads(line.partition('=')[2])
                       for line in f if line.startswith('alias =')]
        by_name = {a['name']: a for a in aliases}
        self.assertEqual(len(aliases), len(by_name))  # no name twice
        for base, rc in ((report.VFIO_VGPU_ALIAS, report.VFIO_VGPU_RC),
                         (report.WHOLE_GPU_ALIAS, report.WHOLE_GPU_RC)):
            device_type = by_name[base]['device_type']
            self.assertEqual(rc, by_name[base]['resource_class'])
            for alias in gpu_sets.pci_aliases(base, rc, device_type):
                self.assertEqual(alias, by_name.pop(alias['name']))
            del by_name[base]
        # The RDMA NIC functions of gpu:rdma flavors (core.rdma).
        self.assertEqual('type-VF', by_name.pop(
            report.RDMA_NIC_ALIAS)['device_type'])
        self.assertEqual({}, by_name)
