"""Telling owners, written once: ``nova_gpu.owner_notice``."""

import ast
import os

import fixtures
import testtools

from nova_gpu import owner_notice
from nova_gpu import tests

PACKAGE = os.path.join(tests.REPO_ROOT, 'nova_gpu')
# Where a server's metadata may be written: the one module, and the
# compute clients it calls (cloud_api, and the reclaimer's wrapper of it).
ALLOWED = {'owner_notice.py', os.path.join('reclaim', 'compute.py'),
           'cloud_api.py'}
CALLS = ('set_metadata', 'delete_metadata', 'set_server_metadata',
         'delete_server_metadata')


def metadata_writers(root=PACKAGE):
    """(path, line) of every call writing server metadata outside ALLOWED."""
    found = []
    for folder, dirs, files in os.walk(root):
        rel = os.path.relpath(folder, root)
        if rel.split(os.sep)[0] == 'tests':
            continue
        for name in files:
            if not name.endswith('.py'):
                continue
            path = os.path.normpath(os.path.join(rel, name))
            if path in ALLOWED:
                continue
            with open(os.path.join(folder, name)) as f:
                tree = ast.parse(f.read())
            found += [(path, node.lineno) for node in ast.walk(tree)
                      if isinstance(node, ast.Call)
                      and isinstance(node.func, ast.Attribute)
                      and node.func.attr in CALLS]
    return found


class Compute:
    def __init__(self, fail=False):
        self.calls, self.fail = [], fail

    def set_metadata(self, server_id, metadata):
        self.calls.append(('set', server_id, metadata))
        if self.fail:
            raise RuntimeError('HTTP 503')

    def delete_metadata(self, server_id, keys):
        self.calls.append(('delete', server_id, keys))


class Sent:
    def __init__(self):
        self.sent = []

    def info(self, ctxt, event_type, payload):
        self.sent.append((event_type, payload))


class Payload:
    def to_primitive(self):
        return {'p': 1}


class OwnerNoticeTest(testtools.TestCase):

    def test_tell_sets_the_key_then_notifies(self):
        compute, sent = Compute(), Sent()
        notifier = owner_notice.Notifier(sent, {Payload: 'x.notice'})
        self.assertIsNone(owner_notice.tell(compute, notifier, 's1', 'k',
                                            'text', Payload()))
        self.assertEqual([('set', 's1', {'k': 'text'})], compute.calls)
        self.assertEqual([('x.notice', {'p': 1})], sent.sent)

    def test_a_key_not_set_still_notifies(self):
        compute, sent = Compute(fail=True), Sent()
        notifier = owner_notice.Notifier(sent, {Payload: 'x.notice'})
        error = owner_notice.tell(compute, notifier, 's1', 'k', 'text',
                                  Payload())
        self.assertIn('503', str(error))
        self.assertEqual(1, len(sent.sent))

    def test_clear_removes_one_key(self):
        compute = Compute()
        owner_notice.clear(compute, 's1', 'k')
        self.assertEqual([('delete', 's1', ['k'])], compute.calls)


class EveryWriterTest(testtools.TestCase):

    def test_no_other_module_writes_server_metadata(self):
        self.assertEqual([], metadata_writers())

    def test_the_scan_finds_a_writer(self):
        folder = self.useFixture(fixtures.TempDir()).path
        with open(os.path.join(folder, 'x.py'), 'w') as f:
            f.write('def f(nova):\n    nova.set_metadata("s", {})\n')
        self.assertEqual([('x.py', 2)], metadata_writers(folder))
