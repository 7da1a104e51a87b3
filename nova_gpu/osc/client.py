"""A client of nova-gpu-exporter's read-only JSON API (``/v1``)."""

import requests

from osc_lib import exceptions


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
            raise exceptions.CommandError(
                'cannot reach nova-gpu-exporter at %s: %s (set '
                '--os-gpu-exporter-url or OS_GPU_EXPORTER_URL)'
                % (self.url, e)) from e
        try:
            body = r.json()
        except ValueError:
            body = {}
        if r.status_code == 404:
            raise exceptions.NotFound(404, body.get('error') or url)
        if r.status_code != 200:
            raise exceptions.CommandError('%s: HTTP %d %s' % (
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
