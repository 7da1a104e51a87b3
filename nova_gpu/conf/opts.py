"""Entry point for oslo-config-generator (``oslo.config.opts``)."""

from nova_gpu.conf import agent
from nova_gpu.conf import core
from nova_gpu.conf import defrag
from nova_gpu.conf import exporter
from nova_gpu.conf import reclaim
from nova_gpu.conf import scheduler


def list_opts():
    return (core.list_opts() + scheduler.list_opts() + agent.list_opts()
            + exporter.list_opts() + reclaim.list_opts()
            + defrag.list_opts())
