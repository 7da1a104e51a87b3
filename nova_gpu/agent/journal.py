"""The agent's durable intent journal.

A device change that takes several steps (define then start an mdev,
create a MIG GPU instance then its compute instance, write a VF's vGPU
type then read it back) can be cut short by a crash, a SIGKILL or a power
cut. Before the first step the device manager records what it is about to
do (an *intent*); after the last step it records completion (the intent
is dropped). An intent still in the journal whose owner process is gone
was cut short: reconcile rolls it back at the next start.

The journal also keeps, for reconcile, when each unused device was first
seen unused (the orphan grace clock), in wall-clock seconds, so that the
grace period survives agent restarts.

The file is JSON, rewritten whole on every change by
``nova_gpu.atomic_file`` (a temporary file, fsync'd, renamed over the old
one, the directory fsync'd), so a reader, even after a power cut, sees
either the old or the new content. Writers in several
processes (the service and the ``nova-gpu`` CLI) take an inter-process
lock around read-modify-write. A journal that cannot be read (corrupt,
truncated, wrong structure) is moved aside with a WARNING and the agent
starts from an empty one: reconcile's orphan pass still reclaims what an
intent would have named, after the grace period.
"""

import contextlib
import json
import os
import threading
import time
import uuid as uuid_mod

from oslo_concurrency import lockutils
from oslo_log import log as logging

from nova_gpu import atomic_file

LOG = logging.getLogger(__name__)

VERSION = 1
FILE_NAME = 'journal.json'
# The intents a device manager records; reconcile knows how to undo each.
OPS = ('mdev_create', 'mdev_remove', 'vf_create', 'vf_remove',
       'mig_create', 'mig_remove', 'mig_mode')


def _proc_start(pid):
    """Start time of process ``pid`` (clock ticks since boot), or None.

    With the pid it names one process even after the pid is reused.
    """
    try:
        with open('/proc/%d/stat' % pid) as f:
            stat = f.read()
    except OSError:
        return None
    # the command name (field 2) may hold spaces: split after its ')'
    fields = stat.rpartition(')')[2].split()
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


def this_process():
    pid = os.getpid()
    return {'pid': pid, 'start': _proc_start(pid)}


def owner_alive(owner):
    """Whether the process that recorded an intent still runs."""
    if not isinstance(owner, dict) or not isinstance(owner.get('pid'), int):
        return False
    start = _proc_start(owner['pid'])
    return start is not None and start == owner.get('start')


def _empty():
    return {'version': VERSION, 'intents': {}, 'first_seen': {}}


class JournalError(ValueError):
    """The journal file does not hold a journal (names the problem)."""


def _check(doc, path):
    """Validate the structure of a loaded journal; raise JournalError."""
    if not isinstance(doc, dict):
        raise JournalError('%s: top level is %s, not an object'
                           % (path, type(doc).__name__))
    if doc.get('version') != VERSION:
        raise JournalError('%s: unsupported version %r (expected %d)'
                           % (path, doc.get('version'), VERSION))
    intents = doc.get('intents')
    if not isinstance(intents, dict):
        raise JournalError('%s: "intents" is not an object' % path)
    for key, intent in intents.items():
        if not isinstance(intent, dict) or intent.get('op') not in OPS \
                or not isinstance(intent.get('args'), dict):
            raise JournalError('%s: intent %s is malformed (needs "op" in '
                               '%s and "args" object)'
                               % (path, key, ', '.join(OPS)))
    seen = doc.get('first_seen')
    if not isinstance(seen, dict) or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool)
            for v in seen.values()):
        raise JournalError('%s: "first_seen" is not an object of numbers'
                           % path)
    return doc


class Journal:
    """Intents and first-seen times, in ``path`` (None: memory only)."""

    def __init__(self, path=None, clock=time.time):
        self.path = path
        self.clock = clock
        self._mem = _empty()
        self._tlock = threading.RLock()
        if path:
            os.makedirs(os.path.dirname(os.path.abspath(path)),
                        exist_ok=True)
            self._plock = lockutils.InterProcessLock(path + '.lock')
            with self._locked():
                self._load()

    @classmethod
    def in_dir(cls, state_dir, **kw):
        return cls(os.path.join(state_dir, FILE_NAME) if state_dir
                   else None, **kw)

    # -- storage ----------------------------------------------------------

    @contextlib.contextmanager
    def _locked(self):
        with self._tlock:
            if self.path:
                with self._plock:
                    yield
            else:
                yield

    def _load(self):
        if not self.path:
            return self._mem
        try:
            with open(self.path, 'rb') as f:
                raw = f.read()
        except FileNotFoundError:
            return _empty()
        try:
            return _check(json.loads(raw.decode('utf-8')), self.path)
        except (ValueError, UnicodeDecodeError) as e:
            aside = '%s.corrupt-%d' % (self.path, int(self.clock()))
            LOG.warning('intent journal %s cannot be read (%s); moved to '
                        '%s and starting from an empty journal: devices '
                        'it named are reclaimed by the orphan pass after '
                        'the grace period', self.path, e, aside)
            atomic_file.rename(self.path, aside)
            return _empty()

    def _save(self, doc):
        if not self.path:
            self._mem = doc
            return
        # 0o600: the journal is the agent's own (as it always was).
        atomic_file.write_json(self.path, doc, mode=0o600, sort_keys=True)

    @contextlib.contextmanager
    def _change(self):
        with self._locked():
            doc = self._load()
            yield doc
            self._save(doc)

    def snapshot(self):
        with self._locked():
            return json.loads(json.dumps(self._load()))

    # -- intents ----------------------------------------------------------

    def begin(self, op, **args):
        """Record that ``op`` is about to change a device; return its id."""
        if op not in OPS:
            raise ValueError('unknown journal operation %r' % (op,))
        key = uuid_mod.uuid4().hex
        with self._change() as doc:
            doc['intents'][key] = {'op': op, 'args': args,
                                   'owner': this_process(),
                                   'time': self.clock()}
        return key

    def update(self, key, **args):
        """Add what a step learnt (e.g. the GPU instance id) to an intent."""
        with self._change() as doc:
            intent = doc['intents'].get(key)
            if intent is not None:
                intent['args'].update(args)

    def release(self, key):
        """The operation failed and could not undo itself.

        The intent goes to reconcile, as if its process had died.
        """
        with self._change() as doc:
            intent = doc['intents'].get(key)
            if intent is not None:
                intent['owner'] = None

    def done(self, key):
        """The operation finished (or was undone): forget the intent."""
        with self._change() as doc:
            doc['intents'].pop(key, None)

    def intents(self):
        return self.snapshot()['intents']

    def abandoned(self):
        """Intents whose owner process is gone, oldest first."""
        found = [(k, v) for k, v in self.intents().items()
                 if not owner_alive(v.get('owner'))]
        return sorted(found, key=lambda kv: kv[1].get('time', 0))

    def in_flight(self):
        """Args of intents whose owner still runs (keep away from them)."""
        return [v for v in self.intents().values()
                if owner_alive(v.get('owner'))]

    # -- orphan grace clock -----------------------------------------------

    def first_seen(self, scope, keys, now=None):
        """First-seen times of the unused devices ``keys`` of ``scope``.

        Keys are ``<scope>:<device>``. Keys seen for the first time get
        ``now``; keys of ``scope`` no longer given (the device is in use
        again or gone) are forgotten. Returns ``{key: first seen}``.
        """
        now = self.clock() if now is None else now
        prefix = scope + ':'
        keys = {prefix + k for k in keys}
        with self._locked():
            doc = self._load()
            seen = doc['first_seen']
            new = {k: v for k, v in seen.items()
                   if not k.startswith(prefix)}
            new.update({k: seen.get(k, now) for k in keys})
            if new != seen:
                doc['first_seen'] = new
                self._save(doc)
        return {k[len(prefix):]: new[k] for k in keys}

    def forget_seen(self, key):
        with self._change() as doc:
            doc['first_seen'].pop(key, None)
