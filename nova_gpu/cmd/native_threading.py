"""Native threading for nova-gpu's own services, before anything else.

As Nova's ``nova/cmd`` modules choose the concurrency mode before anything
else is imported, importing this module puts the process in native
threading (Nova 34's default) and forbids eventlet: nova-gpu's own
services never import it. Each of their entry points imports it first.

* oslo.service's backend is set to threading
  (``oslo_service.backend.init_backend``, as ``nova.monkey_patch`` does):
  its default is eventlet, which ``oslo_messaging`` loads on import.
* eventlet's import is refused: oslo.privsep imports it only to learn
  whether it patched the process (printing eventlet's deprecation
  warning), and takes a failing import for "not patched".

A process that imported eventlet already (one running Nova under
eventlet) is left alone.
"""

import sys


class _NoEventlet:
    """A meta path finder that refuses eventlet's modules."""

    def find_spec(self, fullname, path, target=None):
        if fullname == 'eventlet' or fullname.startswith('eventlet.'):
            raise ImportError('nova-gpu services run in native threading: '
                              'eventlet is not imported')
        return None


def forbid_eventlet():
    """Native threading, and no eventlet import, unless already imported."""
    if 'eventlet' in sys.modules:
        return False
    if not any(isinstance(f, _NoEventlet) for f in sys.meta_path):
        sys.meta_path.insert(0, _NoEventlet())
    # After the finder: oslo.service's import tries eventlet too.
    from oslo_service import backend
    backend.init_backend(backend.BackendType.THREADING)
    return True


forbid_eventlet()
