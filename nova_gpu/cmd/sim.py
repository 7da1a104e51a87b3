"""``nova-gpu-sim``: see :func:`nova_gpu.sim.cli.main`."""

# First: native threading, no eventlet (see nova_gpu.cmd).
from nova_gpu.cmd import native_threading  # noqa: F401,H306
import sys

from nova_gpu.sim import cli


def main(argv=None):
    return cli.main(argv)


if __name__ == '__main__':
    sys.exit(main())
