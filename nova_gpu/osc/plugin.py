"""The OpenStackClient plugin hooks (``openstack.cli.extension``).

``openstack gpu ...`` reads the read-only JSON API of nova-gpu-exporter
(``nova_gpu.exporter.api``); see doc/source/observability.rst for why.
Where the exporter is: ``--os-gpu-exporter-url``, else the environment
variable ``OS_GPU_EXPORTER_URL``, else the ``gpu-exporter`` endpoint of
the service catalog, else http://127.0.0.1:9836.
"""

import os

from osc_lib import utils

from nova_gpu.osc import client as client_mod

API_NAME = 'gpu'
API_VERSION_OPTION = 'os_gpu_api_version'
DEFAULT_API_VERSION = '1'
API_VERSIONS = {'1': 'nova_gpu.osc.client.ExporterClient'}
SERVICE_TYPE = 'gpu-exporter'
DEFAULT_URL = 'http://127.0.0.1:9836'
ENV_URL = 'OS_GPU_EXPORTER_URL'


def exporter_url(instance):
    """The exporter's base URL for a ClientManager ``instance``."""
    options = getattr(instance, '_cli_options', None)
    config = getattr(options, 'config', None) or {}
    url = config.get('gpu_exporter_url') or os.environ.get(ENV_URL)
    if url:
        return url
    try:
        url = instance.get_endpoint_for_service_type(
            SERVICE_TYPE, interface=getattr(instance, 'interface', None))
    except Exception:  # no catalog (no auth asked for): the default
        url = None
    return url or DEFAULT_URL


def make_client(instance):
    """Called by OpenStackClient the first time ``gpu`` is used."""
    return client_mod.ExporterClient(exporter_url(instance))


def build_option_parser(parser):
    parser.add_argument(
        '--os-gpu-api-version', metavar='<gpu-api-version>',
        default=utils.env('OS_GPU_API_VERSION'),
        help='nova-gpu exporter API version, default=%s '
             '(Env: OS_GPU_API_VERSION)' % DEFAULT_API_VERSION)
    parser.add_argument(
        '--os-gpu-exporter-url', dest='gpu_exporter_url',
        metavar='<url>', default=utils.env(ENV_URL),
        help='URL of nova-gpu-exporter ([gpu_exporter] listen), default: '
             'the service catalog\'s %s endpoint, else %s (Env: %s)'
             % (SERVICE_TYPE, DEFAULT_URL, ENV_URL))
    return parser
