"""``nova-gpu``: see :func:`nova_gpu.agent.cli.main`."""

from nova_gpu.agent import cli


def main(argv=None):
    return cli.main(argv)
