"""Under eventlet, the functional tests run in a process patched in time.

Eventlet mode only (``OS_NOVA_DISABLE_EVENTLET_PATCHING=false``, the
``functional`` environment's eventlet subset); Nova 34's default, native
threading, has no green threads and forbids importing eventlet.

Were oslo.db imported before eventlet patched the process, the green
threads of a test would share database transactions through a
``RequestContext`` (see ``nova_gpu.tests.harness.green``).
"""

import copy
import sys
import threading

import fixtures
from oslo_context import context as oslo_context
from oslo_db.sqlalchemy import enginefacade
import sqlalchemy
import testtools

from nova_gpu.tests.harness import green

if green.is_green():
    import eventlet
    from eventlet import corolocal
    from eventlet import event
    from eventlet import patcher


@enginefacade.transaction_context_provider
class _Context:
    """A context as nova.context.RequestContext is one, for oslo.db."""


def _reader_and_writer(facade):
    """A writer while another green thread reads, on one context."""
    context = _Context()
    reading, done = event.Event(), event.Event()

    def reader():
        with facade.reader.using(context):
            reading.send()
            done.wait()
    thread = eventlet.spawn(reader)
    with eventlet.Timeout(10):
        reading.wait()
    try:
        # With real thread-locals this green thread would be inside the
        # reader's transaction: "Can't upgrade a READER ...".
        with facade.writer.using(context) as session:
            session.execute(sqlalchemy.text('SELECT 1'))
    finally:
        done.send()
        thread.wait()


def _facade():
    facade = enginefacade.transaction_context()
    facade.configure(connection='sqlite://')
    return facade


@testtools.skipUnless(green.is_green(), 'eventlet mode only')
class GreenTransactionsTest(testtools.TestCase):

    def test_green_threads_of_one_context_have_their_own_transactions(self):
        self.assertTrue(issubclass(enginefacade._TransactionContextTLocal,
                                   corolocal.local))
        self.assertIsInstance(oslo_context._request_store, corolocal.local)
        _reader_and_writer(_facade())

    def test_locals_of_modules_imported_too_early_made_green(self):
        real_local = patcher.original('threading').local

        class TooEarly(real_local):
            pass
        self.useFixture(fixtures.MonkeyPatch(
            'oslo_db.sqlalchemy.enginefacade._TransactionContextTLocal',
            TooEarly))
        self.useFixture(fixtures.MonkeyPatch(
            'oslo_context.context._request_store', real_local()))
        # As it is when oslo.db was imported before the patching:
        self.assertRaisesRegex(TypeError, 'READER transaction to a WRITER',
                               _reader_and_writer, _facade())
        green.green_locals()
        _reader_and_writer(_facade())
        self.assertIsInstance(oslo_context._request_store, corolocal.local)
        local = enginefacade._TransactionContextTLocal()
        self.assertIs(local, copy.deepcopy(local))

    def test_nothing_to_do_without_those_modules(self):
        modules = {k: v for k, v in sys.modules.items()
                   if k not in ('oslo_db.sqlalchemy.enginefacade',
                                'oslo_context.context')}
        self.useFixture(fixtures.MonkeyPatch('sys.modules', modules))
        green.green_locals()
        self.assertNotIn('oslo_context.context', sys.modules)

    def test_the_twin_is_not_shared_between_threads(self):
        local = green._green_transaction_local()()
        local.value = 'main'
        seen = []
        thread = threading.Thread(
            target=lambda: seen.append(getattr(local, 'value', None)))
        thread.start()
        thread.join()
        self.assertEqual([None], seen)
