"""Every notification listener of nova-gpu, and the transport they use.

``Listener`` is the one way nova-gpu listens to notifications (the
scheduler's report listener, the agent's demand listener, the exporter,
the reclaimer, the benchmarks): the transport from the configuration
(``transport``), its targets, its pool, oslo.messaging's ``threading``
executor, every endpoint guarded so that it never raises, and start and
stop once each. ``nova_gpu/tests/unit/test_listening.py`` fails on any
other call of ``get_notification_listener`` or
``get_notification_transport`` in the package.

An exception escaping an endpoint reaches oslo.messaging, which would
requeue or drop the listener's batch; a bad message must only be logged
and dropped. ``Listener`` wraps every endpoint so (``guarded``); an
``Endpoint`` subclass does its work in ``handle`` and logs its own drops.
This module belongs to no layer (the package root): any adapter may
import it, and it imports none.
"""

import threading

from oslo_log import log as logging
import oslo_messaging as messaging

LOG = logging.getLogger(__name__)
SHOWN = 100  # characters of a publisher id quoted in a log line
# The priorities oslo.messaging dispatches to an endpoint's methods.
PRIORITIES = ('audit', 'debug', 'info', 'warn', 'error', 'critical',
              'sample')


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


def transport(conf, url=None):
    """The notification transport of ``conf``: ``url``, else
    ``[oslo_messaging_notifications] transport_url``, else the RPC one.
    """
    return messaging.get_notification_transport(conf, url=url)


class _Guarded:
    """An endpoint whose methods log and drop whatever they raise."""

    def __init__(self, endpoint, log):
        self.endpoint = endpoint
        self.filter_rule = getattr(endpoint, 'filter_rule', None)
        for priority in PRIORITIES:
            method = getattr(endpoint, priority, None)
            if method is not None:
                setattr(self, priority, self._guard(method, log))

    @staticmethod
    def _guard(method, log):
        def guarded(ctxt, publisher_id, event_type, payload, metadata):
            try:
                return method(ctxt, publisher_id, event_type, payload,
                              metadata)
            except Exception as e:
                log.warning('Dropping %s from %s: %s', shown(event_type),
                            shown(publisher_id), e)
                return messaging.NotificationResult.HANDLED
        return guarded


def guarded(endpoint, log=LOG):
    """``endpoint`` as an oslo.messaging endpoint that never raises."""
    return _Guarded(endpoint, log)


class Discard:
    """Consumes a topic's shared queue so that it cannot grow.

    oslo.messaging's RabbitMQ driver declares the non-pooled queue
    ``<topic>.<priority>`` on every send, and every message lands there
    as well as in each pool's queue; with no consumer it grows for as
    long as the publishers send. A listener with ``drain`` also consumes
    it: whichever listener gets a message drops it (the pools carry the
    copies that count).
    """

    def info(self, ctxt, publisher_id, event_type, payload, metadata):
        return messaging.NotificationResult.HANDLED


class Listener:
    """One notification listener of nova-gpu: start and stop once each.

    ``targets``: (topic, exchange) pairs; exchange None is the
    transport's control exchange. ``endpoints`` are wrapped by
    ``guarded`` (logging to ``log``). ``pool``: the pool the listener
    consumes in (every pool gets every message); None shares the topic's
    queue. ``drain``: a second, pool-less listener drops what lands in
    the shared queue (``Discard``). ``transport``: the caller's, left open;
    without one, ``transport(conf)`` is made at start and closed at stop.
    """

    def __init__(self, conf, targets, endpoints, pool=None, drain=False,
                 transport=None, log=LOG):
        self.conf = conf
        self.targets = [messaging.Target(topic=topic, exchange=exchange)
                        for topic, exchange in targets]
        self.endpoints = [guarded(e, log) for e in endpoints]
        self.pool = pool
        self.drain = drain
        self.servers = []
        self._transport = transport
        self._owns_transport = transport is None
        self._lock = threading.Lock()

    @property
    def running(self):
        return bool(self.servers)

    def start(self):
        with self._lock:
            if self.servers:
                return self
            if self._transport is None:
                self._transport = transport(self.conf)
            wanted = [(self.endpoints, self.pool)]
            if self.drain:
                wanted.append(([Discard()], None))
            try:
                for endpoints, pool in wanted:
                    server = messaging.get_notification_listener(
                        self._transport, self.targets, endpoints,
                        executor='threading', pool=pool)
                    server.start()
                    self.servers.append(server)
            except Exception:
                self._stop()
                raise
        return self

    def stop(self):
        """Stop consuming and wait for the poller and workers to end."""
        with self._lock:
            self._stop()

    def _stop(self):
        servers, self.servers = self.servers, []
        try:
            for server in servers:
                try:
                    server.stop()
                    server.wait()
                except Exception as e:  # stopping goes on for the others
                    LOG.warning('Stopping a notification listener: %s', e)
        finally:
            if self._owns_transport and self._transport is not None:
                self._transport.cleanup()
                self._transport = None

    # As an oslo.messaging server, for callers that stop then wait.
    def wait(self):
        self.stop()
