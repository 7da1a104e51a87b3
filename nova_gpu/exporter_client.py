"""A client of nova-gpu-exporter's read-only JSON API (``/v1``).

The API is served by ``nova_gpu.exporter.api``; ``openstack gpu ...``
(``nova_gpu.osc``) and ``nova-gpu-defrag`` (``nova_gpu.defrag``) read it
through this one client. Errors name the URL and what went wrong.
"""

import requests


class ExporterError(Exception):
    """The exporter could not be reached or did not answer 200."""


class NotFound(ExporterError):
    """The exporter answered 404 (no such host or path)."""


class ExporterClient:
    def __init__(self, url, timeout=30, session=None):
        self.url = url.rstrip('/')
        self.timeout = timeout
        self.session = session or requests.Session()

    def _get(self, path):
        url = '%s/v1/%s' % (self.url, path)
        try:
            r = self.session.get(url, timeout=self.timeout)
        except requests.RequestException as e:
            raise ExporterError('cannot reach nova-gpu-exporter at %s: %s'
                                % (self.url, e)) from e
        try:
            body = r.json()
        except ValueError:
            body = {}
        if not isinstance(body, dict):
            body = {}
        if r.status_code == 404:
            raise NotFound(body.get('error') or url)
        if r.status_code != 200:
            raise ExporterError('%s: HTTP %d %s' % (
                url, r.status_code, body.get('error') or r.text[:200]))
        return body

    def hosts(self):
        return self._get('hosts')['hosts']

    def host(self, name):
        return self._get('hosts/%s' % requests.utils.quote(name, safe=''))

    def capacity(self):
        return self._get('capacity')['capacity']

    def providers(self):
        return self._get('providers')['providers']
