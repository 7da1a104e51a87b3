"""The one client side of Placement and Nova (``nova_gpu.cloud_api``).

Placement is answered by a fake HTTP layer (a keystoneauth Adapter's
``get``/``put``, which is what an openstacksdk proxy offers); Nova by a
stand-in of openstacksdk's compute proxy. The last test checks that no
other module of nova_gpu builds a Placement URL or calls an openstacksdk
proxy: every consumer goes through ``cloud_api``.
"""

import ast
import json
import os
import types

import fixtures
from openstack import exceptions as sdk_exceptions
import testtools

from nova_gpu import cloud_api
from nova_gpu.core import defrag
from nova_gpu.core import exceptions
from nova_gpu.tests.unit import test_layering


class Response:
    def __init__(self, status, body=None):
        self.status_code = status
        self.body = body
        self.text = json.dumps(body) if body is not None else ''

    def json(self):
        if self.body is None:
            raise ValueError('no body')
        return self.body


class FakeAdapter:
    """A keystoneauth Adapter of Placement: ``routes`` maps (method, URL)
    to a Response (or a list of them, answered in turn), or an exception
    to raise.
    """

    def __init__(self, routes):
        self.routes = routes
        self.calls = []

    def _answer(self, method, url, microversion, raise_exc, body=None):
        self.calls.append((method, url, microversion, body))
        assert raise_exc is False, 'errors are read from the status'
        found = self.routes.get((method, url))
        if found is None:
            return Response(404, {'errors': [{'detail': 'no route'}]})
        if isinstance(found, list):
            found = found.pop(0) if len(found) > 1 else found[0]
        if isinstance(found, Exception):
            raise found
        return found

    def get(self, url, microversion=None, raise_exc=True):
        return self._answer('GET', url, microversion, raise_exc)

    def put(self, url, json=None, microversion=None, raise_exc=True):
        return self._answer('PUT', url, microversion, raise_exc, json)


def rp(uuid, name, root=None):
    return {'uuid': uuid, 'name': name, 'root_provider_uuid': root or uuid}


class PlacementTest(testtools.TestCase):

    def placement(self, routes):
        self.http = FakeAdapter(routes)
        return cloud_api.Placement(self.http)

    def test_provider_queries_and_microversions(self):
        p = self.placement({
            ('GET', '/resource_providers?name=host%201'): Response(
                200, {'resource_providers': [rp('u1', 'host 1')]}),
            ('GET', '/resource_providers?in_tree=u1&resources=VGPU:1'):
                Response(200, {'resource_providers': []}),
            ('GET', '/resource_providers/u1/traits'): Response(200, {
                'traits': ['B', 'A'], 'resource_provider_generation': 3})})
        self.assertEqual([rp('u1', 'host 1')], p.providers(name='host 1'))
        self.assertEqual([], p.providers(in_tree='u1', resources='VGPU:1'))
        self.assertEqual((['A', 'B'], 3), p.traits('u1'))
        self.assertEqual({'1.14'}, {c[2] for c in self.http.calls})

    def test_errors_name_the_call_and_the_status(self):
        p = self.placement({
            ('GET', '/resource_providers/u1'): Response(
                503, {'error': 'placement is down'}),
            ('GET', '/resource_providers/u2'): ConnectionError('refused')})
        e = self.assertRaises(cloud_api.ApiError, p.provider, 'u1')
        self.assertEqual(503, e.status)
        self.assertIn('GET /resource_providers/u1: HTTP 503', str(e))
        self.assertIn('placement is down', str(e))
        # An error is a core GpuError: the adapters' handlers know it.
        self.assertIsInstance(e, exceptions.GpuError)
        e = self.assertRaises(cloud_api.ApiError, p.provider, 'u2')
        self.assertIsNone(e.status)
        self.assertEqual('GET /resource_providers/u2: no answer '
                         '(ConnectionError: refused)', str(e))

    def test_an_answer_that_is_not_json(self):
        p = self.placement({('GET', '/allocations/c1'): Response(200)})
        e = self.assertRaises(cloud_api.ApiError, p.allocations, 'c1')
        self.assertIn('GET /allocations/c1: HTTP 200 not JSON', str(e))

    def test_one_cache_of_provider_names(self):
        p = self.placement({
            ('GET', '/resource_providers'): Response(200, {
                'resource_providers': [rp('u1', 'h1'), rp('u2', 'h1_gpu')]}),
            ('GET', '/resource_providers/u3'): Response(200, {
                'uuid': 'u3', 'name': 'h2'}),
            ('GET', '/allocations/c1'): Response(200, {'allocations': {
                'u2': {'resources': {'VGPU': 1}},
                'u3': {'resources': {'VCPU': 2}},
                'gone': {'resources': {'VGPU': 1}}}})})
        p.learn_names()
        self.assertEqual({'h1_gpu': {'VGPU': 1}, 'h2': {'VCPU': 2},
                          'gone': {'VGPU': 1}}, p.allocations_by_name('c1'))
        self.assertEqual('h2', p.name_of('u3'))
        urls = [c[1] for c in self.http.calls]
        # The listing named u2; u3 was asked once, then cached; the
        # provider gone meanwhile (404) keeps its UUID.
        self.assertEqual(['/resource_providers', '/allocations/c1',
                          '/resource_providers/u3',
                          '/resource_providers/gone'], urls)
        self.assertEqual('1.28', self.http.calls[1][2])

    def test_names_expire(self):
        now = [0.0]
        p = self.placement({('GET', '/resource_providers/u1'): Response(
            200, {'name': 'h1'})})
        p._names = cloud_api.cachetools.TTLCache(
            10, cloud_api.PROVIDER_NAMES_TTL, timer=lambda: now[0])
        p.name_of('u1')
        p.name_of('u1')
        now[0] += cloud_api.PROVIDER_NAMES_TTL + 1
        p.name_of('u1')
        self.assertEqual(2, len(self.http.calls))

    def test_other_errors_than_gone_are_not_hidden(self):
        p = self.placement({
            ('GET', '/allocations/c1'): Response(200, {'allocations': {
                'u1': {'resources': {'VGPU': 1}}}}),
            ('GET', '/resource_providers/u1'): Response(500, {})})
        e = self.assertRaises(cloud_api.ApiError, p.allocations_by_name,
                              'c1')
        self.assertEqual(500, e.status)

    def test_set_traits(self):
        url = '/resource_providers/u1/traits'
        p = self.placement({
            ('PUT', url): [Response(409, {'errors': []}), Response(200, {
                'traits': ['CUSTOM_B', 'CUSTOM_A'],
                'resource_provider_generation': 8})],
            ('PUT', '/traits/CUSTOM_A'): Response(204),
            ('PUT', '/traits/CUSTOM_B'): Response(201),
            ('PUT', '/traits/CUSTOM_BAD'): Response(400, {'e': 'bad'})})
        e = self.assertRaises(cloud_api.Conflict, p.set_traits, 'u1',
                              {'CUSTOM_B', 'CUSTOM_A'}, 6)
        self.assertEqual(409, e.status)
        self.assertEqual((['CUSTOM_A', 'CUSTOM_B'], 8), p.set_traits(
            'u1', {'CUSTOM_B', 'CUSTOM_A'}, 7))
        self.assertEqual({'traits': ['CUSTOM_A', 'CUSTOM_B'],
                          'resource_provider_generation': 7},
                         self.http.calls[1][3])
        p.ensure_traits(['CUSTOM_B', 'CUSTOM_A'])
        p.ensure_traits(['CUSTOM_A'])  # known: not asked again
        self.assertEqual(['/traits/CUSTOM_A', '/traits/CUSTOM_B'],
                         [c[1] for c in self.http.calls[2:]])
        e = self.assertRaises(cloud_api.ApiError, p.ensure_traits,
                              ['CUSTOM_BAD'])
        self.assertIn('PUT /traits/CUSTOM_BAD: HTTP 400', str(e))

    def test_nova_report_client(self):
        asked = []

        class ReportClient:
            def get(self, url, version=None):
                asked.append((url, version))
                return Response(200, {'resource_providers': []})
        p = cloud_api.Placement.nova_report_client(ReportClient())
        self.assertEqual([], p.providers(name='node1'))
        self.assertEqual([('/resource_providers?name=node1', '1.14')], asked)


class FakeCompute:
    """openstacksdk's compute proxy, the calls ``cloud_api.Nova`` makes:
    ``states`` lists what each ``get_server`` of a server answers in turn
    (status, host, task state; None: gone).
    """

    def __init__(self, states=None):
        self.states = {k: list(v) for k, v in (states or {}).items()}
        self.calls = []

    def get_server(self, server_id):
        states = self.states.get(server_id) or [None]
        state = states.pop(0) if len(states) > 1 else states[0]
        if state is None:
            raise sdk_exceptions.NotFoundException('no server')
        status, host, task = state
        return types.SimpleNamespace(
            id=server_id, name='vm', status=status, compute_host=host,
            task_state=task, image={'id': 'img'},
            fault={'message': 'boom'} if status == 'ERROR' else None,
            flavor={'extra_specs': {'gpu:profile': 'T4-16C'}})

    def live_migrate_server(self, server_id, host, block_migration):
        self.calls.append(('live_migrate', server_id, host, block_migration))

    def find_flavor(self, name, ignore_missing=True):
        self.calls.append(('find_flavor', name, ignore_missing))
        return types.SimpleNamespace(extra_specs=None, vcpus=4, ram=8192)

    def fetch_flavor_extra_specs(self, flavor):
        return types.SimpleNamespace(extra_specs={'gpu:count': '2'})

    def find_server(self, server_id, ignore_missing=True,
                    all_projects=False):
        self.calls.append(('find_server', server_id, all_projects))
        return None

    def servers(self, **query):
        self.calls.append(('servers', query))
        return iter([types.SimpleNamespace(project_id='p1')])


class NovaTest(testtools.TestCase):

    def test_live_migrate_and_wait(self):
        compute = FakeCompute({'s1': [('MIGRATING', 'a', 'migrating'),
                                      ('ACTIVE', 'b', None)]})
        nova = cloud_api.Nova(compute)
        state = nova.live_migrate_and_wait('s1', 'b', timeout=10,
                                           interval=1, sleep=lambda s: None)
        self.assertEqual(('ACTIVE', 'b'), (state.status, state.host))
        self.assertEqual([('live_migrate', 's1', 'b', 'auto')],
                         compute.calls)

    def test_a_failed_migration_says_why(self):
        for states, words in (
                ([('ERROR', 'a', None)], 'in ERROR: boom'),
                ([('ACTIVE', 'a', None)], 'ACTIVE on a, not b'),
                ([None], 'is gone'),
                ([('MIGRATING', 'a', 'migrating')], 'still migrating')):
            nova = cloud_api.Nova(FakeCompute({'s1': states}))
            e = self.assertRaises(
                defrag.MigrationFailed, nova.live_migrate_and_wait, 's1',
                'b', timeout=3, interval=1, sleep=lambda s: None)
            self.assertIn(words, str(e))

    def test_mover_locates_and_reads_servers(self):
        nova = cloud_api.Nova(FakeCompute({'s1': [('ACTIVE', 'a', None)]}))
        self.assertEqual('a', nova.mover().locate('s1'))
        self.assertIsNone(nova.mover().locate('gone'))
        server = nova.server('s1')
        self.assertEqual(('img', {'gpu:profile': 'T4-16C'}),
                         (server.image_id, server.extra_specs))

    def test_flavor_and_project(self):
        compute = FakeCompute()
        nova = cloud_api.Nova(compute)
        self.assertEqual(({'gpu:count': '2'}, 4, 8192), nova.flavor('big'))
        # A deleted server: found among the deleted ones.
        self.assertEqual('p1', nova.project_of('s9'))
        self.assertEqual([
            ('find_flavor', 'big', False), ('find_server', 's9', True),
            ('servers', {'details': True, 'all_projects': True,
                         'deleted': True, 'uuid': 's9'})], compute.calls)

    def test_delete_metadata_by_key_gone_is_done(self):
        from openstack import exceptions as sdk_exceptions
        calls = []

        def delete(server_id, keys):
            calls.append((server_id, keys))
            if keys == ['gone']:
                raise sdk_exceptions.NotFoundException('no such key')
        nova = cloud_api.Nova(types.SimpleNamespace(
            delete_server_metadata=delete))
        nova.delete_metadata('s1', ['gone', 'k'])
        # one key at a time: the SDK deletes every key when given none
        self.assertEqual([('s1', ['gone']), ('s1', ['k'])], calls)


class CloudTest(testtools.TestCase):

    def test_the_inventory_port(self):
        http = FakeAdapter({
            ('GET', '/resource_providers'): Response(200, {
                'resource_providers': [rp('u1', 'a_gpu')]}),
            ('GET', '/allocations/s1'): Response(200, {'allocations': {
                'u1': {'resources': {'VGPU': 1}}}})})
        image = types.SimpleNamespace(properties={'k': 'v'})
        conn = types.SimpleNamespace(
            placement=http,
            compute=types.SimpleNamespace(servers=lambda **q: [
                types.SimpleNamespace(id='s1', status='ACTIVE',
                                      compute_host='a')]),
            image=types.SimpleNamespace(get_image=lambda i: image))
        cloud = cloud_api.Cloud(conn)
        (server,) = cloud.servers()
        self.assertEqual(('s1', 'a', None), (server.id, server.host,
                                             server.image_id))
        self.assertEqual({'a_gpu': {'VGPU': 1}}, cloud.allocations('s1'))
        self.assertEqual('v', cloud.image_property('img', 'k'))
        self.assertEqual(['/resource_providers', '/allocations/s1'],
                         [c[1] for c in http.calls])


# -- every consumer goes through cloud_api ---------------------------------

# Paths of Placement's API: a string starting with one builds its URL.
PLACEMENT_PATHS = ('/resource_providers', '/allocations', '/traits',
                   '/allocation_candidates', '/resource_classes',
                   '/usages', '/reshaper')
# openstacksdk proxy calls (compute, image) nova-gpu makes.
SDK_CALLS = frozenset((
    'get_server', 'find_server', 'live_migrate_server',
    'set_server_metadata', 'shelve_server', 'shelve_offload_server',
    'delete_server', 'find_flavor', 'fetch_flavor_extra_specs',
    'get_image'))
HTTP_CALLS = frozenset(('get', 'put', 'post', 'delete', 'patch', 'head',
                        'request'))
CLIENT_SIDE = 'nova_gpu.cloud_api'


def _call_problem(node):
    """What a call does with OpenStack itself, or None."""
    func = node.func
    if not isinstance(func, ast.Attribute):
        return None
    receiver = func.value
    if (isinstance(receiver, ast.Attribute) and receiver.attr == 'placement'
            and func.attr in HTTP_CALLS):
        return 'calls .placement.%s' % func.attr
    # On a proxy held in a variable or attribute (not on a cloud_api
    # object built in place).
    if (func.attr in SDK_CALLS
            and isinstance(receiver, (ast.Name, ast.Attribute))):
        return 'calls openstacksdk\'s %s' % func.attr
    if func.attr == 'servers' and any(k.arg == 'all_projects'
                                      for k in node.keywords):
        return 'lists servers through openstacksdk'
    return None


def client_side_problems(found_modules=None):
    """Sentences naming each place outside ``cloud_api`` (and the tools)
    that talks to OpenStack's APIs itself.
    """
    found = []
    for name, path in found_modules or test_layering.modules():
        if name == CLIENT_SIDE or test_layering.layer(
                name) in test_layering.TOOLS:
            continue
        with open(path) as f:
            tree = ast.parse(f.read(), path)
        for node in ast.walk(tree):
            where = '%s line %d' % (name, getattr(node, 'lineno', 0))
            if (isinstance(node, ast.Constant) and isinstance(node.value, str)
                    and node.value.startswith(PLACEMENT_PATHS)):
                found.append('%s: builds the Placement URL %r'
                             % (where, node.value))
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                modules = ([a.name for a in node.names]
                           if isinstance(node, ast.Import)
                           else [node.module or ''])
                found.extend('%s: imports %s' % (where, m) for m in modules
                             if m.split('.')[0] in ('openstack',
                                                    'keystoneauth1'))
            elif isinstance(node, ast.Call):
                problem = _call_problem(node)
                if problem:
                    found.append('%s: %s' % (where, problem))
    return sorted(set(found))


class ClientSideTest(testtools.TestCase):

    def test_every_consumer_uses_cloud_api(self):
        self.assertEqual([], client_side_problems())

    def test_the_scan_finds_its_own_kind(self):
        tmp = self.useFixture(fixtures.TempDir()).path
        path = os.path.join(tmp, 'probe.py')
        with open(path, 'w') as f:
            f.write('import openstack\n'
                    'def f(conn, uuid):\n'
                    '    """GET /resource_providers is fine here."""\n'
                    '    conn.placement.get("/resource_providers/%s"\n'
                    '                       % uuid)\n'
                    '    conn.compute.live_migrate_server(uuid)\n'
                    '    self.compute.get_server(uuid)\n'
                    '    compute.servers(details=True, all_projects=True)\n'
                    '    cloud_api.Nova(conn.compute).find_server(uuid)\n')
        self.assertEqual([
            'nova_gpu.reclaim.probe line 1: imports openstack',
            "nova_gpu.reclaim.probe line 4: builds the Placement URL "
            "'/resource_providers/%s'",
            'nova_gpu.reclaim.probe line 4: calls .placement.get',
            "nova_gpu.reclaim.probe line 6: calls openstacksdk's "
            "live_migrate_server",
            "nova_gpu.reclaim.probe line 7: calls openstacksdk's "
            "get_server",
            'nova_gpu.reclaim.probe line 8: lists servers through '
            'openstacksdk'],
            client_side_problems([('nova_gpu.reclaim.probe', path)]))
        # The tools (tests, bench, demo) may talk to the cloud directly.
        self.assertEqual([], client_side_problems(
            [('nova_gpu.bench.probe', path)]))
