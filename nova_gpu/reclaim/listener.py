"""The reclaimer's notification endpoint: GPU reports and Nova's refusals.

One listener, in the reclaimer's own pool (``[gpu_reclaimer] pool``), on
two targets: the agents' report topic (every host's GPU state) and Nova's
versioned notifications topic, where only
``compute_task.build_instances.error`` is read (sent at priority ERROR).
Like the other nova-gpu endpoints it never raises: a bad message is
logged at WARNING and dropped (``nova_gpu.listening``).
"""

from oslo_log import log as logging

from nova_gpu.core import report as report_mod
from nova_gpu import listening
from nova_gpu.reclaim import events

LOG = logging.getLogger(__name__)


class Endpoint(listening.Endpoint):
    filter_rule = listening.event_filter((report_mod.EVENT_TYPE,
                                          events.BUILD_ERROR))
    log = LOG

    def __init__(self, store, on_refusal):
        self.store = store
        self.on_refusal = on_refusal

    def handle(self, event_type, payload):
        if event_type == report_mod.EVENT_TYPE:
            self.store.ingest(payload)
        elif event_type == events.BUILD_ERROR:
            refused = events.refused_request(payload)
            if refused is not None:
                self.on_refusal(refused)

    def error(self, ctxt, publisher_id, event_type, payload, metadata):
        # Nova sends its build errors at priority ERROR.
        return self.dispatch(publisher_id, event_type, payload)


def listener(transport, endpoint, conf):
    """The reclaimer's listener (``listening.Listener``) on
    ``transport``: ``endpoint`` on the report and Nova topics.
    """
    o = conf.gpu_reclaimer
    return listening.Listener(
        conf, [(o.report_topic, o.report_exchange),
               (o.nova_topic, o.nova_exchange)], [endpoint], pool=o.pool,
        transport=transport, log=LOG)
