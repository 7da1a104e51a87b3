"""Options of nova-gpu-exporter: ``[gpu_exporter]``."""

from oslo_config import cfg

from nova_gpu.core import report

group = cfg.OptGroup(
    'gpu_exporter', title='nova-gpu cloud exporter',
    help='Options of nova-gpu-exporter, the service that listens to the '
         'GPU reports and scheduler notifications and serves the cloud\'s '
         'GPU figures to Prometheus and to "openstack gpu".')

opts = [
    cfg.StrOpt('listen', default='127.0.0.1:9836',
               help='ADDRESS:PORT of the HTTP server: Prometheus metrics on '
                    '/metrics, the read-only JSON API of "openstack gpu" '
                    'on /v1/ ([::1]:9836 for IPv6).'),
    cfg.StrOpt('report_topic', default=report.TOPIC,
               help='Notification topic of the agents\' GPU reports and of '
                    'the scheduler\'s nova-gpu notifications (the agents\' '
                    '[gpu_agent] report_topic).'),
    cfg.StrOpt('report_exchange', default='nova',
               help='Exchange of those notifications (the agents\' '
                    '[gpu_agent] report_exchange).'),
    cfg.StrOpt('pool', default='nova-gpu-exporter',
               help='Notification listener pool. Every exporter with its '
                    'own pool receives every message; exporters sharing a '
                    'pool split them (do not).'),
    cfg.IntOpt('stale_after', default=180, min=1,
               help='Seconds after which a host\'s newest report counts as '
                    'stale (nova_gpu_host_stale). Keep it above two '
                    '[gpu_agent] reconcile_interval.'),
    cfg.IntOpt('generation_reset_after', default=300, min=1,
               help='Seconds after which a report with a lower generation '
                    'than the one held replaces it anyway (as '
                    '[gpu_scheduler] generation_reset_after).'),
]


def register_opts(conf):
    conf.register_group(group)
    conf.register_opts(opts, group=group)


def list_opts():
    return [(group, opts)]
