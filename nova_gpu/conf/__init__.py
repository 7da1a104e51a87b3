"""oslo.config options of nova-gpu, one module per service area."""

from oslo_config import cfg

from nova_gpu.conf import agent
from nova_gpu.conf import core
from nova_gpu.conf import defrag
from nova_gpu.conf import exporter
from nova_gpu.conf import reclaim
from nova_gpu.conf import scheduler

CONF = cfg.CONF

core.register_opts(CONF)
scheduler.register_opts(CONF)
agent.register_opts(CONF)
exporter.register_opts(CONF)
defrag.register_opts(CONF)
reclaim.register_opts(CONF)
