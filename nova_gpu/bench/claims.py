"""Counting the claims Nova's scheduler makes, for the benches.

Nova's ``SchedulerManager._schedule`` claims candidate 0 of each host it
tries through ``nova.scheduler.utils.claim_resources``; Placement refuses
a claim when a concurrent request took the room since it offered it.
``counted`` wraps that function while it is entered.
"""

import contextlib
import threading
from unittest import mock


class Claims:
    """Claims tried and refused (thread-safe counts)."""

    def __init__(self):
        self.tried = 0
        self.refused = 0
        self._lock = threading.Lock()

    def add(self, held):
        with self._lock:
            self.tried += 1
            self.refused += not held


@contextlib.contextmanager
def counted(tally):
    """Within it, every claim Nova makes is added to ``tally`` (one of
    ``Claims`` or anything with ``add(held)``).
    """
    from nova.scheduler import utils
    real = utils.claim_resources

    def claim(*args, **kwargs):
        held = False
        try:
            held = real(*args, **kwargs)
            return held
        finally:
            tally.add(held)
    with mock.patch.object(utils, 'claim_resources', claim):
        yield tally
