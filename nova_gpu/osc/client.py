"""The exporter's API client, with errors as osc-lib's exceptions."""

import urllib.parse

from osc_lib import exceptions

from nova_gpu import exporter_client


class ExporterClient(exporter_client.ExporterClient):
    def _get(self, path):
        try:
            return super()._get(path)
        except exporter_client.NotFound as e:
            raise exceptions.NotFound(404, str(e)) from e
        except exporter_client.ExporterError as e:
            hint = (' (set --os-gpu-exporter-url or OS_GPU_EXPORTER_URL)'
                    if str(e).startswith('cannot reach') else '')
            raise exceptions.CommandError(str(e) + hint) from e

    def usage(self, start, end=None, project=None, server=None):
        """Usage rows of ``/v1/usage`` (times ISO 8601)."""
        query = {k: v for k, v in (('start', start), ('end', end),
                                   ('project', project), ('server', server))
                 if v is not None}
        return self._get('usage?' + urllib.parse.urlencode(query))['usage']

    def idle(self):
        """Idle guest devices of ``/v1/idle`` (``core.idle``)."""
        return self._get('idle')['idle']
