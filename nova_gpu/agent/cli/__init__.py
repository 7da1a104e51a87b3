"""nova-gpu: GPU helper for compute hosts, with or without Nova.

Lists GPUs and free profiles, creates and removes devices (mdev, NVIDIA
vendor VFIO vGPU, MIG) and attaches them to libvirt domains. A cliff
application: the commands are the ``nova_gpu.cli`` entry points, and the
tables take cliff's ``-f table|json|yaml|csv|value``. Reads the same
oslo.config file as nova-gpu-agent; ``--libvirt-uri`` and
``--sysfs-root`` override it.

A failure prints one line, ``nova-gpu: error: <what went wrong>``, as the
last line on stderr, and exits 1; ``--debug`` adds the traceback.
Warnings about retried libvirt calls show only with ``--verbose``.
"""

import argparse
from importlib import metadata
import logging as std_logging
import sys
import traceback

from cliff import app
from cliff import commandmanager
from oslo_config import cfg

from nova_gpu.agent import service
from nova_gpu.core import exceptions
from nova_gpu import daemon

NAME = 'nova-gpu'
NAMESPACE = 'nova_gpu.cli'
# What a command can fail with that the user can act on: one line each.
# (cfg.Error: a missing or bad config file or value, daemon.ConfigError
# among them; OSError: sysfs, privsep, files; GpuError: the agent's errors
# and the catalog's, and base.UnknownColumn.)
EXPECTED_ERRORS = (exceptions.GpuError, cfg.Error, OSError)
# Retries of libvirt calls are routine; the final error names the cause.
RETRY_LOGGERS = ('nova_gpu.agent.libvirt_host',)


def _version():
    try:
        return metadata.version(NAME)
    except metadata.PackageNotFoundError:  # pragma: no cover
        return 'unknown'


class NovaGpuApp(app.App):
    """The application: global options, the agent, one-line errors."""

    NAME = NAME
    LOG = std_logging.getLogger(NAME)

    def __init__(self, stdout=None, stderr=None):
        super().__init__(
            description=__doc__.split('\n')[0], version=_version(),
            command_manager=commandmanager.CommandManager(NAMESPACE),
            stdout=stdout, stderr=stderr)
        self._agent = None

    def build_option_parser(self, description, version,
                            argparse_kwargs=None):
        # 'resolve': our -d/--debug replaces cliff's --debug.
        parser = super().build_option_parser(
            description, version, dict(argparse_kwargs or {},
                                       conflict_handler='resolve'))
        parser.add_argument('--config-file', action='append', default=[],
                            help='oslo.config file (as for nova-gpu-agent); '
                                 'may be repeated')
        parser.add_argument('--libvirt-uri',
                            help='libvirt URI (qemu:///system)')
        parser.add_argument('--sysfs-root', help=argparse.SUPPRESS)
        parser.add_argument('--no-nvml', action='store_true',
                            help='do not use NVML even if the driver is '
                                 'present')
        parser.add_argument('--json', action='store_true',
                            help='print the whole result as JSON (what '
                                 'the agent knows, beyond the columns '
                                 'that -f json prints)')
        parser.add_argument('-d', '--debug', action='store_true',
                            help='log DEBUG messages; print the traceback '
                                 'of an error')
        return parser

    @property
    def verbose(self):
        """``-v``: INFO messages and retried libvirt calls."""
        return self.options.verbose_level > self.DEFAULT_VERBOSE_LEVEL

    def configure_logging(self):
        # oslo.log sets logging up when a command opens the agent (the
        # config file may set it); cliff's console handler would print
        # every line twice.
        pass

    def interact(self):
        # No interactive shell: a command is required, as it always was.
        self.parser.error('a command is required (see %s help)' % NAME)

    def _configure(self):
        opts = self.options
        overrides = {}
        if opts.debug:
            overrides['debug'] = True
        if opts.log_file:  # cliff's option, written by oslo.log
            overrides['log_file'] = opts.log_file
        conf = service.configure(NAME, config_files=opts.config_file or None,
                                 overrides=overrides)
        if not opts.debug:
            std_logging.getLogger().setLevel(
                std_logging.INFO if self.verbose else std_logging.WARNING)
        if not (self.verbose or opts.debug):
            for name in RETRY_LOGGERS:
                std_logging.getLogger(name).setLevel(std_logging.ERROR)
        if opts.libvirt_uri:
            conf.set_override('libvirt_uri', opts.libvirt_uri, 'gpu_agent')
        if opts.sysfs_root:
            conf.set_override('sysfs_root', opts.sysfs_root, 'gpu_agent')
        if opts.no_nvml:
            conf.set_override('use_nvml', False, 'gpu_agent')
        return conf

    @property
    def agent(self):
        """The host's agent, made (configuration read) at first use."""
        if self._agent is None:
            conf = self._configure()
            from nova_gpu.agent import agent as agent_mod
            agent = agent_mod.Agent(conf)
            try:
                # A root without a PCI bus is a wrong --sysfs-root or
                # [gpu_agent] sysfs_root, not a host without GPUs.
                agent.sysfs.check()
            except BaseException:
                agent.close()
                raise
            self._agent = agent
        return self._agent

    def clean_up(self, cmd, result, err):
        if self._agent is not None:
            self._agent.close()
            self._agent = None

    def fail(self, e):
        """Print ``e`` as the last stderr line; the exit status (1)."""
        expected = isinstance(e, EXPECTED_ERRORS)
        if self.options.debug or not expected:
            # Not expected: a bug, whose traceback is the report.
            traceback.print_exception(e, file=self.stderr)
        for handler in std_logging.getLogger().handlers:
            handler.flush()  # log lines first: the error is the last line
        text = daemon.describe_error(e) if expected else '%s: %s' % (
            type(e).__name__, daemon.printable(e))
        self.stderr.write('%s: error: %s\n' % (NAME, text))
        self.stderr.flush()
        return 1


def main(argv=None):
    return NovaGpuApp().run(sys.argv[1:] if argv is None else argv)
