"""``nova-gpu-defrag``: see :func:`nova_gpu.defrag.service.main`."""

import sys

from nova_gpu.defrag import service


def main(argv=None):
    return service.main(argv)


if __name__ == '__main__':
    sys.exit(main())
