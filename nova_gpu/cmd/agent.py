"""``nova-gpu-agent``: see :func:`nova_gpu.agent.service.main`."""

from nova_gpu.agent import service


def main(argv=None):
    return service.main(argv)
