"""A bounded queue of notifications, sent by one background thread.

A service that must never wait on a broker (nova-scheduler's GPU filter,
nova-gpu-agent's cycle) hands each message to ``SendQueue.submit``, which
never blocks. A send cannot be bounded from outside (oslo.messaging's
notifier has no per-send timeout, and a RabbitMQ node stopped with its
connections open answers nothing, so a publish waits for a confirm that
does not come): the queue's thread may wait on a hung broker, the
service does not. When the queue is full the oldest message is dropped,
because the newest describe the present. Dropped and failed sends are
counted (``stats``) and logged at WARNING at most once per
``WARN_INTERVAL``. The thread is made at the first submit with what
``threading`` is then: an OS thread in Nova's native threading mode, a
green thread where eventlet patched the process.
"""

import collections
import threading
import time

from oslo_log import log as logging

LOG = logging.getLogger(__name__)
# Least seconds between two WARNINGs about dropped or failed sends.
WARN_INTERVAL = 60


class SendQueue:
    """Sends queued notifications from one background thread.

    ``submit`` never blocks: it queues (dropping the oldest message when
    the queue holds ``capacity``: an int, or a callable read at each
    submit so that a configuration option can set it) and wakes the
    thread. ``label`` names the messages in the thread's name and the
    log.
    """

    def __init__(self, capacity, label='GPU notifications',
                 clock=time.monotonic):
        self._capacity = capacity
        self.label = label
        self._clock = clock
        self._queue = collections.deque()
        # Held for queue and counter updates only, never across a send.
        self._lock = threading.Lock()
        self._wake = None
        self._thread = None
        self._stopping = False
        self.counts = dict.fromkeys(('queued', 'sent', 'dropped', 'failed'),
                                    0)
        # When the message being sent was taken off the queue (None: idle).
        self.sending_since = None
        # When the last WARNING was logged; whether a send was lost since.
        self._warned_at = None
        self._degraded = False
        self._last_error = None

    @property
    def capacity(self):
        capacity = self._capacity
        return capacity() if callable(capacity) else capacity

    def submit(self, notifier, event_type, payload):
        """Queue one message for ``notifier``; True (queued)."""
        self._running()
        capacity = self.capacity
        with self._lock:
            dropped = len(self._queue) >= capacity
            while len(self._queue) >= capacity:
                self._queue.popleft()
                self.counts['dropped'] += 1
            self._queue.append((notifier, event_type, payload))
            self.counts['queued'] += 1
        self._wake.set()
        if dropped:
            self._warn()
        return True

    def _running(self):
        """Start the thread unless it runs (or another caller starts it)."""
        thread = self._thread
        if thread is not None and (thread.ident is None or
                                   thread.is_alive()):
            return
        with self._lock:
            thread = self._thread
            if thread is not None and (thread.ident is None or
                                       thread.is_alive()):
                return
            self._stopping = False
            self._wake = threading.Event()
            thread = self._thread = threading.Thread(
                target=self._run, args=(self._wake,),
                name='nova-gpu: %s' % self.label, daemon=True)
        # Outside the lock: under eventlet, start() yields to the new
        # green thread, which takes the lock.
        try:
            thread.start()
        except Exception:
            with self._lock:
                self._thread = None
            raise

    def _take(self):
        with self._lock:
            if not self._queue:
                return None
            self.sending_since = self._clock()
            return self._queue.popleft()

    def _run(self, wake):
        while True:
            # Cleared before the queue is read: a message queued after
            # the last read sets it again, and the wait returns at once.
            wake.clear()
            item = self._take()
            while item is not None:
                self._deliver(*item)
                item = self._take()
            if self._stopping:
                return
            wake.wait()

    def _deliver(self, notifier, event_type, payload):
        try:
            notifier.info({}, event_type, payload)
        except Exception as e:  # counted and logged, the next one goes
            with self._lock:
                self.counts['failed'] += 1
            self._last_error = '%s not sent: %s' % (event_type, e)
            self._warn()
            return
        finally:
            with self._lock:
                self.sending_since = None
        with self._lock:
            self.counts['sent'] += 1
        if self._degraded:
            self._recovered()

    def _warn(self):
        now = self._clock()
        if self._warned_at is not None and \
                now - self._warned_at < WARN_INTERVAL:
            return
        self._warned_at, self._degraded = now, True
        LOG.warning('%(label)s: %(dropped)d dropped (queue of '
                    '%(capacity)d full), %(failed)d failed, %(sent)d sent '
                    'since start; %(pending)d queued; the send in '
                    'progress has waited %(sending_s).0f s on the broker; '
                    'last error: %(error)s. The service does not wait for '
                    'them.', dict(self.stats(), label=self.label,
                                  error=self._last_error or 'none'))

    def _recovered(self):
        self._degraded = False
        LOG.info('%(label)s sent again (%(dropped)d dropped, '
                 '%(failed)d failed since start)',
                 dict(self.stats(), label=self.label))

    def stats(self):
        """The counters: queued, sent, dropped, failed (since start),
        pending (queued now), sending_s (how long the send in progress
        has waited), capacity.
        """
        with self._lock:
            counts = dict(self.counts, pending=len(self._queue))
            since = self.sending_since
        counts['sending_s'] = self._clock() - since if since else 0.0
        counts['capacity'] = self.capacity
        return counts

    def flush(self, timeout):
        """Wait up to ``timeout`` s for the queue to be sent; whether it
        was (tools and tests).
        """
        deadline = self._clock() + timeout
        while True:
            with self._lock:
                if not self._queue and self.sending_since is None:
                    return True
            if self._clock() >= deadline:
                return False
            time.sleep(0.01)

    def stop(self, timeout):
        """Send what is queued within ``timeout`` s, then end the thread
        (whatever is left is dropped with the process).
        """
        with self._lock:
            thread, self._stopping = self._thread, True
            wake = self._wake
        if thread is None:
            return True
        wake.set()
        thread.join(timeout)
        return not thread.is_alive()
