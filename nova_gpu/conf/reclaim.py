"""Options of nova-gpu-reclaimer: ``[gpu_reclaimer]``."""

from oslo_config import cfg

from nova_gpu.core import report

group = cfg.OptGroup(
    'gpu_reclaimer', title='nova-gpu spot reclaimer',
    help='Options of nova-gpu-reclaimer, the service that evicts servers '
         'of preemptible flavors (gpu:preemptible=true) when an on-demand '
         'GPU server is refused for capacity or free GPU capacity runs '
         'below a floor. Only servers of preemptible flavors are ever '
         'evicted. See doc/source/economics.rst.')

opts = [
    cfg.StrOpt('action', default='shelve_offload',
               choices=[('shelve_offload', 'shelve the server and offload '
                         'it: its GPU is freed, the server, its ports and '
                         'volumes are kept and the owner may unshelve it '
                         'later'),
                        ('delete', 'delete the server')],
               help='What evicting a spot server does.'),
    cfg.IntOpt('grace_period', default=300, min=0,
               help='Seconds between the owner\'s notice (a versioned '
                    'notification and the server metadata key '
                    'nova_gpu_reclaim) and the eviction.'),
    cfg.BoolOpt('dry_run', default=False,
                help='Plan and log what would be evicted, and change '
                     'nothing: no notice, no eviction.'),
    cfg.IntOpt('headroom_floor', default=0, min=0,
               help='How many servers of headroom_flavor must fit at once '
                    'in free GPU capacity. Below it, spot servers are '
                    'evicted until it is met, so that on-demand boots '
                    'find room without being refused first. 0: off.'),
    cfg.StrOpt('headroom_flavor',
               help='Name or ID of the on-demand flavor headroom_floor '
                    'counts (e.g. the largest GPU flavor on-demand users '
                    'must always be able to boot). Needed when '
                    'headroom_floor is set.'),
    cfg.IntOpt('headroom_interval', default=60, min=1,
               help='Seconds between two headroom checks.'),
    cfg.IntOpt('max_evictions', default=4, min=1,
               help='The most servers one plan may evict to make room for '
                    'one request (the move planner\'s max_moves).'),
    cfg.IntOpt('eviction_timeout', default=300, min=1,
               help='Seconds to wait for an evicted server to give back its '
                    'GPU (shelved offloaded, or deleted) before the plan '
                    'counts as failed.'),
    cfg.IntOpt('room_report_timeout', default=60, min=0,
               help='Seconds the reclaimer waits, after evicting for a '
                    'refused instance, for the host\'s next GPU report '
                    'before it tells the owner (gpu.reclaim.room) to boot '
                    'again: the schedulers place on what the agents '
                    'report, so a boot before that report can be refused '
                    'again. Past it the owner is told anyway (logged). '
                    '0: tell at once.'),
    cfg.IntOpt('stale_after', default=180, min=1,
               help='Seconds after which a host\'s newest GPU report is too '
                    'old to plan with: its servers are not evicted. Keep it '
                    'above two [gpu_agent] reconcile_interval.'),
    cfg.IntOpt('generation_reset_after',
               default=report.GENERATION_RESET_AFTER, min=1,
               help='Seconds after which a report with a lower generation '
                    'than the one held replaces it anyway (as '
                    '[gpu_scheduler] generation_reset_after).'),
    cfg.StrOpt('cloud',
               help='Entry of clouds.yaml (or OS_CLOUD) with admin '
                    'credentials for the compute and Placement APIs; unset: '
                    'the OS_* environment.'),
    cfg.StrOpt('report_topic', default=report.TOPIC,
               help='Notification topic of the agents\' GPU reports (the '
                    'agents\' [gpu_agent] report_topic). nova-gpu '
                    'notifications of the reclaimer are sent there too.'),
    cfg.StrOpt('report_exchange', default='nova',
               help='Exchange of the GPU reports.'),
    cfg.StrOpt('nova_topic', default='versioned_notifications',
               help='Topic of Nova\'s versioned notifications (Nova\'s '
                    '[notifications] versioned_notifications_topics).'),
    cfg.StrOpt('nova_exchange', default='nova',
               help='Exchange of Nova\'s versioned notifications.'),
    cfg.StrOpt('pool', default='nova-gpu-reclaimer',
               help='Notification listener pool: the reclaimer receives '
                    'every report and Nova notification without taking any '
                    'from the schedulers, the exporter or other consumers. '
                    'Run one reclaimer per cloud.'),
]


def register_opts(conf):
    conf.register_group(group)
    conf.register_opts(opts, group=group)


def list_opts():
    return [(group, opts)]
