"""What every nova-gpu service does at start: read its configuration,
set up oslo.log, and stop on SIGTERM or SIGINT.

Used by nova-gpu-agent, nova-gpu-exporter, nova-gpu-reclaimer and
nova-gpu-defrag (a package-root module: any adapter may import it).
"""

import signal
import threading

from oslo_log import log as logging

import nova_gpu.conf


def prepare(argv, prog):
    """``nova_gpu.conf.CONF`` parsed from ``argv``, oslo.log set up."""
    conf = nova_gpu.conf.CONF
    logging.register_options(conf)
    conf(argv, project='nova-gpu', prog=prog)
    logging.setup(conf, 'nova-gpu')
    return conf


def stop_on_signals():
    """An Event set when the process gets SIGTERM or SIGINT."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    return stop
