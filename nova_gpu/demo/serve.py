"""nova-gpu-demo --serve: the all-in-one GPU cloud, for any OpenStack client.

Starts the demo's cloud (``nova_gpu.tests.harness.cloud``: real Nova API,
conductor, scheduler and nova-compute with the libvirt driver on simulated
GPU hypervisors, real Placement, the nova-gpu filter and weighers), then
serves on real 127.0.0.1 ports what the harness otherwise reaches through
wsgi-intercept only:

* Nova's compute API (the very WSGI application the harness runs);
* Placement's API (likewise);
* a read-only image API (Glance v2's ``/v2/images``) listing the harness's
  fake Glance images, so that ``openstack server create --image`` finds
  them;
* nova-gpu-exporter's API (``/metrics`` and ``/v1``), which ``openstack
  gpu ...`` reads, fed with every GPU report the demo's stand-in agent
  publishes and every notification of the scheduler (refusals by reason,
  placements);
* an identity v3 version document, nothing more: OpenStackClient
  discovers the identity API before some commands (``flavor set``).

It writes a ``clouds.yaml`` for them, creates the demo's GPU flavors, and
runs until SIGINT or SIGTERM. Authentication is the harness's: there is
no Keystone. The token names the caller, as Placement's ``noauth2`` does:
``admin`` is the admin of the demo project, ``USER:PROJECT`` a member of
PROJECT. Everything listens on 127.0.0.1 only.

No nova-gpu-agent runs here (the hosts are simulated): a thread plays its
part, publishing every host's report to the schedulers and the exporter
every ``--report-interval`` seconds, as a real agent does after each
device change.

Run it with ``tools/run-demo.sh --serve``.
"""

import argparse
import copy
import datetime
import json
import logging
import os
import signal
import sys
import tempfile
import threading
import traceback
import urllib.parse
import warnings

from nova_gpu import atomic_file

ADDRESS = '127.0.0.1'
CLOUD = 'nova-gpu-demo'
IMAGE_NAME = 'nova-gpu-demo'
# The demo's image: a fixed UUID, so that scripts can name it.
IMAGE_ID = 'd3a1c0de-6a9e-4c1b-9b5e-0000000000d0'
REPORT_INTERVAL = 2.0
ADMIN_TOKEN = 'admin'
# The compute microversion the clouds.yaml asks: from 2.86 on, Nova runs
# the flavor extra spec validators (nova-gpu's refuses a bad gpu: value).
COMPUTE_API_VERSION = '2.95'


def _flavors():
    """The flavors served: the scenario's, and some that ask by need.

    gpu.20g asks "a vGPU with at least 20 GB", whatever the model; with
    ``gpu:backend=vfio`` it is served from vendor-VFIO VFs (the H100 hosts
    of the demo, or the mixed-size L40S, whose VF is typed at start),
    where nova-gpu picks the smallest type that fits.
    """
    from nova_gpu.demo import scenario
    by_need = (
        scenario.Flavor('gpu.20g', {'gpu:memory': '20GB',
                                    'gpu:backend': 'vfio'},
                        vcpus=2, ram_mb=2048,
                        asks='1 vGPU with >= 20 GB (vendor-VFIO)'),
        scenario.Flavor('gpu.8g', {'gpu:memory': '8GB'},
                        asks='1 vGPU with >= 8 GB (mdev)'),
        scenario.Flavor('gpu.whole', {'gpu:kind': 'whole'},
                        vcpus=2, ram_mb=2048, asks='1 whole GPU'),
    )
    return tuple(scenario.FLAVORS) + by_need


def nova_conf(flavors):
    """nova.conf of the served cloud: the plugin's, quotas off."""
    from nova_gpu.tests.harness import cloud as cloud_mod
    conf = copy.deepcopy(cloud_mod.HARNESS_CONF)
    conf['quota'] = {'instances': -1, 'cores': -1, 'ram': -1}
    conf.setdefault('gpu_scheduler', {})['typical_requests'] = [
        ';'.join('%s=%s' % kv for kv in sorted(f.extra_specs.items()))
        for f in flavors]
    return conf


def select_hosts(names):
    """The scenario's hosts, or those named (``--host``, in their order)."""
    from nova_gpu.demo import scenario
    if not names:
        return tuple(scenario.HOSTS)
    by_name = {h.name: h for h in scenario.HOSTS}
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise ValueError('unknown demo host(s) %s; the demo has %s'
                         % (', '.join(unknown), ', '.join(by_name)))
    return tuple(by_name[n] for n in dict.fromkeys(names))


# -- the WSGI applications ---------------------------------------------------

def intercepted_app(url):
    """The WSGI application the harness's fixtures serve at ``url``.

    Nova's and Placement's fixtures install their applications with
    wsgi-intercept (in-process HTTP for ``requests``); this is the same
    application object, not a second copy: a second Placement application
    would configure its own database.
    """
    import wsgi_intercept
    parts = urllib.parse.urlsplit(url)
    app_fn, _script_name = wsgi_intercept._wsgi_intercept[
        (parts.hostname, parts.port or 80)]
    return app_fn()


def _json_reply(start_response, status, body):
    data = json.dumps(body).encode()
    start_response(status, [('Content-Type', 'application/json'),
                            ('Content-Length', str(len(data)))])
    return [data]


class TokenAuth:
    """Nova's API with the harness's auth stub, given identity by token.

    The harness stubs out keystonemiddleware and makes each request's
    context from ``X-Auth-User``, ``X-Auth-Project-Id`` and ``X-Roles``
    headers. Clients send a token instead; it names the caller as
    Placement's ``noauth2`` token does: ``admin`` (the admin of the demo
    project) or ``USER:PROJECT`` (a member of PROJECT). The version
    documents need no token, as with Keystone.
    """

    VERSION_PATHS = ('', '/', '/v2', '/v2/', '/v2.1', '/v2.1/')

    def __init__(self, app, project_id):
        self.app = app
        self.project_id = project_id

    def __call__(self, environ, start_response):
        for header in ('HTTP_X_AUTH_USER', 'HTTP_X_AUTH_PROJECT_ID',
                       'HTTP_X_ROLES'):
            environ.pop(header, None)  # only the token says who calls
        token = environ.get('HTTP_X_AUTH_TOKEN', '').strip()
        if not token:
            if environ.get('PATH_INFO', '') in self.VERSION_PATHS:
                return self.app(environ, start_response)
            return _json_reply(start_response, '401 Unauthorized', {
                'error': {'code': 401, 'message': 'an X-Auth-Token is '
                          'needed: "admin" or "USER:PROJECT"'}})
        user, _sep, project = token.partition(':')
        if user == ADMIN_TOKEN:
            roles = 'admin,member,reader'
        else:
            roles = 'member,reader'
        environ['HTTP_X_AUTH_USER'] = user
        environ['HTTP_X_AUTH_PROJECT_ID'] = project or self.project_id
        environ['HTTP_X_ROLES'] = roles
        return self.app(environ, start_response)


def _timestamp(value):
    if isinstance(value, datetime.datetime):
        return value.astimezone(datetime.timezone.utc).strftime(
            '%Y-%m-%dT%H:%M:%SZ')
    return value


def glance_image(image):
    """A harness fake-Glance image as Glance's v2 API shows it."""
    shown = {k: _timestamp(v) for k, v in image.items()
             if k not in ('properties', 'deleted', 'deleted_at',
                          'is_public')}
    # Glance v2 shows image properties as top-level fields.
    shown.update({k: v for k, v in (image.get('properties') or {}).items()
                  if k not in shown})
    shown.setdefault('owner', None)
    shown.setdefault('checksum', None)
    shown.setdefault('os_hidden', False)
    shown['self'] = '/v2/images/%s' % image['id']
    shown['file'] = '/v2/images/%s/file' % image['id']
    shown['schema'] = '/v2/schemas/image'
    return shown


class ImageApi:
    """A read-only Glance v2 image API over the harness's fake Glance.

    Nova reads images from the fake in process; a client needs them
    over HTTP to resolve ``--image NAME``. Routes (GET only): the version
    document, ``/v2/images`` (``?name=``, ``?id=`` filters) and
    ``/v2/images/<id>``.
    """

    def __init__(self, glance):
        self.glance = glance

    def __call__(self, environ, start_response):
        if environ.get('REQUEST_METHOD', 'GET') not in ('GET', 'HEAD'):
            return _json_reply(start_response, '405 Method Not Allowed',
                               {'error': 'read-only image API: GET only'})
        path = environ.get('PATH_INFO', '/').rstrip('/')
        query = urllib.parse.parse_qs(environ.get('QUERY_STRING', ''))
        if path in ('', '/versions', '/v2'):
            base = self._url(environ)
            return _json_reply(start_response, '200 OK', {'versions': [{
                'id': 'v2.16', 'status': 'CURRENT',
                'links': [{'rel': 'self', 'href': base + '/v2/'}]}]})
        images = sorted(self.glance.detail(None), key=lambda i: i['id'])
        if path == '/v2/images':
            for field in ('name', 'id', 'status', 'visibility'):
                if field in query:
                    wanted = set()
                    for value in query[field]:
                        # Glance's "in:" operator: any of a list
                        wanted.update(value[3:].split(',')
                                      if value.startswith('in:')
                                      else [value])
                    images = [i for i in images
                              if str(i.get(field)) in wanted]
            return _json_reply(start_response, '200 OK', {
                'images': [glance_image(i) for i in images],
                'first': '/v2/images', 'schema': '/v2/schemas/images'})
        if path.startswith('/v2/images/') and path.count('/') == 3:
            wanted = path.rsplit('/', 1)[1]
            for image in images:
                if image['id'] == wanted:
                    return _json_reply(start_response, '200 OK',
                                       glance_image(image))
            return _json_reply(start_response, '404 Not Found', {
                'error': 'no image with ID %s' % wanted})
        return _json_reply(start_response, '404 Not Found',
                           {'error': 'no such path: %s' % path})

    @staticmethod
    def _url(environ):
        host = environ.get('HTTP_HOST') or '%s:%s' % (
            environ['SERVER_NAME'], environ['SERVER_PORT'])
        return '%s://%s' % (environ.get('wsgi.url_scheme', 'http'), host)


class IdentityVersion:
    """The version document of an identity v3 API, and nothing else.

    There is no Keystone here; OpenStackClient still builds an identity
    client for some commands (``flavor set`` does, for ``--project``) and
    discovers its version first. Anything past discovery (projects, users)
    answers 404: the token names the project instead.
    """

    def __call__(self, environ, start_response):
        path = environ.get('PATH_INFO', '/').rstrip('/')
        if path not in ('', '/v3'):
            return _json_reply(start_response, '404 Not Found', {
                'error': {'code': 404, 'message': 'no identity service in '
                          'the nova-gpu demo: the token names the user '
                          'and project ("admin" or "USER:PROJECT")'}})
        base = ImageApi._url(environ)
        return _json_reply(start_response, '200 OK', {'version': {
            'id': 'v3.14', 'status': 'stable',
            'updated': '2020-04-07T00:00:00Z',
            'links': [{'rel': 'self', 'href': base + '/v3/'}],
            'media-types': [{'base': 'application/json',
                             'type': 'application/'
                                     'vnd.openstack.identity-v3+json'}]}})


# -- the exporter, fed by the stand-in agent ---------------------------------

class ExporterFeed:
    """nova-gpu-exporter's state and API, fed in process.

    Each report the demo's stand-in agent builds, and each notification
    the scheduler's GpuFilter sends (refusals by reason, placements), goes
    to the exporter's own notification endpoint, as they reach its
    listener pool on the bus alongside the schedulers'.
    """

    def __init__(self):
        import prometheus_client

        import nova_gpu.conf
        from nova_gpu.exporter import api
        from nova_gpu.exporter import cloud as exporter_cloud
        from nova_gpu.exporter import collector
        from nova_gpu.exporter import listener
        from nova_gpu.scheduler import gpu_spec as flavor_mod
        opts = nova_gpu.conf.CONF.gpu_exporter
        self.state = exporter_cloud.CloudState(
            flavor_mod.default_catalog(),
            reset_after=opts.generation_reset_after)
        registry = prometheus_client.CollectorRegistry()
        registry.register(collector.CloudCollector(
            self.state, stale_after=opts.stale_after))
        self.app = api.Api(self.state, registry, opts.stale_after)
        self.endpoint = listener.Endpoint(self.state)

    def publish(self, report):
        from nova_gpu.core import report as report_mod
        self.endpoint.info({}, '%s.%s' % (report_mod.PUBLISHER,
                                          report.get('host')),
                           report_mod.EVENT_TYPE, copy.deepcopy(report), {})

    def listen_to_scheduler(self):
        """Deliver the scheduler's notifications to the exporter
        (``stop_listening`` undoes it).

        The harness has no message bus for them: Nova's fake transport
        does not reach the exporter's endpoint. The scheduler's notifier
        (``nova_gpu.scheduler.notifier``) hands them over here, in
        their wire form.
        """
        from nova_gpu.scheduler import notifier as notifications
        notifications.set_notifier(_EndpointNotifier(self.endpoint))

    @staticmethod
    def stop_listening():
        from nova_gpu.scheduler import notifier as notifications
        notifications.set_notifier(None)

    def tee(self, case):
        """Send every report ``case`` builds to the exporter too."""
        build = case.gpu_report

        def gpu_report(hostname):
            report = build(hostname)
            self.publish(report)
            return report
        case.gpu_report = gpu_report


class _EndpointNotifier:
    """An oslo.messaging Notifier's ``info`` that delivers to a
    notification endpoint in process (as JSON, as the bus would).
    """

    PUBLISHER = 'nova-gpu-scheduler:demo'

    def __init__(self, endpoint):
        self.endpoint = endpoint

    def info(self, ctxt, event_type, payload):
        self.endpoint.info(ctxt, self.PUBLISHER, event_type,
                           json.loads(json.dumps(payload)), {})


class Agent(threading.Thread):
    """Publishes every host's report every ``interval`` seconds.

    The harness's ``sync_gpu_reports`` builds each report from what the
    fake host shows, as nova-gpu-agent does, and hands it to the
    schedulers; a failed round (a host changing under it) is logged and
    the next one tries again.
    """

    def __init__(self, case, interval, log):
        super().__init__(name='nova-gpu-demo-agent', daemon=True)
        self.case = case
        self.interval = interval
        self.log = log
        self.stopped = threading.Event()

    def run(self):
        while not self.stopped.wait(self.interval):
            try:
                self.case.sync_gpu_reports()
            except Exception as e:
                self.log('GPU reports not published this round: %s' % e)

    def stop(self):
        self.stopped.set()
        self.join(5)


# -- HTTP servers -------------------------------------------------------------

def http_server(app, address):
    """A running HTTP server of ``app`` on any free port of ``address``
    (``.port``, ``.stop()``).

    ``nova_gpu.wsgi_server``: Nova's harness runs under eventlet
    (``nova.monkey_patch``), where it serves with eventlet's WSGI server
    (what Nova served its API with under eventlet); a standard library
    server thread would block every green thread there.
    """
    from nova_gpu import wsgi_server
    return wsgi_server.WsgiServer(app, address, 0, name='nova-gpu-demo-http')


# -- the served cloud --------------------------------------------------------

class ServedCloud:
    """The running cloud, its HTTP servers and the stand-in agent."""

    def __init__(self, case, address=ADDRESS, report_interval=REPORT_INTERVAL,
                 log=print):
        self.case = case
        self.address = address
        self.exporter = ExporterFeed()
        self.exporter.tee(case)
        self.exporter.listen_to_scheduler()
        self.image_id = _demo_image(case)
        apps = {
            'compute': TokenAuth(case.api_fixture.app(), case.api.project_id),
            'placement': intercepted_app(case.placement_fixture.endpoint),
            'image': ImageApi(case.glance),
            'identity': IdentityVersion(),
            'gpu-exporter': self.exporter.app,
        }
        self.servers = {}
        try:
            for name, app in apps.items():
                self.servers[name] = http_server(app, address)
        except Exception:
            self.stop()
            raise
        case.sync_gpu_reports()
        self.agent = Agent(case, report_interval, log)
        self.agent.start()

    def url(self, service):
        host = ('[%s]' % self.address if ':' in self.address
                else self.address)
        return 'http://%s:%d' % (host, self.servers[service].port)

    @property
    def endpoints(self):
        return {'compute': self.url('compute') + '/v2.1',
                'placement': self.url('placement'),
                'image': self.url('image'),
                'identity': self.url('identity') + '/v3',
                'gpu-exporter': self.url('gpu-exporter')}

    def clouds_yaml(self, name=CLOUD):
        """A clouds.yaml for this cloud (as a dict)."""
        ep = self.endpoints
        return {'clouds': {name: {
            # A fixed token and no catalog: keystoneauth's admin_token
            # plugin; each service's endpoint is given explicitly.
            'auth_type': 'admin_token',
            'auth': {'endpoint': ep['compute'], 'token': ADMIN_TOKEN},
            'compute_endpoint_override': ep['compute'],
            'placement_endpoint_override': ep['placement'],
            'image_endpoint_override': ep['image'],
            'compute_api_version': COMPUTE_API_VERSION,
            'image_api_version': '2',
            'identity_endpoint_override': ep['identity'],
            'identity_api_version': '3',
            # read by ``openstack gpu`` (nova_gpu.osc.plugin)
            'gpu_exporter_url': ep['gpu-exporter'],
        }}}

    def stop(self):
        agent = getattr(self, 'agent', None)
        if agent is not None:
            agent.stop()
        for server in self.servers.values():
            server.stop()
        self.servers = {}
        self.exporter.stop_listening()


def _demo_image(case):
    """Add the demo's image to the fake Glance (a copy of its first)."""
    from nova.tests.fixtures import glance as glance_fixture
    image = copy.deepcopy(glance_fixture.GlanceFixture.image1)
    image.update(id=IMAGE_ID, name=IMAGE_NAME)
    case.glance.create(None, image)
    return IMAGE_ID


def create_flavors(case, flavors):
    """Create ``flavors`` with their Placement keys; {name: flavor id}."""
    ids = {}
    for f in flavors:
        ids[f.name] = case.create_gpu_flavor(
            f.extra_specs, memory_mb=f.ram_mb, vcpu=f.vcpus, name=f.name,
            disk=1, ephemeral=0)
    return ids


def write_clouds_yaml(path, content):
    """Write ``content`` to ``path`` at once (readers never see half).

    0o600: it holds the cloud's admin token.
    """
    import yaml
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    atomic_file.write(path, yaml.safe_dump(content, default_flow_style=False),
                      mode=0o600)


def start(hosts, report_interval=REPORT_INTERVAL, log=print):
    """Start the cloud, serve it and create the flavors.

    Returns the ServedCloud; ``stop()`` it, then ``.case.doCleanups()``.
    """
    from nova_gpu.demo import aio
    from nova_gpu.tests.harness import cloud as cloud_mod
    flavors = _flavors()
    # The mixed-size host's VFs are typed at a guest's start, as the
    # qemu hook types them (``vf_typing``).
    case = cloud_mod.start_cloud(hosts, nova_conf=nova_conf(flavors),
                                 mixins=aio.cloud_mixins())
    try:
        aio.limit_candidates(case)
        create_flavors(case, flavors)
        return ServedCloud(case, report_interval=report_interval, log=log)
    except Exception:
        case.doCleanups()
        raise


def default_clouds_yaml():
    return os.path.join(tempfile.gettempdir(), CLOUD, 'clouds.yaml')


def usage(served, path, flavors):
    """What to type in another terminal."""
    openstack = os.path.join(os.path.dirname(sys.executable), 'openstack')
    lines = [
        'nova-gpu demo cloud on %s:' % served.address,
    ]
    lines += ['  %-13s %s' % (k, v) for k, v in served.endpoints.items()]
    lines += [
        '',
        'In another terminal:',
        '  export OS_CLIENT_CONFIG_FILE=%s OS_CLOUD=%s' % (path, CLOUD),
        '  %s flavor list' % openstack,
        '  %s server create --flavor gpu.20g --image %s --no-network '
        '--wait vm1' % (openstack, IMAGE_NAME),
        '  %s gpu capacity' % openstack,
        '  %s gpu server show vm1' % openstack,
        '  %s flavor set --property gpu:memory=lots gpu.20g   (refused)'
        % openstack,
        '',
        'Flavors:',
    ]
    lines += ['  %-12s %s' % (f.name, f.asks) for f in flavors]
    lines += [
        '',
        'Ctrl-C stops the cloud.',
    ]
    return '\n'.join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog='nova-gpu-demo-serve',
        description=__doc__.split('\n\n')[0])
    parser.add_argument('--clouds-yaml', metavar='PATH',
                        default=default_clouds_yaml(),
                        help='where to write the clouds.yaml (default '
                             '%(default)s); removed on exit')
    parser.add_argument('--host', action='append', metavar='NAME',
                        help='start only this demo host (repeatable; '
                             'default: all of them)')
    parser.add_argument('--report-interval', type=float,
                        default=REPORT_INTERVAL, metavar='SECONDS',
                        help='how often the stand-in agent publishes the '
                             'GPU reports (default %(default)s)')
    args = parser.parse_args(argv)
    try:
        hosts = select_hosts(args.host)
    except ValueError as e:
        parser.error(str(e))
    if args.report_interval <= 0:
        parser.error('--report-interval must be positive')
    # Eventlet and Nova announce their deprecations on import; they are
    # not the demo's business.
    warnings.simplefilter('ignore', DeprecationWarning)
    rc = 1
    try:
        rc = _serve(args, hosts)
    except Exception:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        # Nova's services leave non-daemon threads behind; do not wait for
        # them once the cloud is cleaned up.
        os._exit(rc)


def _serve(args, hosts):
    def out(text=''):
        # The real stdout: Nova's fixtures capture sys.stdout while a
        # cloud runs when OS_STDOUT_CAPTURE is set (tox sets it).
        print(text, file=sys.__stdout__, flush=True)

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    out('Starting the nova-gpu demo cloud (%s) ...'
        % ', '.join(h.name for h in hosts))
    served = start(hosts, report_interval=args.report_interval, log=out)
    path = os.path.abspath(args.clouds_yaml)
    try:
        write_clouds_yaml(path, served.clouds_yaml())
        out(usage(served, path, _flavors()))
        while not stop.wait(1):
            pass
        out('Stopping ...')
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass
        served.stop()
        # Nova logs every thread pool it stops at INFO; not worth showing.
        logging.disable(logging.INFO)
        served.case.doCleanups()
    return 0


if __name__ == '__main__':
    main()
