"""nova_gpu.atomic_file: one durable atomic write, and every caller on it.

The function: after a failure injected at each step the target holds its
old content (or, once renamed, the new one), no temporary file is left and
the error names the target; the file is fsync'd before the rename and its
directory after; a directory reached through a symbolic link works.

The callers: no module of nova_gpu renames a file but ``atomic_file``
(an ``ast`` scan, like ``test_layering``), and each file nova_gpu rewrites
(journal, JSON state records, saved demand, provider config, outbox
report, the demo's clouds.yaml) ends up fsync'd with its directory.
"""

import ast
import errno
import json
import os
import stat

import fixtures
from oslo_config import cfg
import testtools

from nova_gpu.agent import journal
from nova_gpu.agent import jsonstore
from nova_gpu.agent import planning
from nova_gpu.agent import provider_config
from nova_gpu.agent import publisher
from nova_gpu.agent import sriov
from nova_gpu.agent import vf_types
from nova_gpu import atomic_file
from nova_gpu.core import notification
from nova_gpu.demo import serve
from nova_gpu.tests.unit import test_layering

REAL_FSYNC = os.fsync
REAL_REPLACE = os.replace
REAL_WRITE = os.write
REAL_OPEN = os.open


def _identity(fd_or_path):
    st = (os.fstat(fd_or_path) if isinstance(fd_or_path, int)
          else os.stat(fd_or_path))
    return st.st_dev, st.st_ino


class Spy:
    """Records, in order, the fsync'd files and directories and the
    renames (``('file', (dev, ino))``, ``('dir', (dev, ino))``,
    ``('replace', src, dst)``).
    """

    def __init__(self, test):
        self.calls = []
        test.useFixture(fixtures.MonkeyPatch('os.fsync', self.fsync))
        test.useFixture(fixtures.MonkeyPatch('os.replace', self.replace))

    def fsync(self, fd):
        kind = 'dir' if stat.S_ISDIR(os.fstat(fd).st_mode) else 'file'
        self.calls.append((kind, _identity(fd)))
        return REAL_FSYNC(fd)

    def replace(self, src, dst, **kw):
        self.calls.append(('replace', os.fspath(src), os.fspath(dst)))
        return REAL_REPLACE(src, dst, **kw)

    def durable(self, path):
        """Whether ``path``'s file was fsync'd, then renamed to ``path``,
        then its directory fsync'd.
        """
        target = ('file', _identity(path))
        directory = ('dir', _identity(os.path.dirname(path) or '.'))
        if target not in self.calls or directory not in self.calls:
            return False
        renamed = [i for i, c in enumerate(self.calls)
                   if c[0] == 'replace' and c[2] == path]
        return bool(renamed) and (
            self.calls.index(target) < renamed[-1]
            < len(self.calls) - 1 - self.calls[::-1].index(directory))


class Failing:
    """Stand-in for an os function: raises on call ``nth`` (1-based)."""

    def __init__(self, real, nth=1, error=None):
        self.real = real
        self.nth = nth
        self.error = error or OSError(errno.ENOSPC, 'No space left on '
                                      'device')
        self.count = 0

    def __call__(self, *args, **kw):
        self.count += 1
        if self.count == self.nth:
            raise self.error
        return self.real(*args, **kw)


class WriteTest(testtools.TestCase):

    def setUp(self):
        super().setUp()
        self.dir = self.useFixture(fixtures.TempDir()).path
        self.path = os.path.join(self.dir, 'state.json')
        old = os.umask(0o022)
        self.addCleanup(os.umask, old)

    def read(self):
        with open(self.path, 'rb') as f:
            return f.read()

    def test_new_file(self):
        atomic_file.write(self.path, 'héllo\n')
        self.assertEqual('héllo\n'.encode('utf-8'), self.read())
        self.assertEqual(['state.json'], os.listdir(self.dir))
        self.assertEqual(0o644, stat.S_IMODE(os.stat(self.path).st_mode))

    def test_read_json(self):
        self.assertIsNone(atomic_file.read_json(self.path))   # none yet
        atomic_file.write_json(self.path, {'a': [1]})
        self.assertEqual({'a': [1]}, atomic_file.read_json(self.path))
        atomic_file.write(self.path, '{cut sho')
        e = self.assertRaises(atomic_file.Unreadable, atomic_file.read_json,
                              self.path)
        self.assertIn('cannot read %s' % self.path, str(e))

    def test_replaces_and_mode_minus_umask(self):
        atomic_file.write(self.path, b'old')
        os.umask(0o077)
        atomic_file.write(self.path, b'new', mode=0o640)
        self.assertEqual(b'new', self.read())
        self.assertEqual(0o600, stat.S_IMODE(os.stat(self.path).st_mode))
        self.assertEqual(['state.json'], os.listdir(self.dir))

    def test_write_json(self):
        atomic_file.write_json(self.path, {'b': 1, 'a': [2]},
                               sort_keys=True)
        self.assertEqual(b'{"a": [2], "b": 1}', self.read())

    def test_unserialisable_json_writes_nothing(self):
        atomic_file.write(self.path, b'old')
        self.assertRaises(TypeError, atomic_file.write_json, self.path,
                          {'x': object()})
        self.assertEqual(b'old', self.read())
        self.assertEqual(['state.json'], os.listdir(self.dir))

    def test_short_writes_are_completed(self):
        data = bytes(range(256)) * 40

        def short(fd, buf):
            return REAL_WRITE(fd, bytes(buf[:7]))
        self.useFixture(fixtures.MonkeyPatch('os.write', short))
        atomic_file.write(self.path, data)
        self.assertEqual(data, self.read())

    def test_fsync_file_then_rename_then_fsync_directory(self):
        spy = Spy(self)
        atomic_file.write(self.path, b'x')
        self.assertTrue(spy.durable(self.path), spy.calls)
        self.assertEqual(['file', 'replace', 'dir'],
                         [c[0] for c in spy.calls])
        # the temporary file: hidden, in the same directory, not *.json
        tmp = spy.calls[1][1]
        self.assertEqual(self.dir, os.path.dirname(tmp))
        self.assertTrue(os.path.basename(tmp).startswith('.state.json.'))
        self.assertFalse(tmp.endswith('.json'))

    def test_owner_given_before_the_rename(self):
        calls = []

        def fchown(fd, uid, gid):
            calls.append((_identity(fd), uid, gid, os.path.exists(
                self.path)))
        self.useFixture(fixtures.MonkeyPatch('os.fchown', fchown))
        atomic_file.write(self.path, b'x', owner=(1234, 5678))
        self.assertEqual([(_identity(self.path), 1234, 5678, False)], calls)

    def assert_failure_leaves(self, expected, error=None, **patches):
        """Each of ``patches`` (os name: Failing) makes ``write`` fail;
        the target then holds ``expected`` and nothing else is left.
        """
        atomic_file.write(self.path, b'old content')
        for name, failing in patches.items():
            self.useFixture(fixtures.MonkeyPatch('os.' + name, failing))
        e = self.assertRaises(error or OSError, atomic_file.write,
                              self.path, b'new content')
        for failing in patches.values():
            self.assertEqual(failing.nth, failing.count)
        self.assertEqual(expected, self.read())
        self.assertEqual(['state.json'], os.listdir(self.dir))
        return e

    def test_failure_at_each_step(self):
        steps = [
            ('open', 1, b'old content', 'creating a temporary file'),
            ('write', 1, b'old content', 'writing'),
            ('fchown', 1, b'old content', 'giving'),
            ('fsync', 1, b'old content', 'fsync of'),
            ('close', 1, b'old content', 'closing'),
            ('replace', 1, b'old content', 'renaming'),
            ('fsync', 2, b'new content', 'fsync of its directory'),
        ]
        own = (os.getuid(), os.getgid())
        for name, nth, expected, step in steps:
            where = 'os.%s call %d' % (name, nth)
            atomic_file.write(self.path, b'old content')
            failing = Failing(getattr(os, name), nth)
            with fixtures.MonkeyPatch('os.' + name, failing):
                e = self.assertRaises(OSError, atomic_file.write, self.path,
                                      b'new content', owner=own)
            self.assertEqual(nth, failing.count, where)
            self.assertEqual(expected, self.read(), where)
            self.assertEqual(['state.json'], os.listdir(self.dir), where)
            # the error names the target and the step, keeps the errno
            self.assertEqual(errno.ENOSPC, e.errno, where)
            self.assertEqual(self.path, e.filename, where)
            self.assertIn(step, str(e), where)

    def test_error_keeps_its_class(self):
        e = self.assert_failure_leaves(
            b'old content', error=PermissionError,
            replace=Failing(REAL_REPLACE, error=PermissionError(
                errno.EACCES, 'Permission denied')))
        self.assertIn(self.path, str(e))

    def test_any_exception_removes_the_temporary_file(self):
        self.assert_failure_leaves(
            b'old content', error=KeyboardInterrupt,
            write=Failing(REAL_WRITE, error=KeyboardInterrupt()))

    def test_error_without_errno_names_the_path(self):
        e = self.assert_failure_leaves(
            b'old content', fsync=Failing(REAL_FSYNC, error=OSError('boom')))
        self.assertIn(self.path, str(e))
        self.assertIn('boom', str(e))

    def test_directory_that_cannot_be_fsynced(self):
        # EINVAL: the file system cannot fsync a directory; not an error
        self.useFixture(fixtures.MonkeyPatch('os.fsync', Failing(
            REAL_FSYNC, nth=2, error=OSError(errno.EINVAL, 'Invalid'))))
        atomic_file.write(self.path, b'x')
        self.assertEqual(b'x', self.read())

    def test_missing_directory_is_named(self):
        path = os.path.join(self.dir, 'no', 'such', 'file')
        e = self.assertRaises(FileNotFoundError, atomic_file.write, path,
                              b'x')
        self.assertEqual(path, e.filename)

    def test_directory_through_a_symbolic_link(self):
        real = os.path.join(self.dir, 'real')
        os.mkdir(real)
        link = os.path.join(self.dir, 'link')
        os.symlink(real, link)
        path = os.path.join(link, 'f.json')
        spy = Spy(self)
        atomic_file.write(path, b'one')
        atomic_file.write(path, b'two')
        with open(os.path.join(real, 'f.json'), 'rb') as f:
            self.assertEqual(b'two', f.read())
        self.assertTrue(os.path.islink(link))
        self.assertEqual(['f.json'], os.listdir(real))
        # the directory fsync'd is the one the link points to
        self.assertIn(('dir', _identity(real)), spy.calls)
        self.assertTrue(spy.durable(path), spy.calls)
        # ``link/..`` is where the kernel says (the real dir's parent)
        atomic_file.write(os.path.join(link, '..', 'up.json'), b'up')
        self.assertTrue(os.path.exists(os.path.join(self.dir, 'up.json')))

    def test_a_symbolic_link_target_is_replaced_by_a_file(self):
        other = os.path.join(self.dir, 'other')
        with open(other, 'w') as f:
            f.write('kept')
        os.symlink(other, self.path)
        atomic_file.write(self.path, b'new')
        self.assertFalse(os.path.islink(self.path))
        self.assertEqual(b'new', self.read())
        with open(other) as f:
            self.assertEqual('kept', f.read())

    def test_relative_path(self):
        cwd = os.getcwd()
        os.chdir(self.dir)
        self.addCleanup(os.chdir, cwd)
        spy = Spy(self)
        atomic_file.write('rel.json', b'x')
        self.assertIn(('dir', _identity(self.dir)), spy.calls)

    def test_rename_fsyncs_the_directory(self):
        atomic_file.write(self.path, b'x')
        aside = self.path + '.bad'
        spy = Spy(self)
        atomic_file.rename(self.path, aside)
        self.assertFalse(os.path.exists(self.path))
        self.assertEqual(
            [('replace', self.path, aside), ('dir', _identity(self.dir))],
            spy.calls)


# -- every caller ------------------------------------------------------------

ROOT = os.path.dirname(atomic_file.__file__)
OWN = os.path.join(ROOT, 'atomic_file.py')
# What renames a file (an atomic write's last step, done by hand).
RENAMES = {('os', 'replace'), ('os', 'rename'), ('os', 'renames'),
           ('shutil', 'move')}


def renames(path):
    """``line: code`` of each file rename in the module at ``path``."""
    with open(path) as f:
        source = f.read()
    found = []
    for node in ast.walk(ast.parse(source, path)):
        hit = False
        if isinstance(node, ast.Attribute) and isinstance(
                node.value, ast.Name):
            hit = (node.value.id, node.attr) in RENAMES
        if isinstance(node, ast.Call) and isinstance(
                node.func, ast.Attribute) and node.func.attr == 'rename' \
                and not isinstance(node.func.value, ast.Name):
            hit = True   # pathlib.Path(...).rename (str has no rename)
        if isinstance(node, ast.ImportFrom) and node.module in (
                'os', 'shutil'):
            hit = any((node.module, a.name) in RENAMES for a in node.names)
        if hit:
            found.append('%d: %s' % (node.lineno,
                                     ast.get_source_segment(source, node)))
    return sorted(set(found))


def hand_made():
    """Every rename in nova_gpu outside atomic_file, as sentences (the
    tests' fakes of hardware, which rename files of fake trees, aside).
    """
    return ['%s:%s' % (name, hit)
            for name, path in test_layering.modules()
            if path != OWN and not name.startswith('nova_gpu.tests.')
            for hit in renames(path)]


class EveryCallerTest(testtools.TestCase):

    def setUp(self):
        super().setUp()
        self.dir = self.useFixture(fixtures.TempDir()).path

    def test_no_file_is_renamed_outside_atomic_file(self):
        self.assertEqual([], hand_made(),
                         'write files with nova_gpu.atomic_file.write '
                         '(or move them with atomic_file.rename)')

    def test_the_scan_finds_a_hand_made_atomic_write(self):
        # what provider_config, publisher and the journal did before
        probe = os.path.join(self.dir, 'probe.py')
        with open(probe, 'w') as f:
            f.write('import os, shutil, pathlib\n'
                    'from os import replace\n'
                    'def write(path, text):\n'
                    '    with open(path + ".tmp", "w") as f:\n'
                    '        f.write(text)\n'
                    '    os.rename(path + ".tmp", path)\n'
                    '    os.replace(path + ".tmp", path)\n'
                    '    pathlib.Path(path).rename(path + ".old")\n'
                    '    shutil.move(path, path)\n'
                    '    move = os.replace\n'
                    '    return "a.b".replace(".", "-")\n')
        self.assertEqual(
            ['10: os.replace', '2: from os import replace',
             '6: os.rename', '7: os.replace',
             '8: pathlib.Path(path).rename(path + ".old")',
             '9: shutil.move'], renames(probe))
        self.assertNotEqual([], renames(OWN))   # the one place that does

    def assert_durable(self, path, write):
        spy = Spy(self)
        write()
        self.assertTrue(os.path.isfile(path), path)
        self.assertTrue(spy.durable(path), (path, spy.calls))
        self.assertEqual([], [n for n in os.listdir(os.path.dirname(path))
                              if n.endswith('.tmp')])

    def test_journal(self):
        path = os.path.join(self.dir, journal.FILE_NAME)
        j = journal.Journal(path)
        self.assert_durable(path, lambda: j.begin('vf_create', vf='a',
                                                  type_id=1))
        # the agent's own, as it always was
        self.assertEqual(0o600, stat.S_IMODE(os.stat(path).st_mode))

    def test_journal_moved_aside_durably(self):
        path = os.path.join(self.dir, journal.FILE_NAME)
        with open(path, 'w') as f:
            f.write('{"trunc')
        self.useFixture(fixtures.FakeLogger())
        spy = Spy(self)
        journal.Journal(path, clock=lambda: 7)
        self.assertIn(('replace', path, path + '.corrupt-7'), spy.calls)
        self.assertIn(('dir', _identity(self.dir)), spy.calls)

    def test_json_store_and_its_users(self):
        path = os.path.join(self.dir, 'record.json')
        store = jsonstore.JsonStore(self.dir, 'record.json', 'k')

        def change():
            with store.change() as data:
                data['a'] = 1
        self.assert_durable(path, change)
        with open(path) as f:
            self.assertEqual({'version': 1, 'k': {'a': 1}}, json.load(f))
        self.assert_durable(
            os.path.join(self.dir, sriov.STORE_NAME),
            lambda: sriov.SriovStore(self.dir, boot_id='b').set(
                '0000:86:00.0', 4))
        self.assert_durable(
            os.path.join(self.dir, vf_types.STORE_NAME),
            lambda: vf_types.record(self.dir, '0000:86:00.4', 1061))

    def test_saved_demand(self):
        source = planning.DemandSource(state_dir=self.dir)
        payload = notification.DemandPayload(
            items=[[{'kind': 'mig', 'profile': '1g.5gb'}, 1.0]],
            publisher='sched-1', version=1, requests=10)
        self.assert_durable(os.path.join(self.dir, planning.DEMAND_FILE),
                            lambda: source.update(payload))

    def test_provider_config(self):
        class Inventory:
            gpus = []

            def providers(self):
                return {}
        path = os.path.join(self.dir, 'provider_config', 'nova-gpu.yaml')
        self.assert_durable(
            path, lambda: provider_config.write(Inventory(), path))

    def test_outbox_report(self):
        conf = cfg.ConfigOpts()
        conf([], project='nova-gpu-test')
        outbox = os.path.join(self.dir, 'outbox')
        pub = publisher.ReportPublisher(conf, 'gpu_reports_test', outbox,
                                        url='fake:/')
        self.addCleanup(pub.close)

        def refuse(*args, **kw):
            raise ConnectionError('broker down')
        pub.transport._send_notification = refuse
        self.useFixture(fixtures.FakeLogger())
        spy = Spy(self)
        self.assertEqual(1, pub.publish({'generation': 3}))
        [name] = pub.pending()
        self.assertTrue(spy.durable(os.path.join(outbox, name)), spy.calls)

    def test_demo_clouds_yaml(self):
        path = os.path.join(self.dir, 'clouds.yaml')
        self.assert_durable(path, lambda: serve.write_clouds_yaml(
            path, {'clouds': {'x': {'auth': {'token': 't'}}}}))
        # it holds the admin token
        self.assertEqual(0, stat.S_IMODE(os.stat(path).st_mode) & 0o077)
