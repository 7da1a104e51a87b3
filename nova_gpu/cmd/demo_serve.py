"""``nova-gpu-demo-serve``: see :func:`nova_gpu.demo.serve.main`.

As ``nova-gpu-demo``, Nova in process chooses the concurrency mode.
"""

import sys

from nova_gpu.demo import serve


def main(argv=None):
    return serve.main(argv)


if __name__ == '__main__':
    sys.exit(main())
