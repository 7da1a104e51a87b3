"""``nova-gpu-reclaimer``: see :func:`nova_gpu.reclaim.service.main`."""

from nova_gpu.reclaim import service


def main(argv=None):
    return service.main(argv)
