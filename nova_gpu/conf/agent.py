"""Options of the nova-gpu agent side."""

opts = []


def register_opts(conf):
    pass


def list_opts():
    return []
