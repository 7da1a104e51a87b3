"""GPU usage for billing in nova-gpu-exporter: the ledger, kept on disk.

``UsageBook`` feeds every host report the exporter takes
(``CloudState.report_observers``) to the core's ``usage.Ledger`` (the
accounting rule, ``nova_gpu.core.usage``), with the time the exporter
took it. Every ``[gpu_exporter] usage_write_interval`` seconds (and when
the exporter stops) it:

1. asks Nova the project of each server it has not placed yet
   (``NovaProjects``, openstacksdk);
2. forgets what is older than ``usage_retention_days``;
3. writes the ledger whole (``nova_gpu.atomic_file``) to
   ``[gpu_exporter] usage_ledger``;
4. publishes that copy: ``/metrics`` and ``/v1/usage`` serve the ledger
   as last written, never more. A crash then cannot make a counter go
   back (Prometheus would read a reset and count it all again): what was
   served is on disk, and the next exporter resumes from it.

A host's first observation after a restart counts from its last
observation written, by the core's rule: the whole time when the same
server still holds the device, at most ``usage_max_interval`` when it is
gone.
"""

import os
import threading
import time

from oslo_log import log as logging

from nova_gpu import atomic_file
from nova_gpu import cloud_api
from nova_gpu.core import usage as usage_mod

LOG = logging.getLogger(__name__)
# Servers whose project is asked from Nova in one write (the rest wait
# for the next).
RESOLVE_BATCH = 200
# Seconds between two log lines about the same failing call.
LOG_EVERY = 60


class NovaProjects:
    """The project of a server, from Nova (openstacksdk, all projects).

    ``connect``: returns an openstacksdk ``Connection``; called when
    first needed and again after a failure. Returns None when Nova cannot
    say now (unreachable, or the server is gone and no deleted record is
    readable): it is asked again at the next write.
    """

    def __init__(self, connect):
        self._connect = connect
        self._conn = None
        self._logged = 0.0

    def __call__(self, server_id):
        try:
            if self._conn is None:
                self._conn = self._connect()
            return cloud_api.Nova(self._conn.compute).project_of(server_id)
        except Exception as e:
            self._conn = None
            now = time.monotonic()
            if now - self._logged > LOG_EVERY:
                self._logged = now
                LOG.warning('cannot read the project of server %s from '
                            'Nova (usage is counted, its project_id '
                            'label waits): %s', server_id, e)
            return None


def connect(cloud):
    """An openstacksdk connection to ``cloud`` (None: OS_* environment)."""
    return cloud_api.connect(cloud)


class UsageBook:
    """The exporter's usage ledger: fed by reports, written, published."""

    def __init__(self, path=None, max_interval=180, retention_days=400,
                 write_interval=60, projects=None, clock=time.time):
        self.path = path
        self.write_interval = write_interval
        self.projects = projects
        self.clock = clock
        self._retention = retention_days * usage_mod.DAY
        self._max_interval = max_interval
        self._lock = threading.Lock()
        self.ledger = self._load()
        self._published = self.ledger.copy()
        self.unattributed = {}     # host -> devices of no known server
        self.last_write = None     # when the ledger was last written
        self.write_errors = 0
        self._stop = threading.Event()
        self._thread = None

    def _load(self):
        if not self.path:
            LOG.warning('[gpu_exporter] usage_ledger is not set: GPU usage '
                        'is kept in memory only and starts again from 0 '
                        'when nova-gpu-exporter restarts')
            return usage_mod.Ledger(self._max_interval, self._retention)
        try:
            data = atomic_file.read_json(self.path)
        except atomic_file.Unreadable as e:
            # Never start a new ledger over one that cannot be read: the
            # counters would start again from 0 and bill twice.
            raise usage_mod.LedgerError(
                'GPU usage ledger: %s (move it aside to start a new one)'
                % e) from e
        if data is None:
            LOG.info('GPU usage ledger %s: none yet, starting one',
                     self.path)
            return usage_mod.Ledger(self._max_interval, self._retention)
        try:
            return usage_mod.Ledger.from_dict(data, self._max_interval,
                                              self._retention)
        except usage_mod.LedgerError as e:
            raise usage_mod.LedgerError('GPU usage ledger %s: %s (move it '
                                        'aside to start a new one)'
                                        % (self.path, e)) from e

    # -- input ------------------------------------------------------------

    def observe(self, entry):
        """Count a host report the exporter took (a ``HostEntry``)."""
        try:
            held, unattributed = usage_mod.holdings(entry.report, entry.raw)
        except Exception as e:  # a device of a model the catalog lacks
            LOG.warning('GPU usage: report of %s not counted: %s',
                        entry.name, e)
            return
        with self._lock:
            self.ledger.observe(entry.name, entry.received, held)
            self.unattributed[entry.name] = unattributed

    # -- writing ----------------------------------------------------------

    def _resolve(self):
        if self.projects is None:
            return
        with self._lock:
            unknown = self.ledger.unknown_projects()[:RESOLVE_BATCH]
        for server in unknown:  # outside the lock: Nova may be slow
            project = self.projects(server)
            if project:
                with self._lock:
                    self.ledger.set_project(server, project)

    def write(self):
        """Resolve projects, prune, write the ledger and publish it;
        True when written (or nothing to write to).
        """
        self._resolve()
        now = self.clock()
        with self._lock:
            self.ledger.prune(now)
            data = self.ledger.to_dict()
        if self.path:
            try:
                atomic_file.write_json(self.path, data, mode=0o600)
            except OSError as e:
                # What was published stays: it is what is on disk.
                self.write_errors += 1
                LOG.error('GPU usage ledger not written (counters held '
                          'at the last write): %s', e)
                return False
        published = usage_mod.Ledger.from_dict(data, self._max_interval,
                                               self._retention)
        with self._lock:
            self._published = published
            self.last_write = now
        return True

    def published(self):
        """The ledger as last written: what /metrics and /v1 serve."""
        with self._lock:
            return self._published

    # -- lifecycle --------------------------------------------------------

    def start(self):
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name='nova-gpu-usage-ledger')
        self._thread.start()
        return self

    def _run(self):
        while not self._stop.wait(self.write_interval):
            try:
                self.write()
            except Exception:  # the next interval tries again
                LOG.exception('GPU usage ledger write failed')

    def stop(self):
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
        self.write()


def ledger_dir_ok(path):
    """Whether the ledger's directory exists (checked at start)."""
    return os.path.isdir(os.path.dirname(os.path.abspath(path)))
