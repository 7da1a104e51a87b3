"""The compute and Placement APIs, through ``nova_gpu.cloud_api``.

``SdkCompute`` is what the service acts with; the executor and the
service only call the methods below, so tests (and the functional test,
through Nova's in-process API) give another object with the same ones:

``servers()`` every server with its flavor's extra specs and its GPU
allocations; ``server(id)`` one (None once gone); ``flavor(name_or_id)``;
``set_metadata``; ``shelve``; ``shelve_offload``; ``delete``;
``live_migrate`` (ask for it; the executor waits,
``core.defrag.CallbackMover``).
"""

import re

from nova_gpu import cloud_api
from nova_gpu import conf as conf_mod
from nova_gpu.reclaim import planner_view as inventory

CONF = conf_mod.CONF
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
    """Nova and Placement of an openstacksdk ``Connection``
    (``cloud_api``: its one cache of provider names).
    """

    def __init__(self, conn=None, cloud=None):
        self.conn = conn or cloud_api.connect(cloud)
        self.placement = cloud_api.Placement.of(self.conn)
        self.nova = cloud_api.Nova(self.conn.compute)

    def _info(self, server):
        specs = server.extra_specs
        providers = (gpu_providers(
            self.placement.allocations(server.id), self.placement.name_of)
            if asks_gpu(specs) else {})
        return inventory.ServerInfo(
            server.id, server.name, server.host, server.status,
            server.project_id, server.user_id, specs, providers)

    def servers(self):
        return [self._info(s) for s in self.nova.servers()]

    def server(self, server_id):
        server = self.nova.server(server_id)
        return None if server is None else self._info(server)

    def flavor(self, name_or_id):
        """(extra specs, vcpus, memory MiB) of a flavor."""
        return self.nova.flavor(name_or_id)

    def set_metadata(self, server_id, metadata):
        self.nova.set_metadata(server_id, metadata)

    def shelve(self, server_id):
        self.nova.shelve(server_id)

    def shelve_offload(self, server_id):
        self.nova.shelve_offload(server_id)

    def delete(self, server_id):
        self.nova.delete(server_id)

    def live_migrate(self, server_id, host):
        self.nova.live_migrate(server_id, host)
