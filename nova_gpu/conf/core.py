"""Options of the GPU core, shared by every service: ``[gpu]``."""

from oslo_config import cfg

gpu_group = cfg.OptGroup(
    'gpu', title='GPU catalog and placement',
    help='Options shared by the nova-gpu scheduler plugin, compute agent '
         'and simulator.')

opts = [
    cfg.ListOpt('catalog_files', default=[],
                help='Extra GPU catalog YAML files, loaded after the '
                     'catalog shipped with nova-gpu. A model defined again '
                     'replaces the shipped definition. Each file is '
                     'validated on load; errors name the file, the model '
                     'and the field.'),
]


def register_opts(conf):
    conf.register_group(gpu_group)
    conf.register_opts(opts, group=gpu_group)


def list_opts():
    return [(gpu_group, opts)]
