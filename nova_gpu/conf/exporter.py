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
    cfg.IntOpt('generation_reset_after',
               default=report.GENERATION_RESET_AFTER, min=1,
               help='Seconds after which a report with a lower generation '
                    'than the one held replaces it anyway (as '
                    '[gpu_scheduler] generation_reset_after).'),
    cfg.StrOpt('usage_ledger',
               help='File of the GPU usage ledger (usage for billing: '
                    'GPU-seconds and frame-buffer GiB-seconds per server, '
                    'model and profile), written whole and atomically '
                    'every usage_write_interval and read back at start, so '
                    'that the usage counters survive restarts, e.g. '
                    '/var/lib/nova-gpu/usage-ledger.json. Unset: usage is '
                    'kept in memory only and starts again from 0 when the '
                    'exporter restarts. A file that cannot be read stops '
                    'the exporter (move it aside to start a new ledger).'),
    cfg.IntOpt('usage_write_interval', default=60, min=1,
               help='Seconds between two writes of the usage ledger. The '
                    'usage counters (/metrics) and "openstack gpu usage" '
                    'show the ledger as last written, so they lag by up '
                    'to this much.'),
    cfg.IntOpt('usage_max_interval', default=180, min=1,
               help='The most seconds counted, between two reports of a '
                    'host, for a device the later report no longer shows '
                    '(when it was released within a longer gap is not '
                    'known). A device still held by the same server is '
                    'counted over the whole gap. Keep it at about two '
                    '[gpu_agent] reconcile_interval.'),
    cfg.IntOpt('usage_retention_days', default=400, min=1,
               help='Days of usage kept for "openstack gpu usage": older '
                    'usage is forgotten, and the counters of servers with '
                    'nothing left go.'),
    cfg.StrOpt('cloud',
               help='Entry of clouds.yaml (or OS_CLOUD) with credentials '
                    'to read the servers of all projects from Nova: the '
                    'project each GPU server is billed to (the project_id '
                    'label of the usage counters). Unset: the OS_* '
                    'environment.'),
    cfg.BoolOpt('idle_notify', default=False,
                help='Tell the owners of servers whose GPU devices the '
                     'agents report idle ([gpu_agent] idle_threshold and '
                     'idle_after), once per idle episode, as the '
                     'reclaimer tells owners: the server\'s metadata key '
                     'nova_gpu_idle (which devices, idle since when, a '
                     'smaller profile their peak fits; removed when no '
                     'device is idle any more) and a versioned '
                     'notification gpu.idle.notice on report_topic. '
                     'Needs credentials that may read every server and '
                     'write its metadata (the cloud option). Off: nothing '
                     'is sent; the idle devices are still shown '
                     '(nova_gpu_device_idle_seconds, "openstack gpu '
                     'idle").'),
    cfg.StrOpt('idle_notice_file',
               help='File of what owners were told of idle GPUs (with '
                    'idle_notify), written atomically after each notice '
                    'and read back at start, so that a restarted exporter '
                    'neither tells them again nor forgets a metadata key '
                    'to remove, e.g. /var/lib/nova-gpu/idle-notices.json. '
                    'Unset: kept in memory only. A file that cannot be '
                    'read stops the exporter (move it aside to start '
                    'again).'),
    cfg.IntOpt('idle_notice_timeout', default=30, min=1,
               help='Seconds one Nova API call of an idle notice may take '
                    '(openstacksdk\'s api_timeout). The calls run in a '
                    'thread of their own: reports are taken meanwhile.'),
    cfg.BoolOpt('usage_projects', default=True,
                help='Ask Nova the project of each server counted. Off: '
                     'usage rows and counters carry an empty project_id.'),
]


def register_opts(conf):
    conf.register_group(group)
    conf.register_opts(opts, group=group)


def list_opts():
    return [(group, opts)]
