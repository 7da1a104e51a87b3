"""nova-compute's GPU resource providers in Placement (``cloud_api``).

nova-compute owns these providers (trait ``OWNER_NOVA``; it replaces the
traits of its PCI-in-Placement providers after each ``[compute]
resource_provider_association_refresh``). The agent reads them, to put
each provider's UUID in the report and to log providers nova-compute has
not created yet, and writes one thing: the set traits of the *heads* of
GPUs whose VFs are providers (``core.gpu_sets``), one free VF per GPU,
moved when a guest takes it. Only a VF mdev (VGPU) provider gets them:
the libvirt driver only adds ``OWNER_NOVA`` to those and keeps the rest
(``_ensure_pgpu_providers``), so they stay. Traits that never move
(topology, the set traits of GPUs that stand for themselves) reach the
providers through the provider config file (``provider_config``).
"""

from oslo_log import log as logging

from nova_gpu import cloud_api
from nova_gpu.core import gpu_sets
from nova_gpu.core import report as report_mod

LOG = logging.getLogger(__name__)
# 1.14: providers' root_provider_uuid and the in_tree filter.
MICROVERSION = cloud_api.PROVIDERS_VERSION


def connect(cloud):
    """openstacksdk connection from a clouds.yaml entry."""
    return cloud_api.connect(cloud)


class PlacementClient:
    """The agent's reads of its host's providers and its head traits."""

    def __init__(self, conn):
        self.placement = cloud_api.Placement.of(conn)
        # (report, providers) of the last annotate, for quick head passes.
        self.last = None

    def providers(self, names):
        """{name: {'uuid', 'generation', 'root', 'traits', 'owner_nova'}}
        of the providers that exist; missing names are left out.
        """
        # Imported here: only a host that reads Placement needs os-traits
        # (with openstacksdk); the agent and the CLI run without them.
        import os_traits
        found = {}
        for name in names:
            rps = self.placement.providers(name=name)
            if not rps:
                continue
            rp = rps[0]
            traits, generation = self.placement.traits(rp['uuid'])
            found[name] = {'uuid': rp['uuid'],
                           'generation': generation,
                           'root': rp['root_provider_uuid'],
                           'traits': traits,
                           'owner_nova': os_traits.OWNER_NOVA in traits}
        return found

    def annotate(self, report):
        """Add the providers' UUIDs (and what is missing) to a report.

        Each GPU gets ``provider_uuids`` ({provider name: UUID or None},
        for every provider it lists) and ``provider_uuid`` (schema 1: the
        first provider's).
        """
        names = sorted({p['name'] for p in _providers(report)})
        found = self.providers(names)
        for g in report['gpus']:
            g['provider_uuids'] = {
                p['name']: (found.get(p['name']) or {}).get('uuid')
                for p in _providers({'gpus': [g]})}
            info = found.get(g.get('provider'))
            g['provider_uuid'] = info['uuid'] if info else None
        missing = sorted(set(names) - set(found))
        if missing:
            LOG.warning('GPU providers not in Placement yet (nova-compute '
                        'creates them): %s', ', '.join(missing))
        report.setdefault('agent', {})['placement_missing'] = missing
        report['agent']['heads_moved'] = self.keep_heads(report, found)
        self.last = (report, found)
        return report

    def keep_heads(self, report, found):
        """Put each SR-IOV + mdev GPU's set traits on its heads, free VFs
        (``core.gpu_sets.heads``); return how many providers' traits
        changed.

        ``found``: ``providers``'s answer for the report's providers,
        updated in place with what is written, so that the agent's quick
        passes between cycles (``Agent.keep_heads``) cost one request per
        host when no head moves. Free is Placement's word (``GET
        /resource_providers?in_tree=&resources=VGPU:1``: room for one more
        vGPU), so a VF claimed for a guest still being built is not free.
        A generation conflict (nova-compute or a claim wrote the provider
        meanwhile) reads the provider again and retries once; a second
        one waits for the next pass.
        """
        vfs = {p['name'] for p in _providers(report)
               if p.get('kind') == report_mod.VF_MDEV and p['name'] in found}
        if not vfs:
            return 0
        free = set()
        roots = {found[n]['root'] for n in vfs if found[n]['root']}
        for root in sorted(roots):
            free.update(rp['name'] for rp in self.placement.providers(
                in_tree=root, resources='%s:1' % report_mod.VGPU_RC))
        current = {n for n in vfs
                   if any(gpu_sets.is_set_trait(t)
                          for t in found[n]['traits'])}
        plan = gpu_sets.heads(report['gpus'], free.__contains__, current)
        changed = 0
        for name, wanted in sorted(plan.items()):
            info = found.get(name)
            if info is not None and self._set_traits(name, info, wanted):
                changed += 1
        return changed

    def _set_traits(self, name, info, wanted):
        """Make the set traits of provider ``info`` be ``wanted``; True if
        that took a write.
        """
        for attempt in range(2):
            have = {t for t in info['traits'] if gpu_sets.is_set_trait(t)}
            if have == set(wanted):
                return False
            self.placement.ensure_traits(wanted)
            traits = (set(info['traits']) - have) | set(wanted)
            try:
                info['traits'], info['generation'] = (
                    self.placement.set_traits(info['uuid'], traits,
                                              info['generation']))
            except cloud_api.Conflict:
                # Written meanwhile: read it again (its traits too).
                info['traits'], info['generation'] = self.placement.traits(
                    info['uuid'])
                continue
            LOG.info('GPU set traits %s %s', 'on' if wanted else 'off',
                     name)
            return True
        LOG.debug('set traits of %s: generation conflicts, next pass', name)
        return False


def _providers(report):
    """Every provider dict of a report; a schema 1 GPU gives its name."""
    for g in report['gpus']:
        listed = g.get('providers')
        if listed is None and g.get('provider'):
            listed = [{'name': g['provider']}]
        yield from listed or ()
