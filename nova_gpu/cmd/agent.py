"""``nova-gpu-agent``: see :func:`nova_gpu.agent.service.main`."""

import sys

from nova_gpu.agent import service


def main(argv=None):
    return service.main(argv)


if __name__ == '__main__':
    sys.exit(main())
