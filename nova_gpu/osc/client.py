"""The exporter's API client, with errors as osc-lib's exceptions."""

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
