"""nova-gpu: GPU helper for compute hosts, with or without Nova.

Lists GPUs and free profiles, creates and removes devices (mdev, NVIDIA
vendor VFIO vGPU, MIG) and attaches them to libvirt domains. Reads the
same oslo.config file as nova-gpu-agent; ``--libvirt-uri`` and
``--sysfs-root`` override it.

A failure prints one line, ``nova-gpu: error: <what went wrong>``, as the
last line on stderr, and exits 1; ``--debug`` adds the traceback.
Warnings about retried libvirt calls show only with ``--verbose``.
"""

import argparse
import json
import logging as std_logging
import re
import sys
import traceback

from oslo_config import cfg
import prettytable

from nova_gpu.agent import errors
from nova_gpu.agent import service
from nova_gpu.agent import xmlbuild
from nova_gpu.core import exceptions

# What a command can fail with that the user can act on: one line each.
# (cfg.Error: a missing or bad config file or value; OSError: sysfs,
# privsep, files.)
EXPECTED_ERRORS = (exceptions.GpuError, cfg.Error, OSError)
# Retries of libvirt calls are routine; the final error names the cause.
RETRY_LOGGERS = ('nova_gpu.agent.libvirt_host',)


def _parser():
    p = argparse.ArgumentParser(prog='nova-gpu', description=__doc__.split(
        '\n')[0])
    p.add_argument('--config-file', action='append', default=[],
                   help='oslo.config file (as for nova-gpu-agent)')
    p.add_argument('--libvirt-uri', help='libvirt URI (qemu:///system)')
    p.add_argument('--sysfs-root', help=argparse.SUPPRESS)
    p.add_argument('--no-nvml', action='store_true',
                   help='do not use NVML even if the driver is present')
    p.add_argument('--json', action='store_true', help='print JSON')
    p.add_argument('-v', '--verbose', action='store_true',
                   help='log INFO messages and retried libvirt calls')
    p.add_argument('-d', '--debug', action='store_true',
                   help='log DEBUG messages; print the traceback of an '
                        'error')
    sub = p.add_subparsers(dest='command', required=True)
    sub.add_parser('list', help='list GPUs')
    prof = sub.add_parser('profiles', help='free vGPU/mdev/MIG profiles')
    prof.add_argument('gpu', nargs='?', help='GPU index or PCI address')

    create = sub.add_parser('create', help='create a device')
    csub = create.add_subparsers(dest='kind', required=True)
    c = csub.add_parser('mdev', help='persistent mdev via libvirt')
    c.add_argument('parent', help='parent PCI address (PF or VF)')
    c.add_argument('type', help='mdev type id, e.g. nvidia-222')
    c.add_argument('--uuid')
    c = csub.add_parser('vgpu', help='NVIDIA vendor VFIO vGPU on a VF')
    c.add_argument('address', help='PF or VF PCI address')
    c.add_argument('type_id', type=int, help='vGPU type id')
    c = csub.add_parser('mig', help='MIG GPU + compute instance')
    c.add_argument('gpu', type=int, help='GPU index')
    c.add_argument('profile', help='MIG profile, e.g. 3g.20gb')
    c.add_argument('--start', type=int, help='start slice (first free)')

    remove = sub.add_parser('remove', help='remove a device')
    rsub = remove.add_subparsers(dest='kind', required=True)
    r = rsub.add_parser('mdev')
    r.add_argument('uuid')
    r = rsub.add_parser('vgpu')
    r.add_argument('address', help='VF PCI address')
    r = rsub.add_parser('mig')
    r.add_argument('gpu', type=int)
    r.add_argument('gi_id', type=int, help='GPU instance id')

    for name in ('attach', 'detach'):
        a = sub.add_parser(name, help='%s a device to/from a libvirt domain'
                           % name)
        a.add_argument('domain')
        what = a.add_mutually_exclusive_group(required=True)
        what.add_argument('--mdev', metavar='UUID')
        what.add_argument('--pci', metavar='ADDRESS',
                          help='whole GPU (every function of its IOMMU '
                               'group) or a VF')
    sub.add_parser('reconcile', help='adopt, start and clean up mdevs')
    rep = sub.add_parser(
        'report', help='print the host GPU report (JSON), or with '
                       '--providers every Placement provider of each GPU')
    rep.add_argument('--providers', action='store_true',
                     help='a table of every Placement resource provider '
                          'Nova makes for each GPU or a part of it (PF, '
                          'VFs, PCI pool), to check against Placement')
    return p


def _conf_argv(args):
    argv = []
    for f in args.config_file:
        argv += ['--config-file', f]
    if args.debug:
        argv.append('--debug')
    return argv


def _configure(args):
    conf = service.prepare(_conf_argv(args), 'nova-gpu', stderr=True)
    if not args.debug:
        std_logging.getLogger().setLevel(
            std_logging.INFO if args.verbose else std_logging.WARNING)
    if not (args.verbose or args.debug):
        for name in RETRY_LOGGERS:
            std_logging.getLogger(name).setLevel(std_logging.ERROR)
    if args.libvirt_uri:
        conf.set_override('libvirt_uri', args.libvirt_uri, 'gpu_agent')
    if args.sysfs_root:
        conf.set_override('sysfs_root', args.sysfs_root, 'gpu_agent')
    if args.no_nvml:
        conf.set_override('use_nvml', False, 'gpu_agent')
    return conf


def _run(args):
    conf = _configure(args)
    from nova_gpu.agent import agent as agent_mod
    agent = agent_mod.Agent(conf)
    try:
        # A root without a PCI bus is a wrong --sysfs-root or
        # [gpu_agent] sysfs_root, not a host without GPUs.
        agent.sysfs.check()
        return COMMANDS[args.command](agent, args)
    finally:
        agent.close()


def describe_error(e):
    """One line saying what went wrong, for any of ``EXPECTED_ERRORS``."""
    if isinstance(e, OSError) and e.strerror:
        text = e.strerror
        if e.filename:
            text += ': %s' % e.filename
        return text
    text = str(e)
    # oslo.config names where a bad value came from as a LocationInfo repr
    text = re.sub(r"LocationInfo\(location=.*?, detail='([^']*)'\)",
                  r'\1', text)
    return ' '.join(text.split()) or type(e).__name__


def main(argv=None):
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    try:
        out = _run(args)
    except EXPECTED_ERRORS as e:
        if args.debug:
            traceback.print_exc()
        for handler in std_logging.getLogger().handlers:
            handler.flush()  # log lines first: the error is the last line
        print('nova-gpu: error: %s' % describe_error(e), file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(out, indent=2, sort_keys=True, default=str))
    elif isinstance(out, list):
        print(_table(out))
    elif out is not None:
        print(out)
    return 0


def _table(rows):
    """``rows[0]`` is the header; cells are printed as ``str``."""
    table = prettytable.PrettyTable(field_names=[str(c) for c in rows[0]])
    table.align = 'l'
    table.add_rows([[str(c) for c in row] for row in rows[1:]])
    return table.get_string()


def _find_gpu(inv, key):
    for g in inv.gpus:
        if key in (str(g.index), g.address):
            return g
    raise errors.NotFound('no GPU %r (GPUs: %s)' % (key, ', '.join(
        '%d=%s' % (g.index, g.address) for g in inv.gpus)))


def cmd_list(agent, args):
    inv = agent.discover()
    if args.json:
        return inv.report()['gpus']
    rows = [('IDX', 'ADDRESS', 'MODEL', 'NUMA', 'DRIVER', 'IOMMU', 'MIG',
             'NVLINK', 'DEVICES')]
    for g in inv.gpus:
        devs = len(g.mdevs) + len(g.vf_vgpus) + len(g.mig_slots)
        rows.append((g.index, g.address, g.model.name, g.numa_node,
                     g.pci.driver if g.pci else '-',
                     g.pci.iommu_group if g.pci else '-',
                     'on' if g.nvml and g.nvml.mig_enabled else 'off',
                     '-' if g.nvlink_domain is None else g.nvlink_domain,
                     devs))
    return rows


def cmd_profiles(agent, args):
    inv = agent.discover()
    gpus = [_find_gpu(inv, args.gpu)] if args.gpu else inv.gpus
    rows = []
    for g in gpus:
        core_gpu = inv.host.gpus[g.index]
        parents = [g.pci] if g.pci else []
        parents += list(g.vfs())
        for fn in parents:
            for t in fn.mdev_types.values():
                rows.append({'gpu': g.index, 'kind': 'mdev',
                             'parent': fn.address, 'type': t.id,
                             'name': t.name, 'free': t.available})
        free_vfs = [vf for vf in g.vfs() if not vf.current_vgpu_type]
        creatable = {}
        for vf in free_vfs:
            for tid, name in vf.creatable_vgpu_types.items():
                creatable.setdefault((tid, name), 0)
                creatable[(tid, name)] += 1
        for (tid, name), count in sorted(creatable.items()):
            rows.append({'gpu': g.index, 'kind': 'vgpu', 'parent':
                         g.address, 'type': tid, 'name': name,
                         'free': count})
        if core_gpu.mig_enabled:
            for p in g.model.mig.profiles.values():
                starts = core_gpu.mig_starts(p)
                rows.append({'gpu': g.index, 'kind': 'mig',
                             'parent': g.address, 'type': p.name,
                             'name': p.name, 'free': len(starts),
                             'starts': list(starts)})
    if args.json:
        return rows
    return [('GPU', 'KIND', 'PARENT', 'TYPE', 'NAME', 'FREE')] + [
        (r['gpu'], r['kind'], r['parent'], r['type'], r['name'], r['free'])
        for r in rows]


def cmd_create(agent, args):
    m = agent.manager
    if args.kind == 'mdev':
        return m.create_mdev(args.parent, args.type, uuid=args.uuid)
    if args.kind == 'vgpu':
        return m.create_vf_vgpu(args.address, args.type_id)
    inv = agent.discover()
    g = _find_gpu(inv, str(args.gpu))
    profile = g.model.mig_profile(args.profile)
    start = args.start
    if start is None:
        starts = inv.host.gpus[g.index].mig_starts(profile)
        if not starts:
            raise errors.NoCapacity('GPU %d has no room for MIG %s'
                                    % (g.index, profile.name))
        start = starts[0]
    return 'GPU instance %d' % m.create_mig(g.index, profile, start)


def cmd_remove(agent, args):
    m = agent.manager
    if args.kind == 'mdev':
        m.remove_mdev(args.uuid)
    elif args.kind == 'vgpu':
        m.remove_vf_vgpu(args.address)
    else:
        m.remove_mig(args.gpu, args.gi_id)
    return 'removed'


def _hostdevs(agent, args):
    if args.mdev:
        return [xmlbuild.mdev_hostdev(args.mdev)]
    fn = agent.sysfs.pci_function(args.pci)
    if fn.physfn:  # a VF is its own IOMMU group member set
        return [xmlbuild.pci_hostdev(args.pci)]
    return agent.manager.passthrough_hostdevs(args.pci)


def cmd_attach(agent, args):
    if agent.libvirt is None:
        raise errors.Unavailable('libvirt-python is not installed')
    for xml in _hostdevs(agent, args):
        agent.libvirt.attach(args.domain, xml)
    return 'attached to %s' % args.domain


def cmd_detach(agent, args):
    if agent.libvirt is None:
        raise errors.Unavailable('libvirt-python is not installed')
    if args.mdev:
        hostdevs = [xmlbuild.mdev_hostdev(args.mdev)]
    else:
        fn = agent.sysfs.pci_function(args.pci)
        hostdevs = [xmlbuild.pci_hostdev(a) for a in
                    ((args.pci,) if fn.physfn else fn.group_members)]
    for xml in hostdevs:
        agent.libvirt.detach(args.domain, xml)
    return 'detached from %s' % args.domain


def cmd_reconcile(agent, args):
    result = agent.reconcile()
    if result is None:
        raise errors.Unavailable('reconcile needs libvirt')
    return result.as_dict()


PROVIDER_HEADER = ('GPU', 'PF', 'MODEL', 'KIND', 'PROVIDER',
                   'RESOURCE CLASS', 'VGPU TYPE', 'FUNCTION', 'VFS', 'MIG')


def provider_rows(report):
    """One row per Placement provider of each GPU in ``report``.

    A GPU Nova makes no provider for (e.g. on the nvidia driver with
    neither mdev types nor VFs) gets a row of kind ``none``.
    """
    rows = []
    for g in report['gpus']:
        gpu = (g['index'], g['address'], g['model'])
        providers = g.get('providers') or ()
        if not providers:
            rows.append(gpu + ('none', '-', '-', '-', '-', '-', '-'))
        for p in providers:
            mig = p.get('mig')
            rows.append(gpu + (
                p['kind'], p['name'], p['resource_class'],
                p.get('vgpu_type') or '-', p['address'],
                len(p.get('vfs') or ()) or '-',
                '%s@%s' % tuple(mig) if mig else '-'))
    return rows


def cmd_report(agent, args):
    report = agent.discover().report(generation=agent.next_generation())
    if not args.providers:
        args.json = True
        return report
    if args.json:
        return [dict(p, gpu=g['index'], pf=g['address'], model=g['model'])
                for g in report['gpus'] for p in g.get('providers') or ()]
    return [PROVIDER_HEADER] + provider_rows(report)


COMMANDS = {'list': cmd_list, 'profiles': cmd_profiles,
            'create': cmd_create, 'remove': cmd_remove,
            'attach': cmd_attach, 'detach': cmd_detach,
            'reconcile': cmd_reconcile, 'report': cmd_report}


if __name__ == '__main__':
    sys.exit(main())
