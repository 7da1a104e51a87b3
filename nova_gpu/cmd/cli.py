"""``nova-gpu``: see :func:`nova_gpu.agent.cli.main`."""

import sys

from nova_gpu.agent import cli


def main(argv=None):
    return cli.main(argv)


if __name__ == '__main__':
    sys.exit(main())
