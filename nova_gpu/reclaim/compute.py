"""The compute and Placement APIs, through openstacksdk.

``SdkCompute`` is what the service acts with; the executor and the
service only call the methods below, so tests (and the functional test,
through Nova's in-process API) give another object with the same ones:

``servers()`` every server with its flavor's extra specs and its GPU
allocations; ``server(id)`` one (None once gone); ``flavor(name_or_id)``;
``set_metadata``; ``shelve``; ``shelve_offload``; ``delete``;
``live_migrate``.
"""

import re

import cachetools
import openstack
from openstack import exceptions as sdk_exceptions

from nova_gpu import conf as conf_mod
from nova_gpu.reclaim import inventory

CONF = conf_mod.CONF
PLACEMENT_MICROVERSION = '1.28'
_GPU_KEY = re.compile(r'^(gpu:|pci_passthrough:alias$|resources[^:]*:)')


def gpu_classes():
    """Resource classes of GPU devices (``[gpu_scheduler]`` options)."""
    o = CONF.gpu_scheduler
    return frozenset((o.vgpu_resource_class, o.vfio_vgpu_resource_class,
                      o.whole_gpu_resource_class))


def asks_gpu(extra_specs):
    """Whether a flavor may hold GPU devices (worth asking Placement)."""
    return any(_GPU_KEY.match(k) for k in extra_specs or ())


def gpu_providers(allocations, name_of, classes=None):
    """{provider name: {GPU resource class: amount}} of an allocation
    document (``GET /allocations/{consumer}``'s ``allocations``).
    """
    classes = classes or gpu_classes()
    result = {}
    for rp_uuid, alloc in sorted((allocations or {}).items()):
        gpu = {rc: n for rc, n in (alloc.get('resources') or {}).items()
               if rc in classes and n}
        if gpu:
            result[name_of(rp_uuid)] = gpu
    return result


class SdkCompute:
    """Nova and Placement through an openstacksdk ``Connection``."""

    def __init__(self, conn=None, cloud=None):
        self.conn = conn or openstack.connect(cloud=cloud)
        # Provider UUID -> name: providers live as long as their host.
        self._names = cachetools.TTLCache(maxsize=65536, ttl=3600)

    def _name_of(self, rp_uuid):
        name = self._names.get(rp_uuid)
        if name is None:
            name = self.conn.placement.get(
                '/resource_providers/%s' % rp_uuid,
                microversion=PLACEMENT_MICROVERSION).json()['name']
            self._names[rp_uuid] = name
        return name

    def _allocations(self, server_id):
        response = self.conn.placement.get(
            '/allocations/%s' % server_id,
            microversion=PLACEMENT_MICROVERSION)
        return response.json().get('allocations') or {}

    def _info(self, server):
        flavor = server.flavor or {}
        specs = dict(flavor.get('extra_specs') or {})
        providers = (gpu_providers(self._allocations(server.id),
                                   self._name_of)
                     if asks_gpu(specs) else {})
        return inventory.ServerInfo(
            server.id, server.name, server.compute_host, server.status,
            server.project_id, server.user_id, specs, providers)

    def servers(self):
        return [self._info(s) for s in self.conn.compute.servers(
            details=True, all_projects=True)]

    def server(self, server_id):
        try:
            return self._info(self.conn.compute.get_server(server_id))
        except sdk_exceptions.NotFoundException:
            return None

    def flavor(self, name_or_id):
        """(extra specs, vcpus, memory MiB) of a flavor."""
        flavor = self.conn.compute.find_flavor(name_or_id,
                                               ignore_missing=False)
        specs = flavor.extra_specs
        if specs is None:
            specs = self.conn.compute.fetch_flavor_extra_specs(
                flavor).extra_specs
        return dict(specs or {}), flavor.vcpus, flavor.ram

    def set_metadata(self, server_id, metadata):
        self.conn.compute.set_server_metadata(server_id, **metadata)

    def shelve(self, server_id):
        self.conn.compute.shelve_server(server_id)

    def shelve_offload(self, server_id):
        self.conn.compute.shelve_offload_server(server_id)

    def delete(self, server_id):
        self.conn.compute.delete_server(server_id)

    def live_migrate(self, server_id, host):
        self.conn.compute.live_migrate_server(server_id, host=host,
                                              block_migration='auto')
