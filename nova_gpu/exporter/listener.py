"""The exporter's notification listener: reports and nova-gpu events.

It listens on the report topic in its own pool (``nova-gpu-exporter``),
so it receives every report alongside the schedulers without taking any
from them. Like the scheduler's endpoint it never raises: a bad message is
logged at WARNING and dropped (``nova_gpu.listening``), and touches no
other host.
"""

from oslo_log import log as logging

from nova_gpu.core import notification
from nova_gpu.core import report as report_mod
from nova_gpu import listening

LOG = logging.getLogger(__name__)
POOL = 'nova-gpu-exporter'


class Endpoint(listening.Endpoint):
    filter_rule = listening.event_filter(
        (report_mod.EVENT_TYPE,) + notification.EVENT_TYPES)
    log = LOG

    def __init__(self, state):
        self.state = state

    def handle(self, event_type, payload):
        if event_type == report_mod.EVENT_TYPE:
            self.state.ingest_report(payload)
        elif event_type == notification.REFUSAL_EVENT:
            self.state.ingest_refusal(notification.parse(event_type, payload))
        elif event_type == notification.PLACEMENT_EVENT:
            self.state.ingest_placement(
                notification.parse(event_type, payload))
        elif event_type == notification.DEVICE_EVENT:
            self.state.ingest_device(notification.parse(event_type, payload))


def Listener(state, transport, topic, exchange=None, pool=POOL):
    """The exporter's listener (``listening.Listener``) on ``transport``:
    ``Endpoint`` on the report topic, in the exporter's pool.
    """
    return listening.Listener(None, [(topic, exchange)], [Endpoint(state)],
                              pool=pool, transport=transport, log=LOG)
