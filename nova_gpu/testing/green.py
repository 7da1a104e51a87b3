"""Eventlet monkey patching for a process that runs Nova in process.

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
call it before any nova import (``tests/functional/__init__.py``), as Nova
does; the repair is for processes that import Nova earlier.
"""

import sys

from eventlet import corolocal


class _GreenTransactionContextTLocal(corolocal.local):
    """oslo.db's ``_TransactionContextTLocal``, local to a green thread."""

    def __deepcopy__(self, memo):
        return self

    def __reduce__(self):
        return type(self), ()


def patch():
    """Patch the process for eventlet, as Nova's functional tests do."""
    from nova import monkey_patch
    monkey_patch.patch()
    if monkey_patch.is_patched():
        green_locals()


def green_locals():
    """Give oslo.db and oslo.context green thread-locals if they lack them.

    Contexts that already hold a transaction local keep it; new ones (every
    request, every service's context) get a green one.
    """
    enginefacade = sys.modules.get('oslo_db.sqlalchemy.enginefacade')
    if enginefacade is not None and not issubclass(
            enginefacade._TransactionContextTLocal, corolocal.local):
        enginefacade._TransactionContextTLocal = (
            _GreenTransactionContextTLocal)
    context = sys.modules.get('oslo_context.context')
    if context is not None and not isinstance(context._request_store,
                                              corolocal.local):
        context._request_store = corolocal.local()
