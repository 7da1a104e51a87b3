"""Nova's concurrency mode for a process that runs Nova in process.

Nova 34 runs its services in native threading by default
(``nova.monkey_patch.patch(backend='threading')`` in ``nova/cmd/``;
``OS_NOVA_DISABLE_EVENTLET_PATCHING`` or ``[DEFAULT] concurrency_backend``
choose eventlet, which is deprecated). :func:`patch` decides the same way,
before any nova module is imported, so the harness runs in the mode the
services run in. What follows is for eventlet mode only.

Nova's functional tree patches the process when ``nova.tests.functional``
is imported. That is too late once any other nova module was imported
(``nova.tests.fixtures`` sorts first, for one; a benchmark may have run
Nova's scheduler before it starts a cloud): oslo.db and oslo.context were
imported with it, and their thread-locals are then real thread-locals,
which every green thread of the process shares (Nova bug 1773102 for
oslo.context). Two green threads using one ``RequestContext`` at once (the
builds of a multi-create, a compute node object's context, concurrent
DELETEs) then share one database transaction, and one of them fails with
oslo.db's "Can't upgrade a READER transaction to a WRITER
mid-transaction".

:func:`patch` patches the process as Nova's tests do and then gives those
two modules green locals where they were imported too early. The tests
call it before any nova import (``nova_gpu/tests/functional/__init__.py``), as
Nova
does; the repair is for processes that import Nova earlier.
"""

import functools
import os
import sys

ENV = 'OS_NOVA_DISABLE_EVENTLET_PATCHING'


@functools.cache
def _green_transaction_local():
    """oslo.db's ``_TransactionContextTLocal``, local to a green thread.

    Made on first use: in native threading mode eventlet must not even be
    imported (``nova.monkey_patch.poison_eventlet``).
    """
    from eventlet import corolocal

    class _GreenTransactionContextTLocal(corolocal.local):

        def __deepcopy__(self, memo):
            return self

        def __reduce__(self):
            return type(self), ()

    return _GreenTransactionContextTLocal


def patch():
    """Choose Nova's concurrency mode as Nova 34's services do.

    Native threading unless ``OS_NOVA_DISABLE_EVENTLET_PATCHING`` asks
    for eventlet; under eventlet, the repair below follows. The variable
    is set when it is unset: ``nova.tests.functional`` calls
    ``monkey_patch.patch()`` with eventlet as its default, and would
    otherwise try to patch a process already in threading mode.
    """
    os.environ.setdefault(ENV, 'true')
    from nova import monkey_patch
    monkey_patch.patch(backend='threading')
    if monkey_patch.is_patched():
        green_locals()


def is_green():
    """Whether this process runs Nova under eventlet."""
    from nova import monkey_patch
    return monkey_patch.is_patched()


def green_locals():
    """Give oslo.db and oslo.context green thread-locals if they lack them.

    Contexts that already hold a transaction local keep it; new ones (every
    request, every service's context) get a green one.
    """
    from eventlet import corolocal
    enginefacade = sys.modules.get('oslo_db.sqlalchemy.enginefacade')
    if enginefacade is not None and not issubclass(
            enginefacade._TransactionContextTLocal, corolocal.local):
        enginefacade._TransactionContextTLocal = _green_transaction_local()
    context = sys.modules.get('oslo_context.context')
    if context is not None and not isinstance(context._request_store,
                                              corolocal.local):
        context._request_store = corolocal.local()
