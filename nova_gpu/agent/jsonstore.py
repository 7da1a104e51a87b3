"""Small JSON records in the agent's state directory.

What the agent (and the ``qemu`` hook, as root) must find again after a
reboot: which PFs had SR-IOV VFs enabled (``nova_gpu.agent.sriov``), the
vGPU type each VF carried (``nova_gpu.agent.vf_types``) and the MIG mode
the agent set (``nova_gpu.agent.carver``). Each record is one JSON file,
rewritten whole by ``nova_gpu.atomic_file`` (a temporary file, fsync'd,
renamed over the old one, the directory fsync'd), so a reader sees the old
or the new content, never half of it, even after a power cut.
Writers in several processes (the agent, ``nova-gpu-restore``, the hook)
take an inter-process lock around read-modify-write. A file that cannot
be read is moved aside with a warning and the record starts empty: a
restore then makes less, never something wrong.

Files made by root (the hook) are given to the owner of the state
directory, so that the agent, running as another user, can still lock
and replace them.
"""

import contextlib
import json
import os

from oslo_concurrency import lockutils
from oslo_log import log as logging

from nova_gpu import atomic_file

LOG = logging.getLogger(__name__)


def _dir_owner(path):
    """``(uid, gid)`` of the directory of ``path`` when root writes in a
    directory root does not own, else None (the file stays the writer's).
    """
    if os.geteuid() != 0:
        return None
    st = os.stat(os.path.dirname(os.path.abspath(path)))
    if st.st_uid != 0 or st.st_gid != 0:
        return st.st_uid, st.st_gid
    return None


def _give_to_dir_owner(path):
    owner = _dir_owner(path)
    if owner is not None:
        os.chown(path, *owner)


class JsonStore:
    """``{"version": N, <key>: {...}}`` in ``<state_dir>/<name>``.

    ``state_dir`` None or empty keeps the record in memory only.
    """

    def __init__(self, state_dir, name, key, version=1):
        self.path = os.path.join(state_dir, name) if state_dir else None
        self.key = key
        self.version = version
        self._mem = {}
        self._lock = (lockutils.InterProcessLock(self.path + '.lock')
                      if self.path else None)

    @contextlib.contextmanager
    def _locked(self):
        if self._lock is None:
            yield
            return
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        lock_path = self.path + '.lock'
        if not os.path.exists(lock_path):
            os.close(os.open(lock_path, os.O_WRONLY | os.O_CREAT, 0o644))
            _give_to_dir_owner(lock_path)
        with self._lock:
            yield

    def _read(self):
        if self.path is None:
            return json.loads(json.dumps(self._mem))
        try:
            with open(self.path, encoding='utf-8') as f:
                doc = json.load(f)
            if not isinstance(doc, dict) or \
                    doc.get('version') != self.version:
                raise ValueError('unsupported version %r' % (
                    doc.get('version') if isinstance(doc, dict) else doc,))
            data = doc.get(self.key)
            if not isinstance(data, dict):
                raise ValueError('"%s" is not an object' % self.key)
            return data
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as e:
            aside = self.path + '.bad'
            LOG.warning('%s cannot be read (%s): moved to %s, starting '
                        'from an empty record', self.path, e, aside)
            try:
                atomic_file.rename(self.path, aside)
            except OSError:
                pass
            return {}

    def _write(self, data):
        if self.path is None:
            self._mem = json.loads(json.dumps(data))
            return
        # Given to the directory's owner before it takes the record's
        # name, so the agent never sees a record of root's.
        atomic_file.write_json(
            self.path, {'version': self.version, self.key: data},
            owner=_dir_owner(self.path), indent=1, sort_keys=True)

    def load(self):
        """The record (a dict); empty when there is none."""
        with self._locked():
            return self._read()

    @contextlib.contextmanager
    def change(self):
        """Read, let the caller change the dict, write it back (locked)."""
        with self._locked():
            data = self._read()
            before = json.dumps(data, sort_keys=True)
            yield data
            if json.dumps(data, sort_keys=True) != before:
                self._write(data)
