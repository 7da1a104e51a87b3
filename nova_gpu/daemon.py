"""What every nova-gpu program does at start: read its configuration,
set up oslo.log, and stop on SIGTERM or SIGINT; and the one rule for the
files it is told to read.

``prepare`` starts nova-gpu-agent, nova-gpu-restore, nova-gpu-exporter,
nova-gpu-reclaimer and nova-gpu-defrag: a configuration that cannot be
used ends the program with one line, ``<prog>: error: <what is wrong>``,
and exit status 1. ``configure`` (``nova-gpu``) and ``read_config`` (the
qemu hook) raise ``ConfigError`` instead, for the program to report its
own way; nova-gpu-sim checks its input files with ``check_file``.

The rule (``check_file``): a file is read only when it is a regular file
of at most a bound of bytes that starts as UTF-8 text; anything else is
refused, naming the file and what it is, before the program reads it. A
FIFO or a terminal would block the read forever, ``/dev/zero`` would fill
the memory, a directory or a binary file ends in a traceback.
Every configuration file oslo.config would read is checked so: each
``--config-file`` (or the default files) and the ``*.conf`` files of each
``--config-dir`` (or of the default directories). ``[gpu] catalog_files``
are the core's (``core.catalog`` refuses the same files where it reads
them, in every process that loads the catalog); ``configure`` loads the
catalog once so that a bad one is named at start, not by a traceback
later.

A package-root module: any adapter may import it.
"""

import argparse
import codecs
import glob
import os
import re
import signal
import stat
import threading

from oslo_config import cfg
from oslo_log import log as logging

import nova_gpu.conf
from nova_gpu.core import catalog as catalog_mod
from nova_gpu.core import exceptions

PROJECT = 'nova-gpu'
# A configuration file is kilobytes (etc/nova-gpu.conf.sample, every
# option described, is about 40 KiB).
MAX_CONFIG_BYTES = 4 * 2 ** 20
# How much of a file is read to tell text from binary data.
SNIFF_BYTES = 64 * 2 ** 10
# An error line quotes what it found (oslo.config quotes a bad line
# whole): a line a terminal and a log can still hold.
MAX_ERROR_CHARS = 500
_KINDS = ((stat.S_ISDIR, 'a directory'), (stat.S_ISFIFO, 'a FIFO'),
          (stat.S_ISCHR, 'a character device'),
          (stat.S_ISBLK, 'a block device'), (stat.S_ISSOCK, 'a socket'))


class ConfigError(cfg.Error):
    """The configuration cannot be used; the message is one line."""


def printable(text):
    """``text`` on one line: control characters (newlines, escape
    sequences) and backslashes escaped as ``repr()`` writes them.

    For names and messages from outside (a domain name, a file's line)
    written to a log or a terminal, where a newline would forge a line and
    an escape sequence would rewrite one.
    """
    text = str(text)
    if text.isprintable() and '\\' not in text:
        return text  # the usual case, quickly
    return ''.join(c if c.isprintable() and c != '\\' else repr(c)[1:-1]
                   for c in text)


def describe_error(e):
    """One printable line saying what went wrong (an OSError, a
    configuration or a GPU error), at most ``MAX_ERROR_CHARS`` long.
    """
    if isinstance(e, ConfigError):
        return str(e)  # made one printable line already
    if isinstance(e, OSError) and e.strerror:
        text = e.strerror
        if e.filename:
            text += ': %s' % e.filename
    else:
        text = str(e)
        # oslo.config names where a bad value came from as a LocationInfo
        # repr
        text = re.sub(r"LocationInfo\(location=.*?, detail='([^']*)'\)",
                      r'\1', text)
    text = printable(' '.join(text.split())) or type(e).__name__
    if len(text) > MAX_ERROR_CHARS:
        text = '%s... (%d characters more)' % (
            text[:MAX_ERROR_CHARS], len(text) - MAX_ERROR_CHARS)
    return text


def error_line(prog, e):
    """The last line a program that fails with ``e`` prints."""
    return '%s: error: %s' % (prog, describe_error(e))


def check_file(path, what='configuration file', limit=MAX_CONFIG_BYTES):
    """Raise ``ConfigError`` unless ``path`` is a regular file of at most
    ``limit`` bytes that starts as UTF-8 text (see the module).
    """
    name = '%s %s' % (what, printable(path))
    try:
        # stat before open: opening a device may block or act (a tape, a
        # watchdog).
        st = os.stat(path)
    except OSError as e:
        raise ConfigError('%s %s' % (name, _os_problem(e))) from None
    if _is_devnull(st):
        return  # --config-file /dev/null: the usual way to say "none"
    _check_kind(name, st.st_mode)
    with _open_regular(path, name) as f:
        size = os.fstat(f.fileno()).st_size
        if size > limit:
            raise ConfigError('%s is %d bytes, more than the %d a %s may '
                              'have' % (name, size, limit, what))
        head = f.read(SNIFF_BYTES)
    problem = _not_text(head, final=len(head) < SNIFF_BYTES)
    if problem:
        raise ConfigError('%s is not a text file: %s' % (name, problem))


def _open_regular(path, name):
    """``path`` opened to read bytes, if it is still a regular file."""
    try:
        # O_NONBLOCK: should the path have turned into a FIFO, the open
        # does not wait for a writer (fstat refuses it).
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError as e:
        raise ConfigError('%s %s' % (name, _os_problem(e))) from None
    try:
        _check_kind(name, os.fstat(fd).st_mode)
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, 'rb')


def _is_devnull(st):
    if not stat.S_ISCHR(st.st_mode):
        return False
    null = os.stat(os.devnull)
    return stat.S_ISCHR(null.st_mode) and st.st_rdev == null.st_rdev


def _os_problem(e):
    if isinstance(e, FileNotFoundError):
        return 'does not exist'
    return 'cannot be read: %s' % (e.strerror or e)


def _check_kind(name, mode):
    if stat.S_ISREG(mode):
        return
    kind = next((k for test, k in _KINDS if test(mode)), 'not a file')
    raise ConfigError('%s is %s, not a regular file' % (name, kind))


def _not_text(data, final):
    """What makes ``data`` (a file's first bytes) not UTF-8 text, or None."""
    nul = data.find(b'\0')
    if nul >= 0:
        return 'a NUL byte at offset %d' % nul
    try:
        codecs.getincrementaldecoder('utf-8')().decode(data, final=final)
    except UnicodeDecodeError as e:
        return 'not UTF-8 at offset %d' % e.start
    return None


class _PathsParser(argparse.ArgumentParser):
    """The paths oslo.config's own parser finds, abbreviations included;
    whatever it cannot make out, oslo.config reports.
    """

    def error(self, message):
        raise ValueError(message)


def config_paths(argv, prog, default_config_files=None):
    """Every file oslo.config reads for ``argv``: each ``--config-file``
    (else the default files), the ``*.conf`` files of each
    ``--config-dir`` (else of the default directories that exist).
    """
    parser = _PathsParser(add_help=False)
    parser.add_argument('--config-file', action='append', default=[])
    parser.add_argument('--config-dir', action='append', default=[])
    try:
        given, _rest = parser.parse_known_args(list(argv))
    except ValueError:
        return []
    # oslo.config reads the defaults when no argument is spelt so.
    files, dirs = list(given.config_file), list(given.config_dir)
    if not _given(argv, '--config-file'):
        files += (cfg.find_config_files(PROJECT, prog)
                  if default_config_files is None else default_config_files)
    if not _given(argv, '--config-dir'):
        dirs += [d for d in cfg.find_config_dirs(PROJECT, prog)
                 if os.path.exists(d)]
    for d in dirs:
        files += sorted(glob.glob(os.path.join(os.path.expanduser(d),
                                               '*.conf')))
    return [os.path.abspath(os.path.expanduser(f)) for f in files]


def _given(argv, option):
    return any(a == option or a.startswith(option + '=') for a in argv)


def read_config(conf, argv, prog, default_config_files=None):
    """Parse ``argv`` and the configuration files into ``conf``; each
    file is checked first (``check_file``). Raises ``ConfigError`` (one
    line).
    """
    for path in config_paths(argv, prog, default_config_files):
        check_file(path)
    try:
        conf(argv, project=PROJECT, prog=prog,
             default_config_files=default_config_files)
    except (cfg.Error, OSError, UnicodeError) as e:
        raise ConfigError(describe_error(e)) from e


def _read_every_option(conf):
    """Read each registered option once: a bad value in the file (shared
    by every nova-gpu program) is named at start, not where it is first
    used, in a traceback.
    """
    try:
        for name in list(conf):
            value = conf[name]
            if isinstance(value, cfg.ConfigOpts.GroupAttr):
                for opt in list(value):
                    value[opt]  # converts (checks) the value
    except cfg.Error as e:
        raise ConfigError(describe_error(e)) from e


def configure(argv, prog, stderr=False, config_files=None, overrides=None):
    """``nova_gpu.conf.CONF`` read (``read_config``), its GPU catalog
    loaded once, oslo.log set up, every option's value checked;
    ``ConfigError`` when one cannot be used.

    ``config_files`` and ``overrides`` (``[DEFAULT]`` options, such as
    ``debug``) come from a CLI that parsed its own arguments
    (``nova-gpu``): oslo.config then reads no command line. ``stderr``
    keeps stdout for a command's output.
    """
    conf = nova_gpu.conf.CONF
    logging.register_options(conf)
    if stderr:
        conf.set_default('use_stderr', True)
    read_config(conf, argv, prog, config_files)
    try:
        catalog_mod.load_catalog(conf.gpu.catalog_files)
    except exceptions.GpuError as e:
        problem = '[gpu] catalog_files: %s' % describe_error(e)
        raise ConfigError(problem) from e
    for name, value in (overrides or {}).items():
        conf.set_override(name, value)
    logging.setup(conf, PROJECT)
    # After logging is set up: the deprecation warnings oslo.config logs
    # as it reads an option are then logged as usual.
    _read_every_option(conf)
    return conf


def prepare(argv, prog, **kwargs):
    """``configure``; a configuration that cannot be used ends the
    program (SystemExit: one line on stderr, exit status 1).
    """
    try:
        return configure(argv, prog, **kwargs)
    except ConfigError as e:
        raise SystemExit(error_line(prog, e)) from None


def stop_on_signals():
    """An Event set when the process gets SIGTERM or SIGINT."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    return stop
