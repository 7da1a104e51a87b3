"""Options of the nova-gpu scheduler side."""

opts = []


def register_opts(conf):
    pass


def list_opts():
    return []
