"""``nova-gpu-qemu-hook``: see :func:`nova_gpu.agent.qemu_hook.main`."""

# First: native threading, no eventlet (see nova_gpu.cmd).
from nova_gpu.cmd import native_threading  # noqa: F401,H306
import sys

from nova_gpu.agent import qemu_hook


def main(argv=None):
    return qemu_hook.main(argv)


if __name__ == '__main__':
    sys.exit(main())
