"""What the services' notification endpoints share: they never raise.

An exception escaping an endpoint reaches oslo.messaging, which would
requeue or drop the listener's batch; a bad message must only be logged
and dropped. The reclaimer's and the exporter's endpoints are
``Endpoint``\\ s. This module belongs to no layer (the package root): any
adapter may import it, and it imports none.
"""

from oslo_log import log as logging
import oslo_messaging as messaging

LOG = logging.getLogger(__name__)
SHOWN = 100  # characters of a publisher id quoted in a log line


def shown(value, limit=SHOWN):
    """``value`` as a log line quotes it: a string as it is, anything
    else as its repr, and not too long.
    """
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[:limit - 3] + '...'


def event_filter(event_types):
    """A filter that lets exactly ``event_types`` through."""
    return messaging.NotificationFilter(
        event_type='^(%s)$' % '|'.join(
            e.replace('.', r'\.') for e in event_types))


class Endpoint:
    """A notification endpoint that never raises.

    A subclass sets ``filter_rule`` (``event_filter``) and ``log`` (its
    module's logger) and does the work in ``handle``; whatever ``handle``
    raises is logged at WARNING, naming the event type and the publisher,
    and the message is dropped.
    """

    log = LOG

    def handle(self, event_type, payload):
        raise NotImplementedError

    def dispatch(self, publisher_id, event_type, payload):
        try:
            self.handle(event_type, payload)
        except Exception as e:
            self.log.warning('Dropping %s from %s: %s', event_type,
                             shown(publisher_id), e)
        return messaging.NotificationResult.HANDLED

    def info(self, ctxt, publisher_id, event_type, payload, metadata):
        return self.dispatch(publisher_id, event_type, payload)
