"""Read nova-compute's GPU resource providers from Placement (openstacksdk).

nova-compute owns these providers (trait ``OWNER_NOVA``; it replaces the
traits of its PCI-in-Placement providers after each ``[compute]
resource_provider_association_refresh``), so the agent only *reads* them: to
put each provider's UUID in the report and to log providers nova-compute
has not created yet. Topology traits reach the providers through the
provider config file (``provider_config``), never through this API.
"""

from oslo_log import log as logging

LOG = logging.getLogger(__name__)
TRAITS_MICROVERSION = '1.6'


def connect(cloud):
    """openstacksdk connection from a clouds.yaml entry."""
    import openstack
    return openstack.connect(cloud=cloud)


class PlacementReader:
    def __init__(self, conn):
        self.placement = conn.placement

    def providers(self, names):
        """{name: {'uuid', 'generation', 'traits', 'owner_nova'}} of the
        providers that exist; missing names are left out.
        """
        # Imported here: only a host that reads Placement needs os-traits
        # (with openstacksdk); the agent and the CLI run without them.
        import os_traits
        found = {}
        for name in names:
            rps = list(self.placement.resource_providers(name=name))
            if not rps:
                continue
            rp = rps[0]
            resp = self.placement.get(
                '/resource_providers/%s/traits' % rp.id,
                microversion=TRAITS_MICROVERSION)
            traits = sorted(resp.json().get('traits', ()))
            found[name] = {'uuid': rp.id, 'generation': rp.generation,
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
        return report


def _providers(report):
    """Every provider dict of a report; a schema 1 GPU gives its name."""
    for g in report['gpus']:
        listed = g.get('providers')
        if listed is None and g.get('provider'):
            listed = [{'name': g['provider']}]
        yield from listed or ()
