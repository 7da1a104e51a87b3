"""Each Nova service's nova-gpu settings, from the files in ``etc/nova``.

The files an operator is told to write (``doc/source`` includes them) are
the settings the harness runs with, service by service: before a service
starts, the process's configuration holds that service's files and
nothing of the others', so a setting missing from one service's file
fails there as it would in production (nova-api and nova-compute
validate ``[pci] alias`` when they start, ``nova.pci.request.
get_alias_from_config``).

What one process cannot show: once every service runs, they read one
``CONF``. The harness then holds the union of the services' files, and
refuses (:class:`ConflictingFiles`) files that give one option two
values, and files where some service reads an option Nova reads in every
service (``EVERY_SERVICE``) but lacks it. The devstack job runs each
service from its own file for real (doc/source/devstack.rst).

What the harness writes itself is what differs per host: the addresses
in ``[mdev_*] device_addresses`` and ``[pci] device_spec``, and the mdev
type ids; each ``device_spec`` entry keeps every other key of the
path file's example (``"managed": "no"`` for vendor-VFIO VFs).
"""

import collections
import glob
import os
import sys

from oslo_config import cfg
from oslo_serialization import jsonutils

import nova_gpu

API = 'api'
CONDUCTOR = 'conductor'
SCHEDULER = 'scheduler'
COMPUTE = 'compute'
SERVICES = (API, CONDUCTOR, SCHEDULER, COMPUTE)

# nova-gpu's files of each service; the PCI file joins every service where
# any host uses a PCI path, the path files join nova-compute.
SERVICE_FILES = {
    API: ('nova-api.conf',),
    CONDUCTOR: ('nova-conductor.conf',),
    SCHEDULER: ('nova-scheduler.conf',),
    COMPUTE: ('nova-compute.conf',),
}
PCI_FILE = 'nova-gpu-pci.conf'
LARGE_CLOUD_FILES = ('nova-scheduler.conf', 'nova-scheduler-large-cloud.conf')
DRIVER_FILTER_FILES = ('nova-scheduler.conf',
                       'nova-scheduler-driver-filter.conf')
# Path (nova_gpu.tests.harness.cloud.HOST_PATHS) -> nova-compute's path file.
PATH_FILES = {
    'pf_mdev': 'nova-compute-pf-mdev.conf',
    'vf_mdev': 'nova-compute-vf-mdev.conf',
    'mig_vgpu': 'nova-compute-mig-vgpu.conf',
    'vfio': 'nova-compute-vendor-vfio.conf',
    'passthrough': 'nova-compute-whole-gpu.conf',
    # Not a GPU path: the RDMA NICs' VFs of gpu:rdma hosts.
    'rdma_nic': 'nova-compute-rdma-nic.conf',
}
# Options Nova reads in every service that has them (api, conductor,
# scheduler, compute): one service without them is a broken cloud.
EVERY_SERVICE = (('filter_scheduler', 'pci_in_placement'), ('pci', 'alias'))
MDEV_GROUP = 'mdev_'


class ConflictingFiles(ValueError):
    """Service files one process cannot run as several services."""


def etc_dir():
    """``etc/nova`` of the installed package, else of the checkout."""
    installed = os.path.join(sys.prefix, 'etc', 'nova-gpu', 'nova')
    if os.path.isdir(installed):
        return installed
    return os.path.join(os.path.dirname(os.path.dirname(
        os.path.abspath(nova_gpu.__file__))), 'etc', 'nova')


def all_files():
    """Every nova.conf file of ``etc/nova``, by name."""
    return sorted(os.path.basename(p)
                  for p in glob.glob(os.path.join(etc_dir(), '*.conf')))


def read(name):
    """{(group, option): [values]} of one file, in file order."""
    path = os.path.join(etc_dir(), name)
    sections = {}
    cfg.ConfigParser(path, sections).parse()
    return {(group, option): list(values)
            for group, options in sections.items()
            for option, values in options.items()}


def _opt(conf, group, option):
    if group == 'DEFAULT':
        group = None
    try:
        return conf._get_opt_info(option, group)['opt']
    except (cfg.NoSuchOptError, cfg.NoSuchGroupError):
        return None


def merge(names, conf=cfg.CONF):
    """{(group, option): value} of files read in turn, as oslo.config would.

    A later file replaces a single-valued option and adds to a
    multi-valued one. Options no registered code knows are refused by
    name (a typo in a documented file). ``[mdev_*]`` groups are Nova's
    dynamic ones (registered once ``enabled_mdev_types`` is known).
    """
    values = {}
    for name in names:
        for (group, option), found in read(name).items():
            opt = _opt(conf, group, option)
            if opt is None and not group.startswith(MDEV_GROUP):
                raise ConflictingFiles('%s sets [%s] %s, which no service '
                                       'registers' % (name, group, option))
            if opt is not None and opt.multi:
                values[(group, option)] = values.get(
                    (group, option), []) + found
            else:
                values[(group, option)] = found[-1]
    return values


def service_files(service, scheduler_files=SERVICE_FILES[SCHEDULER],
                  pci=False, paths=()):
    """The file names one service reads."""
    names = list(scheduler_files if service == SCHEDULER
                 else SERVICE_FILES[service])
    if pci:
        names.append(PCI_FILE)
    if service == COMPUTE:
        names.extend(PATH_FILES[p] for p in paths)
    return names


def host_values(values, mdev_addresses, device_specs):
    """``values`` with the addresses of the hosts the process runs.

    ``mdev_addresses``: {mdev type id: [addresses]}; ``device_specs``:
    [(path, address)] of PCI devices. Each device_spec entry is the path
    file's example with the address replaced.
    """
    values = {k: v for k, v in values.items()
              if not k[0].startswith(MDEV_GROUP)}
    if mdev_addresses:
        values[('devices', 'enabled_mdev_types')] = ','.join(
            sorted(mdev_addresses))
        for type_id, addresses in mdev_addresses.items():
            values[(MDEV_GROUP + type_id, 'device_addresses')] = ','.join(
                addresses)
    else:
        values.pop(('devices', 'enabled_mdev_types'), None)
    examples = {}
    for path, name in PATH_FILES.items():
        for spec in read(name).get(('pci', 'device_spec'), ()):
            examples.setdefault(path, jsonutils.loads(spec))
    specs = []
    for path, address in device_specs:
        if path not in examples:
            raise ConflictingFiles('%s has no [pci] device_spec example for '
                                   'the %s path' % (PATH_FILES[path], path))
        specs.append(jsonutils.dumps(dict(examples[path], address=address)))
    if specs:
        values[('pci', 'device_spec')] = specs
    else:
        values.pop(('pci', 'device_spec'), None)
    return values


def union(by_service):
    """One process's settings for all services; refuses what it cannot run.

    ``by_service``: {service: {(group, option): value}}.
    """
    merged = {}
    for service, values in sorted(by_service.items()):
        for key, value in values.items():
            if key in merged and merged[key][1] != value:
                raise ConflictingFiles(
                    '[%s] %s is %r for nova-%s and %r for nova-%s: one '
                    'process cannot run them' % (key + (
                        value, service) + tuple(reversed(merged[key]))))
            merged[key] = (service, value)
    for key in EVERY_SERVICE:
        having = sorted(s for s, v in by_service.items() if key in v)
        if having and len(having) != len(by_service):
            lacking = sorted(set(by_service) - set(having))
            raise ConflictingFiles(
                '[%s] %s is set for %s but not for %s: Nova reads it in '
                'every service' % (key + (
                    ', '.join('nova-' + s for s in having),
                    ', '.join('nova-' + s for s in lacking))))
    return {key: value for key, (service, value) in merged.items()}


def apply(case, values, applied):
    """Set ``values`` on the process's CONF through ``case.flags``.

    ``applied``: the (group, option) pairs set before, cleared first, so
    that the service about to start sees its own files and nothing else.
    Returns the pairs now set.
    """
    import nova.conf
    from nova.pci import request
    for group, option in applied:
        cfg.CONF.clear_override(option, None if group == 'DEFAULT'
                                else group)
    mdev = ('devices', 'enabled_mdev_types')
    if mdev in values:
        case.flags(enabled_mdev_types=values[mdev], group='devices')
        nova.conf.devices.register_dynamic_opts(cfg.CONF)
    by_group = collections.defaultdict(dict)
    for (group, option), value in values.items():
        by_group[None if group == 'DEFAULT' else group][option] = value
    for group, options in by_group.items():
        case.flags(group=group, **options)
    # Cached per process; each service validates its own (as it would).
    request.get_alias_from_config.cache_clear()
    return set(values)
