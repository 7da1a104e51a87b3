"""``nova-gpu-exporter``: see :func:`nova_gpu.exporter.service.main`."""

import sys

from nova_gpu.exporter import service


def main(argv=None):
    return service.main(argv)


if __name__ == '__main__':
    sys.exit(main())
