"""Versioned ``gpu.device.change`` notifications from nova-gpu-agent.

After each cycle the agent compares the devices of its new report with
those of the previous one: a device that appeared was created, one that
went away was removed, and each device change reconcile rolled back (cut
short by a crash) is a rollback. Each goes out as a
``core.notification.DevicePayload`` (Nova's versioned-payload form) on
the report topic and exchange, labelled with the Nova instance whose
libvirt domain references the device when one does. The first cycle of
an agent run sets the baseline and sends nothing. Sending never breaks
or holds the agent: the payloads go to a bounded queue
(``nova_gpu.send_queue``, ``QUEUE_SIZE`` messages, the oldest dropped)
that one background thread sends, so a hung broker holds that thread,
not the cycle; a failed send is counted, logged and forgotten.
"""

import datetime
import uuid

from oslo_log import log as logging
import oslo_messaging as messaging

from nova_gpu.agent import host_metrics as exporter
from nova_gpu.core import notification
from nova_gpu.core import report as report_mod
from nova_gpu import listening
from nova_gpu import send_queue

LOG = logging.getLogger(__name__)
# Device notifications queued at most: a cycle changes a few devices; a
# broker down for many cycles loses the oldest changes (the exporter's
# counters), never the agent's time.
QUEUE_SIZE = 1024
# Seconds ``close`` waits for what is queued to be sent.
CLOSE_TIMEOUT = 2


class _Call:
    """What the queue calls (``info``) for one ``send`` function."""

    def __init__(self, send):
        self.send = send

    def info(self, ctxt, event_type, payload):
        self.send(event_type, payload)


def report_devices(report):
    """{device key: (kind, GPU address, profile)} of a report (dict)."""
    found = {}
    for raw in report.get('gpus') or ():
        address = raw.get('address') or ''
        # An idle mdev still exists: its guest going away is no removal.
        for dev in report_mod.present_devices(raw):
            kind, detail = dev.get('kind'), dev.get('detail')
            if kind == 'vgpu':
                key = dev.get('uuid') or dev.get('vf')
                if key:
                    found[key] = (exporter.VGPU, address, detail)
            elif kind == 'mig' and isinstance(detail, list) and \
                    len(detail) == 3:
                found['%s/mig@%s' % (address, detail[1])] = (
                    exporter.MIG, address, detail[2] or detail[0])
    return found


def changes(before, after):
    """(action, key, (kind, address, profile)) from one device map to
    the next.
    """
    out = [('remove', k, before[k]) for k in sorted(set(before) - set(after))]
    out += [('create', k, after[k]) for k in sorted(set(after) - set(before))]
    return out


class DeviceEvents:
    """Sends the device changes of each agent cycle.

    ``send(event_type, payload)`` defaults to a notification on ``[gpu_agent]
    report_topic`` in ``report_exchange``, sent as the report publisher
    sends reports (explicit exchange: the agent is not Nova, its control
    exchange is not "nova"). It is called from the queue's thread.
    """

    def __init__(self, conf, host, libvirt=None, send=None):
        self.host = host
        self.libvirt = libvirt
        self._devices = None
        self._transport = None
        if send is None:
            opts = conf.gpu_agent
            self._transport = listening.transport(conf)
            self._target = messaging.Target(
                topic='%s.info' % opts.report_topic,
                exchange=opts.report_exchange)
            send = self._send
        self.send = send
        self.queue = send_queue.SendQueue(QUEUE_SIZE,
                                          label='GPU device notifications')
        self._call = _Call(send)

    def _send(self, event_type, payload):
        message = {'message_id': str(uuid.uuid4()),
                   'publisher_id': '%s.%s' % (report_mod.PUBLISHER,
                                              self.host),
                   'event_type': event_type, 'priority': 'INFO',
                   'payload': payload,
                   'timestamp': str(datetime.datetime.utcnow())}
        self._transport._send_notification(self._target, {}, message,
                                           version=2.0, retry=1)

    def flush(self, timeout):
        """Wait up to ``timeout`` s for what is queued to be sent; whether
        it was.
        """
        return self.queue.flush(timeout)

    def close(self):
        """Send what is queued (``CLOSE_TIMEOUT`` s at most), then close
        the transport.
        """
        if not self.queue.stop(CLOSE_TIMEOUT):
            LOG.warning('%d GPU device notifications not sent at stop: '
                        'the broker did not take them within %d s',
                        self.queue.stats()['pending'], CLOSE_TIMEOUT)
        if self._transport is not None:
            self._transport.cleanup()

    def observe(self, result, instances=None):
        """Send the changes one agent cycle made; returns the payloads."""
        devices = report_devices(result.get('report') or {})
        left_out = set(result.get('left_out_gpus') or ())
        if self._devices is not None and left_out:
            # A GPU NVML cannot read now is left out of the report: its
            # devices are unknown until it reads again, not removed.
            devices.update((key, dev) for key, dev in self._devices.items()
                           if dev[1] in left_out)
        found = []
        if self._devices is not None:
            found = changes(self._devices, devices)
        for key in (result.get('reconcile') or {}).get('rolled_back', ()):
            found.append(('rollback', key, (self._devices or {}).get(
                key, ('unknown', None, None))))
        self._devices = devices
        if found and instances is None and self.libvirt is not None:
            try:
                instances = exporter.scan_domains(self.libvirt)
            except Exception as e:
                LOG.debug('device notifications without instances: %s', e)
        payloads = [self._payload(action, kind, key, address, profile,
                                  instances or {})
                    for action, key, (kind, address, profile) in found]
        for p in payloads:
            try:
                self.queue.submit(self._call, notification.DEVICE_EVENT,
                                  p.to_primitive())
            except Exception as e:  # never break the agent's cycle
                LOG.warning('device notification not queued: %s', e)
        return payloads

    def _payload(self, action, kind, key, address, profile, instances):
        _name, uuid = instances.get(key, (None, None))
        return notification.DevicePayload(
            host=self.host, action=action, kind=kind, device=str(key)[:255],
            gpu_address=address or None,
            profile=str(profile)[:255] if profile else None,
            instance_uuid=uuid or None)
