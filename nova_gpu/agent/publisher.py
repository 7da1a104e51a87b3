"""Send host GPU reports over oslo.messaging, losing none.

Each report is first written to an outbox directory (one file each,
``nova_gpu.atomic_file``: whole and on disk before it counts as queued, so
a power cut never leaves an empty or cut-short report), then sent, oldest
first, as a ``messagingv2`` notification on ``<topic>.info``.
oslo.messaging's Notifier and its drivers log and drop a send that failed,
so the agent hands the envelope to the notification transport itself (what
the ``messagingv2`` driver does, minus swallowing the error). A report
leaves the outbox only once the transport took it; while the broker is
down reports stay there and go out, in order, on the next ``flush``. Use
durable queues (``[oslo_messaging_rabbit] amqp_durable_queues``) so that
what the broker accepted survives its restart. Consumers see at-least-once
delivery and keep the newest ``generation`` per host.

``publish`` sends from a thread of its own and waits for it at most
``send_timeout`` seconds: a broker that keeps its connections open and
answers nothing (a SIGSTOPped RabbitMQ node) holds that thread, not the
agent's cycle, whose device management and provider config go on. While
that send is stuck no other starts; the reports wait in the outbox and go
out, in order, once the broker takes the first.
"""

import datetime
import json
import os
import threading
import time
import uuid

from oslo_log import log as logging
import oslo_messaging

from nova_gpu import atomic_file
from nova_gpu.core import report as report_mod
from nova_gpu import listening

LOG = logging.getLogger(__name__)
# Most seconds an agent cycle waits for the broker to take its reports
# (and ``close`` for the transport to close).
SEND_TIMEOUT = 20


class ReportPublisher:
    def __init__(self, conf, topic, outbox_dir, outbox_max=100, url=None,
                 publisher_id=report_mod.PUBLISHER, retry=1, exchange=None,
                 send_timeout=SEND_TIMEOUT):
        self.transport = listening.transport(conf, url=url)
        # exchange None: the transport's control_exchange
        self.target = oslo_messaging.Target(topic='%s.info' % topic,
                                            exchange=exchange)
        self.outbox_dir = outbox_dir
        self.outbox_max = outbox_max
        self.publisher_id = publisher_id
        self.retry = retry
        self.send_timeout = send_timeout
        # One flush at a time; the background one of ``publish``.
        self._flushing = threading.Lock()
        self._sender = None
        self._sent = None   # what the last background flush returned
        os.makedirs(outbox_dir, exist_ok=True)

    def close(self):
        """Close the transport, waiting at most ``send_timeout`` s (a
        send stuck on a hung broker holds the connection).
        """
        closing = threading.Thread(target=self.transport.cleanup,
                                   name='nova-gpu-report-close', daemon=True)
        closing.start()
        closing.join(self.send_timeout)

    def pending(self):
        return sorted(n for n in os.listdir(self.outbox_dir)
                      if n.endswith('.json'))

    def publish(self, report):
        """Queue ``report`` and send what the broker takes; return how many
        reports are still waiting.
        """
        name = '%020d-%s.json' % (report.get('generation', 0),
                                  uuid.uuid4().hex[:8])
        atomic_file.write_json(os.path.join(self.outbox_dir, name), report)
        self._trim()
        return self._flush_within(self.send_timeout)

    def _trim(self):
        names = self.pending()
        for name in names[:max(0, len(names) - self.outbox_max)]:
            LOG.warning('dropping unsent GPU report %s: outbox full and a '
                        'newer report supersedes it', name)
            _unlink(os.path.join(self.outbox_dir, name))

    def _flush_within(self, timeout):
        """Flush from the background thread, waiting at most ``timeout``
        s; how many reports are still waiting.

        A flush still running from an earlier cycle is waited for first
        (within the same time): it read the outbox before the newest
        report was in it.
        """
        deadline = time.monotonic() + timeout
        for _ in range(2):
            sender, fresh = self._background()
            sender.join(max(0.0, deadline - time.monotonic()))
            if sender.is_alive():
                pending = len(self.pending())
                LOG.warning('the broker has not taken the GPU reports in '
                            '%g s; %d kept in the outbox, sent once it '
                            'answers', timeout, pending)
                return pending
            if fresh:
                return self._sent
        return len(self.pending())

    def _background(self):
        """(the flush thread, whether it started now)."""
        sender = self._sender
        if sender is not None and sender.is_alive():
            return sender, False
        sender = self._sender = threading.Thread(
            target=self._flush_in_background, name='nova-gpu-report-send',
            daemon=True)
        sender.start()
        return sender, True

    def _flush_in_background(self):
        try:
            self._sent = self.flush()
        except Exception:  # the next cycle tries again
            LOG.exception('sending the GPU reports failed')
            self._sent = len(self.pending())

    def flush(self):
        """Send the outbox, oldest first, until the transport refuses one;
        how many reports are still waiting.
        """
        with self._flushing:
            return self._flush()

    def _flush(self):
        names = self.pending()
        for n, name in enumerate(names):
            path = os.path.join(self.outbox_dir, name)
            try:
                with open(path) as f:
                    payload = json.load(f)
            except FileNotFoundError:
                continue  # trimmed meanwhile: a newer report supersedes it
            except ValueError as e:
                # Not one ``publish`` wrote (those are written whole): left
                # by an older agent cut short by a power cut. It would hold
                # back every later report; a newer one supersedes it.
                LOG.warning('dropping unreadable GPU report %s: %s', path, e)
                _unlink(path)
                continue
            message = {
                'message_id': str(uuid.uuid4()),
                'publisher_id': self.publisher_id,
                'event_type': report_mod.EVENT_TYPE,
                'priority': 'INFO',
                'payload': payload,
                'timestamp': str(datetime.datetime.utcnow()),
            }
            try:
                # The transport's notification send is what the messagingv2
                # driver calls; unlike the driver it lets failures raise.
                self.transport._send_notification(
                    self.target, {}, message, version=2.0, retry=self.retry)
            except Exception as e:
                LOG.warning('GPU report not sent (%s); %d kept for later',
                            e, len(names) - n)
                return len(names) - n
            _unlink(path)
        return 0


def _unlink(path):
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass  # the flush sent it, or the cycle trimmed it, meanwhile
