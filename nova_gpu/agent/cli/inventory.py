"""nova-gpu commands that read the host: list, profiles, report,
reconcile."""

from nova_gpu.agent.cli import base
from nova_gpu.agent import errors


def find_gpu(inv, key):
    for g in inv.gpus:
        if key in (str(g.index), g.address):
            return g
    raise errors.NotFound('no GPU %r (GPUs: %s)' % (key, ', '.join(
        '%d=%s' % (g.index, g.address) for g in inv.gpus)))


class ListGpus(base.Lister):
    """List GPUs: model, NUMA, driver, IOMMU, MIG, NVLink, devices.

    ``--json`` prints the GPUs of the host report.
    """

    columns = ('IDX', 'ADDRESS', 'MODEL', 'NUMA', 'DRIVER', 'IOMMU', 'MIG',
               'NVLINK', 'DEVICES')

    def result(self, agent, args):
        return agent.discover().report()['gpus']

    def rows(self, agent, args):
        rows = []
        inv = agent.discover()
        for g in inv.gpus:
            devs = len(g.mdevs) + len(g.vf_vgpus) + len(g.mig_slots)
            rows.append((g.index, g.address, g.model.name, g.numa_node,
                         g.pci.driver if g.pci else '-',
                         g.pci.iommu_group if g.pci else '-',
                         'on' if g.nvml and g.nvml.mig_enabled else 'off',
                         '-' if g.nvlink_domain is None
                         else g.nvlink_domain, devs))
        # Left out of the report until NVML reads them again: shown here,
        # so that a lost GPU is not simply missing from the list.
        for u in inv.unreadable:
            rows.append(('-', u['address'] or 'NVML GPU %d' % (
                u['nvml_index']), 'unreadable: %s' % u['reason'],
                '-', '-', '-', '-', '-', '-'))
        return rows


class Profiles(base.Lister):
    """List free vGPU/mdev/MIG profiles (MIG: free start slices).

    ``--json`` adds the free start slices of each MIG profile.
    """

    columns = ('GPU', 'KIND', 'PARENT', 'TYPE', 'NAME', 'FREE')

    def get_parser(self, prog_name):
        parser = super().get_parser(prog_name)
        parser.add_argument('gpu', nargs='?',
                            help='GPU index or PCI address')
        return parser

    def result(self, agent, args):
        inv = agent.discover()
        gpus = [find_gpu(inv, args.gpu)] if args.gpu else inv.gpus
        rows = []
        for g in gpus:
            rows += _profiles(inv, g)
        return rows

    def rows(self, agent, args):
        return [(r['gpu'], r['kind'], r['parent'], r['type'], r['name'],
                 r['free']) for r in self.result(agent, args)]


def _profiles(inv, g):
    rows = []
    core_gpu = inv.host.gpus[g.index]
    parents = [g.pci] if g.pci else []
    parents += list(g.vfs())
    for fn in parents:
        for t in fn.mdev_types.values():
            rows.append({'gpu': g.index, 'kind': 'mdev',
                         'parent': fn.address, 'type': t.id,
                         'name': t.name, 'free': t.available})
    creatable = {}
    for vf in g.vfs():
        if vf.current_vgpu_type:
            continue
        for tid, name in vf.creatable_vgpu_types.items():
            creatable[(tid, name)] = creatable.get((tid, name), 0) + 1
    for (tid, name), count in sorted(creatable.items()):
        rows.append({'gpu': g.index, 'kind': 'vgpu', 'parent': g.address,
                     'type': tid, 'name': name, 'free': count})
    if core_gpu.mig_enabled:
        for p in g.model.mig.profiles.values():
            starts = core_gpu.mig_starts(p)
            rows.append({'gpu': g.index, 'kind': 'mig',
                         'parent': g.address, 'type': p.name,
                         'name': p.name, 'free': len(starts),
                         'starts': list(starts)})
    return rows


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


class Report(base.Lister):
    """Print the host GPU report (JSON), or its Placement providers.

    With ``--providers``: a table of every Placement resource provider
    Nova makes for each GPU.
    """

    columns = PROVIDER_HEADER

    def get_parser(self, prog_name):
        parser = super().get_parser(prog_name)
        parser.add_argument(
            '--providers', action='store_true',
            help='a table of every Placement resource provider Nova makes '
                 'for each GPU or a part of it (PF, VFs, PCI pool), to '
                 'check against Placement')
        return parser

    def as_json(self, args):
        return not args.providers  # the report is a document, not a table

    @staticmethod
    def _report(agent):
        return agent.discover().report(generation=agent.next_generation())

    def result(self, agent, args):
        report = self._report(agent)
        if not args.providers:
            return report
        return [dict(p, gpu=g['index'], pf=g['address'], model=g['model'])
                for g in report['gpus'] for p in g.get('providers') or ()]

    def rows(self, agent, args):
        return provider_rows(self._report(agent))


class Reconcile(base.ShowOne):
    """Adopt, start and clean up devices, as the agent does each cycle."""

    def result(self, agent, args):
        result = agent.reconcile()
        if result is None:
            raise errors.Unavailable('reconcile needs libvirt')
        return result.as_dict()
