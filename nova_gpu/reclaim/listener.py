"""The reclaimer's notification endpoint: GPU reports and Nova's refusals.

One listener, in the reclaimer's own pool (``[gpu_reclaimer] pool``), on
two targets: the agents' report topic (every host's GPU state) and Nova's
versioned notifications topic, where only
``compute_task.build_instances.error`` is read (sent at priority ERROR).
Like the other nova-gpu endpoints it never raises: a bad message is
logged at WARNING and dropped.
"""

from oslo_log import log as logging
import oslo_messaging as messaging

from nova_gpu.core import report as report_mod
from nova_gpu.reclaim import events

LOG = logging.getLogger(__name__)


def _shown(value):
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= 100 else text[:97] + '...'


class Endpoint:
    filter_rule = messaging.NotificationFilter(
        event_type='^(%s)$' % '|'.join(
            e.replace('.', r'\.') for e in (report_mod.EVENT_TYPE,
                                            events.BUILD_ERROR)))

    def __init__(self, store, on_refusal):
        self.store = store
        self.on_refusal = on_refusal

    def _handle(self, publisher_id, event_type, payload):
        try:
            if event_type == report_mod.EVENT_TYPE:
                self.store.ingest(payload)
            elif event_type == events.BUILD_ERROR:
                refused = events.refused_request(payload)
                if refused is not None:
                    self.on_refusal(refused)
        except Exception as e:
            LOG.warning('Dropping %s from %s: %s', event_type,
                        _shown(publisher_id), e)
        return messaging.NotificationResult.HANDLED

    def info(self, ctxt, publisher_id, event_type, payload, metadata):
        return self._handle(publisher_id, event_type, payload)

    def error(self, ctxt, publisher_id, event_type, payload, metadata):
        return self._handle(publisher_id, event_type, payload)


def listener(transport, endpoint, conf):
    o = conf.gpu_reclaimer
    targets = [messaging.Target(topic=o.report_topic,
                                exchange=o.report_exchange),
               messaging.Target(topic=o.nova_topic, exchange=o.nova_exchange)]
    return messaging.get_notification_listener(
        transport, targets, [endpoint], executor='threading', pool=o.pool)
