"""Send host GPU reports over oslo.messaging, losing none.

Each report is first written to an outbox directory, then sent, oldest
first, as a ``messagingv2`` notification on ``<topic>.info``.
oslo.messaging's Notifier and its drivers log and drop a send that failed,
so the agent hands the envelope to the notification transport itself (what
the ``messagingv2`` driver does, minus swallowing the error). A report
leaves the outbox only once the transport took it; while the broker is
down reports stay there and go out, in order, on the next ``flush``. Use
durable queues (``[oslo_messaging_rabbit] amqp_durable_queues``) so that
what the broker accepted survives its restart. Consumers see at-least-once
delivery and keep the newest ``generation`` per host.
"""

import datetime
import json
import os
import uuid

from oslo_log import log as logging
import oslo_messaging

from nova_gpu.core import report as report_mod

LOG = logging.getLogger(__name__)


class ReportPublisher:
    def __init__(self, conf, topic, outbox_dir, outbox_max=100, url=None,
                 publisher_id=report_mod.PUBLISHER, retry=1, exchange=None):
        self.transport = oslo_messaging.get_notification_transport(
            conf, url=url)
        # exchange None: the transport's control_exchange
        self.target = oslo_messaging.Target(topic='%s.info' % topic,
                                            exchange=exchange)
        self.outbox_dir = outbox_dir
        self.outbox_max = outbox_max
        self.publisher_id = publisher_id
        self.retry = retry
        os.makedirs(outbox_dir, exist_ok=True)

    def close(self):
        self.transport.cleanup()

    def pending(self):
        return sorted(n for n in os.listdir(self.outbox_dir)
                      if n.endswith('.json'))

    def publish(self, report):
        """Queue ``report`` and send what the broker takes; return how many
        reports are still waiting.
        """
        name = '%020d-%s.json' % (report.get('generation', 0),
                                  uuid.uuid4().hex[:8])
        tmp = os.path.join(self.outbox_dir, '.' + name)
        with open(tmp, 'w') as f:
            json.dump(report, f)
        os.rename(tmp, os.path.join(self.outbox_dir, name))
        self._trim()
        return self.flush()

    def _trim(self):
        names = self.pending()
        for name in names[:max(0, len(names) - self.outbox_max)]:
            LOG.warning('dropping unsent GPU report %s: outbox full and a '
                        'newer report supersedes it', name)
            os.unlink(os.path.join(self.outbox_dir, name))

    def flush(self):
        names = self.pending()
        for n, name in enumerate(names):
            path = os.path.join(self.outbox_dir, name)
            with open(path) as f:
                payload = json.load(f)
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
            os.unlink(path)
        return 0
