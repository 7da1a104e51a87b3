"""``nova-gpu-defrag``: see :func:`nova_gpu.defrag.service.main`."""

from nova_gpu.defrag import service


def main(argv=None):
    return service.main(argv)
