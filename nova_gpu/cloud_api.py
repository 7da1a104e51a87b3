"""The one client side of the cloud's OpenStack APIs: Placement and Nova.

Every service of nova-gpu that talks to the cloud does it here: the agent
(its providers and their set traits), the scheduler (provider name ->
UUID), the exporter (a server's project), the reclaimer and the
defragmenter (servers, their GPU allocations, live migration) and the
``openstack gpu`` commands. Nothing else builds a Placement URL or calls
an openstacksdk proxy (``tests/unit/test_cloud_api.py`` checks it).

How each service reaches the cloud is unchanged:

* ``connect(cloud)``: an openstacksdk ``Connection`` from a clouds.yaml
  entry (``[gpu_agent] placement_cloud``, ``[gpu_exporter] cloud``,
  ``[gpu_reclaimer] cloud``, ``[gpu_defrag] cloud``; unset: the ``OS_*``
  environment), or the one OpenStackClient built (``openstack gpu``);
* ``Placement.nova_report_client()``: nova-scheduler's own Placement
  client (Nova's ``[placement]`` keystoneauth options), in the scheduler.

``Placement`` takes any keystoneauth ``Adapter`` of the placement service
(an openstacksdk proxy is one). Its calls raise ``ApiError`` (a
``core.exceptions.GpuError``) naming the call and the HTTP status; callers
on a scheduling path contain it. Provider names learnt from any answer
are kept in one cache (``PROVIDER_NAMES_TTL``): providers live as long as
their host. ``Nova`` wraps the compute proxy; ``Nova.mover`` binds the
core's migration rule (``core.defrag.CallbackMover``: live-migrate, then
wait until the server is ACTIVE on its destination, or fail) to Nova.
``Cloud`` is both, as ``core.inventory.read_servers`` reads the cloud.
"""

import threading
import typing
from urllib import parse

import cachetools

from nova_gpu.core import defrag
from nova_gpu.core import exceptions

# 1.14: providers' root_provider_uuid and the in_tree filter.
PROVIDERS_VERSION = '1.14'
# 1.28: allocations with their consumer generation.
ALLOCATIONS_VERSION = '1.28'
# Provider UUID -> name, at most, and for how long (a provider lives as
# long as its host; one renamed is rare and costs a stale name an hour).
MAX_PROVIDER_NAMES = 65536
PROVIDER_NAMES_TTL = 3600
# Characters of an error answer kept in an ApiError.
ERROR_TEXT = 200


class ApiError(exceptions.GpuError):
    """A cloud API call failed: ``call`` (method and URL), ``status``
    (the HTTP status; None when no answer came).
    """

    def __init__(self, call, status, text=''):
        self.call = call
        self.status = status
        text = (text or '')[:ERROR_TEXT]
        if status is None:
            super().__init__('%s: no answer (%s)' % (call, text))
        else:
            super().__init__('%s: HTTP %d%s' % (
                call, status, ' %s' % text if text else ''))


class Conflict(ApiError):
    """HTTP 409: a generation conflict (the provider was written)."""


def connect(cloud=None, timeout=None):
    """An openstacksdk ``Connection`` to a clouds.yaml entry (None: the
    ``OS_*`` environment, or ``OS_CLOUD``); ``timeout``: seconds one API
    call may take (openstacksdk's ``api_timeout``; None: its default).
    """
    # Imported here: only the services that talk to the cloud need it.
    import openstack
    if timeout is None:
        return openstack.connect(cloud=cloud)
    return openstack.connect(cloud=cloud, api_timeout=timeout)


def _query(**params):
    """``?k=v&...`` of the params that are set, values quoted (the ``:``
    and ``,`` of ``resources`` kept, as Placement writes them).
    """
    found = ['%s=%s' % (k, parse.quote(str(v), safe=':,' if k ==
                                       'resources' else '/'))
             for k, v in params.items() if v is not None]
    return '?' + '&'.join(found) if found else ''


class _ReportClientAdapter:
    """Nova's ``SchedulerReportClient`` as a keystoneauth Adapter."""

    def __init__(self, client):
        self.client = client

    def get(self, url, microversion=None, raise_exc=False):
        return self.client.get(url, version=microversion)

    def put(self, url, json=None, microversion=None, raise_exc=False):
        return self.client.put(url, json, version=microversion)


class Placement:
    """Placement's REST calls nova-gpu makes, with the microversions."""

    def __init__(self, adapter):
        self.adapter = adapter
        self._lock = threading.Lock()
        self._names = cachetools.TTLCache(MAX_PROVIDER_NAMES,
                                          PROVIDER_NAMES_TTL)
        self._known_traits = set()

    @classmethod
    def of(cls, conn):
        """The Placement of an openstacksdk ``Connection``."""
        return cls(conn.placement)

    @classmethod
    def nova_report_client(cls, client=None):
        """Placement through nova-scheduler's own report client."""
        if client is None:
            from nova.scheduler.client import report
            client = report.report_client_singleton()
        return cls(_ReportClientAdapter(client))

    # -- the HTTP layer ---------------------------------------------------

    def _call(self, method, url, version, ok=(200,), **kw):
        call = '%s %s' % (method.upper(), url)
        try:
            resp = getattr(self.adapter, method)(
                url, microversion=version, raise_exc=False, **kw)
        except Exception as e:  # unreachable, timed out, no endpoint
            raise ApiError(call, None, '%s: %s' % (
                type(e).__name__, e)) from e
        status = resp.status_code
        if status not in ok:
            error = Conflict if status == 409 else ApiError
            raise error(call, status, getattr(resp, 'text', '') or '')
        return resp

    def _get(self, url, version=PROVIDERS_VERSION):
        resp = self._call('get', url, version)
        try:
            return resp.json()
        except ValueError as e:
            raise ApiError('GET %s' % url, resp.status_code,
                           'not JSON: %s' % e) from e

    # -- providers --------------------------------------------------------

    def _learn(self, rps):
        with self._lock:
            for rp in rps:
                if rp.get('uuid') and rp.get('name'):
                    self._names[rp['uuid']] = rp['name']
        return rps

    def providers(self, name=None, in_tree=None, resources=None):
        """``GET /resource_providers`` (1.14), filtered as given."""
        body = self._get('/resource_providers' + _query(
            name=name, in_tree=in_tree, resources=resources))
        return self._learn(body.get('resource_providers') or [])

    def provider(self, rp_uuid):
        """``GET /resource_providers/{uuid}`` (1.14)."""
        body = self._get('/resource_providers/%s' % rp_uuid)
        self._learn([{'uuid': rp_uuid, 'name': body.get('name')}])
        return body

    def learn_names(self):
        """Every provider's name at once (one listing), for what follows
        to find them in the cache.
        """
        self.providers()

    def name_of(self, rp_uuid):
        """The name of provider ``rp_uuid`` (cached)."""
        with self._lock:
            name = self._names.get(rp_uuid)
        if name is None:
            name = self.provider(rp_uuid)['name']
        return name

    def traits(self, rp_uuid):
        """(traits, generation) of a provider."""
        body = self._get('/resource_providers/%s/traits' % rp_uuid)
        return (sorted(body.get('traits') or ()),
                body['resource_provider_generation'])

    def set_traits(self, rp_uuid, traits, generation):
        """Replace a provider's traits; its (traits, generation) after.

        Raises ``Conflict`` when ``generation`` is not the provider's.
        """
        body = self._call(
            'put', '/resource_providers/%s/traits' % rp_uuid,
            PROVIDERS_VERSION, json={
                'traits': sorted(traits),
                'resource_provider_generation': generation}).json()
        return sorted(body['traits']), body['resource_provider_generation']

    def ensure_traits(self, traits):
        """Custom traits exist before a provider names them."""
        for trait in sorted(set(traits) - self._known_traits):
            self._call('put', '/traits/%s' % trait, PROVIDERS_VERSION,
                       ok=(201, 204))
            self._known_traits.add(trait)

    # -- allocations ------------------------------------------------------

    def allocations(self, consumer):
        """``GET /allocations/{consumer}`` (1.28): {provider UUID:
        {'resources': {class: amount}, ...}}.
        """
        body = self._get('/allocations/%s' % consumer, ALLOCATIONS_VERSION)
        return body.get('allocations') or {}

    def allocations_by_name(self, consumer):
        """{provider name: {class: amount}} of a consumer; a provider
        gone meanwhile keeps its UUID as its name.
        """
        found = {}
        for rp_uuid, alloc in self.allocations(consumer).items():
            try:
                name = self.name_of(rp_uuid)
            except ApiError as e:
                if e.status != 404:
                    raise
                name = rp_uuid
            found[name] = dict(alloc.get('resources') or {})
        return found


class Server(typing.NamedTuple):
    """A server as nova-gpu reads it from Nova."""

    id: str
    name: str
    host: str            # compute host (admin)
    status: str
    task_state: str = None
    project_id: str = None
    user_id: str = None
    image_id: str = None  # None: booted from a volume
    flavor: dict = None   # the embedded flavor (2.47+), with extra_specs
    fault: str = None

    @property
    def extra_specs(self):
        return dict((self.flavor or {}).get('extra_specs') or {})


def _server(s):
    image = getattr(s, 'image', None) or {}
    fault = getattr(s, 'fault', None) or {}
    return Server(
        s.id, getattr(s, 'name', None), getattr(s, 'compute_host', None),
        getattr(s, 'status', None), getattr(s, 'task_state', None),
        getattr(s, 'project_id', None), getattr(s, 'user_id', None),
        image.get('id') if isinstance(image, dict) else None,
        getattr(s, 'flavor', None) or {},
        fault.get('message') if isinstance(fault, dict) else None)


class Nova:
    """Nova's compute calls nova-gpu makes (an openstacksdk proxy)."""

    def __init__(self, compute):
        self.compute = compute

    def servers(self):
        """Every server, all projects."""
        return [_server(s) for s in self.compute.servers(
            details=True, all_projects=True)]

    def server(self, server_id):
        """One server by ID, None once gone."""
        from openstack import exceptions as sdk_exceptions
        try:
            return _server(self.compute.get_server(server_id))
        except sdk_exceptions.NotFoundException:
            return None

    def find(self, name_or_id):
        """A server by name or ID (raises when there is none)."""
        return _server(self.compute.find_server(name_or_id,
                                                ignore_missing=False))

    def project_of(self, server_id):
        """The project of a server, deleted ones too; None if unknown."""
        server = self.compute.find_server(server_id, ignore_missing=True,
                                          all_projects=True)
        if server is None:
            # Deleted before it was looked up: admins read deleted
            # servers with the "deleted" filter.
            found = list(self.compute.servers(
                details=True, all_projects=True, deleted=True,
                uuid=server_id))
            server = found[0] if found else None
        return getattr(server, 'project_id', None) or None

    def flavor(self, name_or_id):
        """(extra specs, vcpus, memory MiB) of a flavor."""
        flavor = self.compute.find_flavor(name_or_id, ignore_missing=False)
        specs = getattr(flavor, 'extra_specs', None)
        if specs is None:
            specs = self.compute.fetch_flavor_extra_specs(
                flavor).extra_specs
        return (dict(specs or {}), getattr(flavor, 'vcpus', None),
                getattr(flavor, 'ram', None))

    def set_metadata(self, server_id, metadata):
        self.compute.set_server_metadata(server_id, **metadata)

    def delete_metadata(self, server_id, keys):
        """Remove ``keys`` (never all metadata) from a server's metadata;
        a key or server already gone is skipped.
        """
        from openstack import exceptions as sdk_exceptions
        for key in keys:
            try:
                self.compute.delete_server_metadata(server_id, [key])
            except sdk_exceptions.NotFoundException:
                continue

    def shelve(self, server_id):
        self.compute.shelve_server(server_id)

    def shelve_offload(self, server_id):
        self.compute.shelve_offload_server(server_id)

    def delete(self, server_id):
        self.compute.delete_server(server_id)

    def live_migrate(self, server_id, host):
        """Ask for a live migration to ``host``: Nova's scheduler checks
        it (no ``force``), and chooses block migration (``'auto'``).
        """
        self.compute.live_migrate_server(server_id, host=host,
                                         block_migration='auto')

    def server_state(self, server_id):
        """``core.defrag.ServerState`` of a server, None once gone."""
        server = self.server(server_id)
        if server is None:
            return None
        return defrag.ServerState(server.status, server.host,
                                  server.task_state, server.fault)

    def mover(self, timeout=600.0, interval=2.0, **kw):
        """A ``core.defrag.Mover`` through this Nova."""
        return defrag.CallbackMover(self.live_migrate, self.server_state,
                                    timeout=timeout, interval=interval, **kw)

    def live_migrate_and_wait(self, server_id, host, timeout=600.0,
                              interval=2.0, **kw):
        """Live-migrate, then wait until the server is ACTIVE on ``host``;
        raises ``core.defrag.MigrationFailed`` (ERROR, gone, rolled back,
        still migrating after ``timeout``).
        """
        mover = self.mover(timeout, interval, **kw)
        mover.live_migrate(server_id, host)
        return mover.wait(server_id, host)


class Cloud:
    """Placement and Nova of one openstacksdk ``Connection``.

    It is the cloud ``core.inventory.read_servers`` reads: ``servers()``,
    ``allocations(server_id)`` (by provider name), ``image_property``.
    """

    def __init__(self, conn):
        self.conn = conn
        self.placement = Placement.of(conn)
        self.nova = Nova(conn.compute)

    def servers(self):
        """Every server; the providers' names learnt at once first, so
        that ``allocations`` finds them without a request each.
        """
        self.placement.learn_names()
        return self.nova.servers()

    def allocations(self, server_id):
        return self.placement.allocations_by_name(server_id)

    def image_property(self, image_id, key):
        """A property of an image (Glance), None when it has none."""
        image = self.conn.image.get_image(image_id)
        props = dict(getattr(image, 'properties', None) or {})
        return props.get(key, getattr(image, key, None))
