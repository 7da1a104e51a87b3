"""Record the GPU scheduler's decisions, for tools/devstack-check.sh.

Runs in Nova's environment of the devstack container, as devstack's user:
listens on nova-gpu's report topic (``[gpu_scheduler] report_topic`` of
nova.conf, over the notification transport the scheduler sends on) in a
pool of its own, so it takes nothing from the exporter, and writes every
``gpu.placement.decided`` and ``gpu.schedule.refusal`` notification as
one JSON line (``event_type``, the parsed payload's fields) to OUT until
it is stopped (SIGTERM)::

    python3 placements.py /etc/nova/nova.conf OUT

The check reads the GPUs the plugin ranked first for a server from the
``placed`` line of its instance (what nova-gpu-scheduler sent once Nova
claimed that candidate).
"""

import dataclasses
import json
import signal
import sys
import threading

from oslo_config import cfg
import oslo_messaging as messaging

from nova_gpu.core import notification
from nova_gpu.core import report
from nova_gpu import listening

POOL = 'devstack-check'
EVENTS = (notification.PLACEMENT_EVENT, notification.REFUSAL_EVENT)


class Recorder(listening.Endpoint):
    filter_rule = listening.event_filter(EVENTS)

    def __init__(self, out):
        self.out = out
        self._lock = threading.Lock()

    def handle(self, event_type, payload):
        parsed = dataclasses.asdict(notification.parse(event_type, payload))
        line = json.dumps(dict(parsed, event_type=event_type))
        with self._lock:
            self.out.write(line + '\n')
            self.out.flush()


def main(argv):
    nova_conf, out_path = argv
    # Nova's control exchange (nova/rpc.py), where the scheduler sends.
    messaging.set_transport_defaults('nova')
    conf = cfg.ConfigOpts()
    conf.register_opt(cfg.StrOpt('report_topic', default=report.TOPIC),
                      'gpu_scheduler')
    conf(['--config-file', nova_conf], project='nova')
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    with open(out_path, 'a') as out:
        listener = listening.Listener(
            conf, [(conf.gpu_scheduler.report_topic, None)],
            [Recorder(out)], pool=POOL)
        listener.start()
        print('recording %s on %s' % (', '.join(EVENTS),
                                      conf.gpu_scheduler.report_topic),
              flush=True)
        done.wait()
        listener.stop()
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
