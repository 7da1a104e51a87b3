"""Receives the agents' GPU reports in nova-scheduler (oslo.messaging).

nova-gpu-agent publishes each report as an ``info`` notification with
event type ``gpu.host.report`` on ``[gpu_scheduler] report_topic`` over Nova's
notification transport. Every scheduler process listens in its own pool,
so each one keeps a full view. The endpoint is the only way reports enter
the view, in production and in the functional tests alike.
"""

import os
import socket

from oslo_config import cfg
from oslo_log import log as logging
import oslo_messaging as messaging

from nova_gpu.core import exceptions

CONF = cfg.CONF
LOG = logging.getLogger(__name__)

# As nova_gpu.agent.publisher sends it (a unit test keeps them equal).
EVENT_TYPE = 'gpu.host.report'
PUBLISHER = 'nova-gpu-agent'


class ReportEndpoint:
    """oslo.messaging notification endpoint feeding a GpuView."""

    filter_rule = messaging.NotificationFilter(
        event_type=r'^gpu\.host\.report$')

    def __init__(self, view):
        self.view = view

    def info(self, ctxt, publisher_id, event_type, payload, metadata):
        try:
            entry = self.view.ingest(payload)
        except exceptions.GpuError as e:
            LOG.error('Dropping GPU report from %s: %s', publisher_id, e)
            return messaging.NotificationResult.HANDLED
        LOG.debug('GPU report %s of %s ingested (%d GPUs)',
                  entry.generation, entry.nodename, len(entry.host.gpus))
        return messaging.NotificationResult.HANDLED


def start(view, transport=None):
    """Start listening for reports; returns the running listener."""
    transport = transport or messaging.get_notification_transport(CONF)
    target = messaging.Target(topic=CONF.gpu_scheduler.report_topic)
    listener = messaging.get_notification_listener(
        transport, [target], [ReportEndpoint(view)], executor='threading',
        # One pool per process: every scheduler worker keeps a full view.
        pool='nova-gpu-scheduler-%s-%d' % (socket.gethostname(), os.getpid()))
    listener.start()
    LOG.info('Listening for GPU reports on topic %s',
             CONF.gpu_scheduler.report_topic)
    return listener


def publish(report, transport=None):
    """Publish ``report`` the way the agent does (tools and tests)."""
    transport = transport or messaging.get_notification_transport(CONF)
    notifier = messaging.Notifier(
        transport, publisher_id='%s.%s' % (PUBLISHER, report.get('host')),
        driver='messagingv2', topics=[CONF.gpu_scheduler.report_topic])
    notifier.info({}, EVENT_TYPE, report)
