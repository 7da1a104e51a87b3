"""``nova-gpu-demo``: see :func:`nova_gpu.demo.aio.main`.

The demo runs Nova in process: its harness chooses the concurrency mode
as Nova does (``nova_gpu.tests.harness.green``), so this entry point does
not import ``native_threading``.
"""

import sys

from nova_gpu.demo import aio


def main(argv=None):
    return aio.main(argv)


if __name__ == '__main__':
    sys.exit(main())
