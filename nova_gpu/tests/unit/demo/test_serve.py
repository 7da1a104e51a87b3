"""The small WSGI pieces of the served demo (nova_gpu.demo.serve).

The served cloud itself runs in nova_gpu/tests/functional/demo/test_serve.py
with
the real openstack command; here, the token rule, the image API and the
identity version document, on plain WSGI environ dicts.
"""

import datetime
import json
from wsgiref import util

import testtools

from nova_gpu.demo import serve

PROJECT = 'demo-project'


def call(app, path, method='GET', headers=None, query=''):
    environ = {'PATH_INFO': path, 'REQUEST_METHOD': method,
               'QUERY_STRING': query}
    util.setup_testing_defaults(environ)
    environ['PATH_INFO'] = path
    environ.update(headers or {})
    got = {}

    def start_response(status, response_headers):
        got['status'] = int(status.split()[0])
    body = b''.join(app(environ, start_response))
    return got['status'], (json.loads(body) if body else None), environ


class Recorder:
    """A WSGI app that answers 200 and keeps the environ it was given."""

    def __call__(self, environ, start_response):
        self.environ = environ
        start_response('200 OK', [])
        return [b'']


class TokenAuthTest(testtools.TestCase):

    def setUp(self):
        super().setUp()
        self.app = Recorder()
        self.auth = serve.TokenAuth(self.app, PROJECT)

    def test_admin_token_is_the_demo_projects_admin(self):
        status, _b, _e = call(self.auth, '/v2.1/servers',
                              headers={'HTTP_X_AUTH_TOKEN': 'admin'})
        self.assertEqual(200, status)
        env = self.app.environ
        self.assertEqual(('admin', PROJECT, 'admin,member,reader'),
                         (env['HTTP_X_AUTH_USER'],
                          env['HTTP_X_AUTH_PROJECT_ID'],
                          env['HTTP_X_ROLES']))

    def test_user_project_token_is_a_member(self):
        call(self.auth, '/v2.1/servers',
             headers={'HTTP_X_AUTH_TOKEN': 'alice:p1',
                      # what the client says itself is ignored
                      'HTTP_X_ROLES': 'admin'})
        env = self.app.environ
        self.assertEqual(('alice', 'p1', 'member,reader'),
                         (env['HTTP_X_AUTH_USER'],
                          env['HTTP_X_AUTH_PROJECT_ID'],
                          env['HTTP_X_ROLES']))

    def test_no_token_refused_but_versions_open(self):
        status, body, _e = call(self.auth, '/v2.1/servers',
                                headers={'HTTP_X_ROLES': 'admin'})
        self.assertEqual(401, status)
        self.assertIn('X-Auth-Token', body['error']['message'])
        self.assertFalse(hasattr(self.app, 'environ'))
        status, _b, _e = call(self.auth, '/v2.1/')
        self.assertEqual(200, status)
        self.assertNotIn('HTTP_X_AUTH_USER', self.app.environ)


class FakeGlance:
    images = [
        {'id': 'b-id', 'name': 'other', 'status': 'active',
         'created_at': datetime.datetime(
             2011, 1, 1, 1, 2, 3, tzinfo=datetime.timezone.utc),
         'properties': {'architecture': 'x86_64'}, 'deleted': False},
        {'id': 'a-id', 'name': 'nova-gpu-demo', 'status': 'active',
         'properties': {}},
    ]

    def detail(self, context):
        return [dict(i) for i in self.images]


class ImageApiTest(testtools.TestCase):

    def setUp(self):
        super().setUp()
        self.api = serve.ImageApi(FakeGlance())

    def test_list_and_filters(self):
        status, body, _e = call(self.api, '/v2/images')
        self.assertEqual(200, status)
        self.assertEqual(['a-id', 'b-id'], [i['id'] for i in body['images']])
        _s, body, _e = call(self.api, '/v2/images', query='name=nova-gpu-demo')
        self.assertEqual(['a-id'], [i['id'] for i in body['images']])
        _s, body, _e = call(self.api, '/v2/images', query='id=in:b-id,x')
        self.assertEqual(['b-id'], [i['id'] for i in body['images']])

    def test_show_as_glance_v2(self):
        status, body, _e = call(self.api, '/v2/images/b-id')
        self.assertEqual(200, status)
        self.assertEqual('2011-01-01T01:02:03Z', body['created_at'])
        # properties are top-level fields in Glance v2
        self.assertEqual('x86_64', body['architecture'])
        self.assertNotIn('properties', body)
        self.assertNotIn('deleted', body)
        self.assertEqual('/v2/images/b-id', body['self'])

    def test_unknown_image_and_writes(self):
        status, body, _e = call(self.api, '/v2/images/nope')
        self.assertEqual(404, status)
        self.assertIn('nope', body['error'])
        status, _b, _e = call(self.api, '/v2/images', method='POST')
        self.assertEqual(405, status)

    def test_version_document(self):
        status, body, _e = call(self.api, '/')
        self.assertEqual(200, status)
        (version,) = body['versions']
        self.assertTrue(version['links'][0]['href'].endswith('/v2/'))


class IdentityVersionTest(testtools.TestCase):

    def test_discovery_only(self):
        status, body, _e = call(serve.IdentityVersion(), '/v3')
        self.assertEqual(200, status)
        self.assertEqual('v3.14', body['version']['id'])
        status, body, _e = call(serve.IdentityVersion(), '/v3/projects')
        self.assertEqual(404, status)
        self.assertIn('no identity service', body['error']['message'])
