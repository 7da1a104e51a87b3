"""``nova-gpu-reclaimer``: see :func:`nova_gpu.reclaim.service.main`."""

import sys

from nova_gpu.reclaim import service


def main(argv=None):
    return service.main(argv)


if __name__ == '__main__':
    sys.exit(main())
