"""Bad input at start: one rule (``nova_gpu.daemon``) for every program.

Each program runs as an operator runs it (a process of its own) with a
configuration file that cannot be used: a FIFO (the programs hung on it),
``/dev/zero`` (they filled their memory), a directory, a binary file, a
file too large to be one, a missing one, a FIFO as ``[gpu]
catalog_files`` and a bad option value. Each must end within seconds with
one line naming the file and the problem, a non-zero exit status and no
traceback.
"""

import concurrent.futures
import os
import resource
import subprocess
import sys

import fixtures
import testtools

from nova_gpu import daemon
from nova_gpu.tests.unit.agent import test_qemu_hook
from nova_gpu.tests.unit.sim import test_trace

# Seconds for a program to start and refuse, on a loaded test machine; the
# programs that hung ran past it.
TIMEOUT = 30
# What a program may take; the ones that read /dev/zero whole ran into it
# (MemoryError) instead of into the test machine's memory.
MEMORY_LIMIT = 4 * 2 ** 30


def _limit_memory():
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def run_program(module, args, env=None, stdin=''):
    """``python -m module args``; the CompletedProcess, or None when it
    ran past TIMEOUT (it is killed).
    """
    try:
        return subprocess.run(
            [sys.executable, '-m', module] + list(args), input=stdin,
            capture_output=True, text=True, timeout=TIMEOUT,
            preexec_fn=_limit_memory,
            env=dict(os.environ, PYTHONWARNINGS='ignore', **(env or {})))
    except subprocess.TimeoutExpired:
        return None


class BadFiles(fixtures.Fixture):
    """Files no program may read as its configuration, and what the error
    line says of each: ``cases``, ``[(name, path, [texts])]``.
    """

    def _setUp(self):
        self.dir = self.useFixture(fixtures.TempDir()).path
        fifo = self.path('fifo.conf')
        os.mkfifo(fifo)
        adir = self.path('dir.conf')
        os.mkdir(adir)
        huge = self.write('huge.conf', '[DEFAULT]\n' + '# %s\n' % ('x' * 77)
                          * (daemon.MAX_CONFIG_BYTES // 80 + 1))
        binary = self.write('binary.conf', '[DEFAULT]\n' + ''.join(
            map(chr, range(128))) * 64)
        catalog = self.write('catalog.conf', '[gpu]\ncatalog_files = %s\n'
                             % fifo)
        missing = self.path('missing.conf')
        value = self.write('value.conf', '[gpu_agent]\nlibvirt_retries = '
                           'abc\n')
        self.cases = [
            ('fifo', fifo, [fifo, 'is a FIFO, not a regular file']),
            ('device', '/dev/zero', ['/dev/zero', 'is a character device']),
            ('directory', adir, [adir, 'is a directory']),
            ('huge', huge, [huge, 'bytes, more than the %d'
                            % daemon.MAX_CONFIG_BYTES]),
            ('binary', binary, [binary, 'not a text file: a NUL byte at '
                                'offset 10']),
            ('missing', missing, [missing, 'does not exist']),
            ('catalog fifo', catalog, ['[gpu] catalog_files', fifo,
                                       'not a regular file']),
            # named at start by every program, used or not (one file)
            ('bad value', value, ['libvirt_retries', value, 'not valid']),
        ]

    def path(self, name):
        return os.path.join(self.dir, name)

    def write(self, name, text):
        with open(self.path(name), 'w') as f:
            f.write(text)
        return self.path(name)


class _ProgramCase(testtools.TestCase):

    def setUp(self):
        super().setUp()
        self.files = self.useFixture(BadFiles())

    def run_cases(self, cases, run):
        """``run(path)`` for each case at once; {name: (proc, texts)}."""
        with concurrent.futures.ThreadPoolExecutor(len(cases)) as pool:
            procs = pool.map(lambda case: run(case[1]), cases)
            return {name: (proc, texts)
                    for (name, _p, texts), proc in zip(cases, procs)}

    def assertRefused(self, results, prefix):
        for name, (proc, texts) in sorted(results.items()):
            self.assertIsNotNone(proc, '%s: still running after %ds'
                                 % (name, TIMEOUT))
            lines = proc.stderr.strip().splitlines()
            detail = '%s: rc %d, stderr:\n%s' % (name, proc.returncode,
                                                 proc.stderr[-3000:])
            self.assertNotEqual(0, proc.returncode, detail)
            self.assertNotIn('Traceback', proc.stderr, detail)
            self.assertEqual(1, len(lines), detail)
            self.assertTrue(lines[0].startswith(prefix), detail)
            for text in texts:
                self.assertIn(text, lines[0], detail)


class ServicesTest(_ProgramCase):
    """Every service and ``nova-gpu``: ``--config-file``."""

    def check(self, module, prog, *args):
        results = self.run_cases(self.files.cases, lambda path: run_program(
            module, ['--config-file', path] + list(args)))
        self.assertRefused(results, '%s: error: ' % prog)

    def test_nova_gpu(self):
        self.check('nova_gpu.cmd.cli', 'nova-gpu', '--no-nvml',
                   '--sysfs-root', self.files.dir, 'list')

    def test_agent(self):
        self.check('nova_gpu.cmd.agent', 'nova-gpu-agent')

    def test_restore(self):
        self.check('nova_gpu.cmd.restore', 'nova-gpu-restore')

    def test_exporter(self):
        self.check('nova_gpu.cmd.exporter', 'nova-gpu-exporter')

    def test_reclaimer(self):
        self.check('nova_gpu.cmd.reclaimer', 'nova-gpu-reclaimer')

    def test_defrag(self):
        self.check('nova_gpu.cmd.defrag', 'nova-gpu-defrag')


class QemuHookTest(_ProgramCase):
    """The hook reads the agent's default configuration file (here in
    ``$HOME/.nova-gpu/``, one of oslo.config's places for it): libvirt
    would wait on a FIFO there forever, with every guest start on the host.
    """

    def test_default_config_file(self):
        xml = test_qemu_hook.domain_xml(['0000:86:00.4'])
        # A missing default file is no error; the catalog and the options
        # but two are not read.
        cases, homes = [], {}
        for name, path, texts in self.files.cases:
            if name in ('missing', 'catalog fifo', 'bad value'):
                continue
            home = os.path.join(self.files.dir, 'home-' + name)
            link = os.path.join(home, '.nova-gpu', 'nova-gpu.conf')
            os.makedirs(os.path.dirname(link))
            os.symlink(path, link)  # the error names the file it found
            homes[path] = home
            cases.append((name, path, [link] + texts[1:]))
        self.assertRefused(self.run_cases(cases, lambda path: run_program(
            'nova_gpu.cmd.qemu_hook',
            ['instance-1', 'prepare', 'begin', '-'],
            env={'HOME': homes[path]}, stdin=xml)),
            'nova-gpu-qemu-hook: domain instance-1: ')


class SimTest(_ProgramCase):
    """nova-gpu-sim's input files, by the same rule (a trace may be larger
    than a configuration file: no huge case).
    """

    def check(self, args):
        cases = [c for c in self.files.cases
                 if c[0] not in ('huge', 'catalog fifo', 'bad value')]
        results = self.run_cases(cases, lambda path: run_program(
            'nova_gpu.sim.cli', [a.replace('BAD', path) for a in args]))
        self.assertRefused(results, 'nova-gpu-sim: error: ')
        for proc, _texts in results.values():
            self.assertEqual(2, proc.returncode)

    def test_node_list(self):
        self.check(['--nodes', 'BAD', '--tasks', test_trace.TASKS])

    def test_placements_to_audit(self):
        self.check(['--nodes', test_trace.NODES, '--tasks', test_trace.TASKS,
                    '--audit', 'BAD'])


class CheckFileTest(testtools.TestCase):
    """``daemon.check_file`` and ``daemon.config_paths`` in process."""

    def setUp(self):
        super().setUp()
        self.files = self.useFixture(BadFiles())

    def test_a_text_file_passes(self):
        path = self.files.write('good.conf', '[gpu]\n# \u00e9t\u00e9\n')
        daemon.check_file(path)  # no error
        daemon.check_file(os.devnull)  # the empty file, by convention

    def test_limit_and_names(self):
        path = self.files.write('ten.csv', 'a,b\n1,2\n3,4\n')
        err = self.assertRaises(daemon.ConfigError, daemon.check_file,
                                path, 'node list', 5)
        self.assertEqual('node list %s is 12 bytes, more than the 5 a node '
                         'list may have' % path, str(err))

    def test_not_utf8(self):
        path = self.files.path('latin1.conf')
        with open(path, 'wb') as f:
            f.write(b'[DEFAULT]\n# caf\xe9\n')
        err = self.assertRaises(daemon.ConfigError, daemon.check_file, path)
        self.assertIn('not UTF-8 at offset 15', str(err))

    def test_a_name_with_a_newline_stays_on_one_line(self):
        err = self.assertRaises(daemon.ConfigError, daemon.check_file,
                                self.files.path('a\nb\x1b[2J.conf'))
        self.assertEqual(1, len(str(err).splitlines()))
        self.assertIn('a\\nb\\x1b[2J.conf does not exist', str(err))

    def test_config_paths_as_oslo_config_reads_them(self):
        d = self.files.path('conf.d')
        os.mkdir(d)
        for name in ('b.conf', 'a.conf', 'skipped.txt'):
            self.files.write(os.path.join('conf.d', name), '')
        self.assertEqual(
            ['/x.conf', '/y.conf', os.path.join(d, 'a.conf'),
             os.path.join(d, 'b.conf')],
            daemon.config_paths(['--config-file', '/x.conf',
                                 '--config-file=/y.conf', '--config-dir', d],
                                'prog', default_config_files=['/default']))
        # an abbreviation is --config-file too (argparse's, as oslo.config
        # parses it), and the defaults are then read as well
        self.assertEqual(['/x.conf', '/default'], daemon.config_paths(
            ['--config-fi', '/x.conf', '--config-dir', d + '/none'],
            'prog', default_config_files=['/default']))


class PrintableTest(testtools.TestCase):

    def test_escapes_what_could_forge_or_rewrite_a_line(self):
        self.assertEqual('instance-1\\n\\x1b[31mx\\\\y \u00e9\\u2028',
                         daemon.printable('instance-1\n\x1b[31mx\\y '
                                          '\u00e9\u2028'))
        self.assertEqual('plain name', daemon.printable('plain name'))

    def test_describe_error_is_one_bounded_line(self):
        text = daemon.describe_error(ValueError('a\nb ' + 'x' * 1000))
        self.assertTrue(text.startswith('a b xxx'))
        self.assertTrue(text.endswith('... (504 characters more)'), text)
        self.assertEqual(1, len(text.splitlines()))
