"""Telling a server's owner: a server metadata key and a notification.

The one way nova-gpu tells the owner of a server something: the
reclaimer (a spot server will be evicted, ``reclaim.notices``) and
nova-gpu-exporter (a GPU device has stayed idle, ``exporter.
idle_notices``). The owner sees the metadata key in ``openstack server
show``; the versioned notification (oslo.messaging ``messagingv2``,
priority INFO, the payload in ``core.notification``'s wire form) is for a
portal or mail bridge that tells people.

``tell`` sets the key, then sends the notification: a key that cannot be
set is logged and the notification still goes (it tells the owner
alone). ``set_key`` rewrites the key alone, ``clear`` removes it (a
server or key already gone is done). Nothing else in nova-gpu writes a
server's metadata (``tests/unit/test_owner_notice.py``). The compute
client is ``cloud_api.Nova`` (or an object with its ``set_metadata`` and
``delete_metadata``).
"""

from oslo_log import log as logging

LOG = logging.getLogger(__name__)


class Notifier:
    """Sends payloads through an oslo.messaging ``Notifier`` (or any
    object with ``info(ctxt, event_type, payload)``); ``events``: payload
    class -> event type.
    """

    def __init__(self, notifier, events):
        self.notifier = notifier
        self.events = dict(events)

    def send(self, payload):
        self.notifier.info({}, self.events[type(payload)],
                           payload.to_primitive())


def messaging_notifier(transport, publisher, topic):
    """An oslo.messaging ``Notifier`` (``messagingv2``) on ``topic``."""
    import oslo_messaging as messaging
    return messaging.Notifier(transport, publisher_id=publisher,
                              driver='messagingv2', topics=[topic])


def set_key(compute, server_id, key, text):
    """Set (or rewrite) metadata ``key`` = ``text``; raises on failure."""
    compute.set_metadata(server_id, {key: text})


def tell(compute, notifier, server_id, key, text, payload):
    """Set metadata ``key`` = ``text`` on the server, then send
    ``payload`` through ``notifier`` (a ``Notifier``, or None).

    Returns the error that kept the key from being set (logged), or None.
    A failed send raises.
    """
    error = None
    try:
        set_key(compute, server_id, key, text)
    except Exception as e:
        error = e
        LOG.warning('Server %s: metadata %s not set: %s', server_id, key, e)
    if notifier is not None:
        notifier.send(payload)
    return error


def clear(compute, server_id, key):
    """Remove metadata ``key`` from the server (gone already: done)."""
    compute.delete_metadata(server_id, [key])
