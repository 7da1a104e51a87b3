"""``nova-gpu-agent``: see :func:`nova_gpu.agent.service.main`."""

# First: native threading, no eventlet (see nova_gpu.cmd).
from nova_gpu.cmd import native_threading  # noqa: F401,H306
import sys

from nova_gpu.agent import service


def main(argv=None):
    return service.main(argv)


if __name__ == '__main__':
    sys.exit(main())
