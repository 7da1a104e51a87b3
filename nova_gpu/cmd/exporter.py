"""``nova-gpu-exporter``: see :func:`nova_gpu.exporter.service.main`."""

from nova_gpu.exporter import service


def main(argv=None):
    return service.main(argv)
