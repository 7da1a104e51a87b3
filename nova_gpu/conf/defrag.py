"""Options of nova-gpu-defrag: ``[gpu_defrag]``."""

from oslo_config import cfg

group = cfg.OptGroup(
    'gpu_defrag', title='nova-gpu periodic defragmentation',
    help='Options of nova-gpu-defrag, the service that periodically '
         'live-migrates vGPU servers so that the large GPU requests the '
         'demand model expects fit (what "openstack gpu defrag" does once). '
         'Off unless interval is set.')

opts = [
    cfg.IntOpt('interval', default=0, min=0,
               help='Seconds between two defragmentation runs; 0 (the '
                    'default) turns periodic defragmentation off and '
                    'nova-gpu-defrag exits at once.'),
    cfg.StrOpt('exporter_url', default='http://127.0.0.1:9836',
               help='URL of nova-gpu-exporter, where the cloud\'s GPU state '
                    'is read ([gpu_exporter] listen).'),
    cfg.StrOpt('cloud',
               help='Cloud name in clouds.yaml (openstacksdk) with admin '
                    'credentials: servers of every project are listed, '
                    'their allocations read from Placement and moved with '
                    'Nova\'s live-migration API. Unset: the OS_* '
                    'environment variables.'),
    cfg.ListOpt('targets', default=[],
                help='What to free, as "openstack gpu defrag --target": '
                     'whole:N, whole:N:nvlink, vgpu:TYPE:N or host:NAME. '
                     'Empty: the large requests of the demand model '
                     '(see min_gpus).'),
    cfg.IntOpt('min_gpus', default=4, min=1,
               help='Smallest whole-GPU request of the demand model that '
                    'counts as large (when targets is empty).'),
    cfg.IntOpt('max_moves', default=2, min=1,
               help='Most live migrations in one run; they are carried out '
                    'one at a time and a run stops at the first failure.'),
    cfg.IntOpt('migration_timeout', default=600, min=1,
               help='Seconds to wait for one live migration to end before '
                    'the run counts it failed and stops.'),
    cfg.FloatOpt('poll_interval', default=2.0, min=0.1,
                 help='Seconds between two looks at a migrating server.'),
    cfg.BoolOpt('dry_run', default=False,
                help='Only log the plan of each run, one line per move; '
                     'move nothing.'),
]


def register_opts(conf):
    conf.register_group(group)
    conf.register_opts(opts, group=group)


def list_opts():
    return [(group, opts)]
