"""``nova-gpu-restore``: see :func:`nova_gpu.agent.restore.main`."""

from nova_gpu.agent import restore


def main(argv=None):
    return restore.main(argv)
