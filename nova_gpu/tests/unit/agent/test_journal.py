"""The agent's intent journal: durable, atomic, tolerant of corruption."""

import json
import os
import subprocess
import sys

import fixtures
import testtools

from nova_gpu.agent import journal


class TestJournal(testtools.TestCase):

    def setUp(self):
        super().setUp()
        self.dir = self.useFixture(fixtures.TempDir()).path
        self.path = os.path.join(self.dir, 'state', 'journal.json')
        self.log = self.useFixture(fixtures.FakeLogger(
            format='%(levelname)s %(message)s'))

    def test_intent_survives_a_new_instance_until_done(self):
        j = journal.Journal(self.path)
        key = j.begin('mdev_create', uuid='u1', parent='p', type_id='t')
        j.update(key, step=2)
        again = journal.Journal(self.path)  # what a restarted agent reads
        self.assertEqual({'uuid': 'u1', 'parent': 'p', 'type_id': 't',
                          'step': 2}, again.intents()[key]['args'])
        j.done(key)
        self.assertEqual({}, journal.Journal(self.path).intents())

    def test_written_atomically(self):
        j = journal.Journal(self.path)
        j.begin('vf_create', vf='0000:86:00.4', type_id=1061)
        # only the journal (and its lock) remain: no temporary file
        self.assertEqual(['journal.json', 'journal.json.lock'],
                         sorted(os.listdir(os.path.dirname(self.path))))
        with open(self.path) as f:
            self.assertEqual(1, json.load(f)['version'])

    def test_intents_of_a_dead_process_are_abandoned(self):
        j = journal.Journal(self.path)
        mine = j.begin('vf_create', vf='a', type_id=1)
        # a process that records an intent and is killed before it is done
        subprocess.run([sys.executable, '-c',
                        'import os, signal; from nova_gpu.agent import '
                        'journal; journal.Journal(%r).begin("mdev_create",'
                        ' uuid="dead"); os.kill(os.getpid(), '
                        'signal.SIGKILL)' % self.path])
        abandoned = j.abandoned()
        self.assertEqual(['dead'], [i['args']['uuid'] for _, i in abandoned])
        self.assertEqual([{'vf': 'a', 'type_id': 1}],
                         [i['args'] for i in j.in_flight()])
        self.assertIn(mine, j.intents())

    def test_released_intent_goes_to_reconcile(self):
        j = journal.Journal(self.path)
        key = j.begin('mdev_create', uuid='u')
        self.assertEqual([], j.abandoned())
        j.release(key)  # failed and could not undo itself
        self.assertEqual([key], [k for k, _ in j.abandoned()])

    def test_reused_pid_is_not_the_owner(self):
        self.assertFalse(journal.owner_alive(
            {'pid': os.getpid(), 'start': -1}))
        self.assertTrue(journal.owner_alive(journal.this_process()))
        self.assertFalse(journal.owner_alive(None))

    def test_corrupt_journal_moved_aside_with_warning(self):
        os.makedirs(os.path.dirname(self.path))
        for bad, why in (('{"version": 1, "intents": {', 'cannot be read'),
                         ('[]', 'top level is list'),
                         ('{"version": 7, "intents": {}, "first_seen": {}}',
                          'unsupported version 7'),
                         ('{"version": 1, "intents": {"k": {"op": "rm -rf"'
                          ', "args": {}}}, "first_seen": {}}',
                          'intent k is malformed'),
                         ('{"version": 1, "intents": {}, "first_seen": '
                          '{"mdev:x": "soon"}}', 'first_seen'),
                         (b'\xff\xfe', 'cannot be read')):
            with open(self.path, 'wb') as f:
                f.write(bad if isinstance(bad, bytes) else bad.encode())
            j = journal.Journal(self.path)
            self.assertEqual({}, j.intents())
            self.assertIn(why, self.log.output)
            self.assertIn('WARNING intent journal %s cannot be read'
                          % self.path, self.log.output)
            self.assertIn('moved to %s.corrupt-' % self.path,
                          self.log.output)
            # usable again
            j.begin('vf_remove', vf='x')
            self.assertEqual(1, len(journal.Journal(self.path).intents()))
            os.unlink(self.path)

    def test_first_seen_persists_and_forgets(self):
        j = journal.Journal(self.path, clock=lambda: 100.0)
        self.assertEqual({'a': 100.0, 'b': 100.0},
                         j.first_seen('mdev', ['a', 'b']))
        j.first_seen('vf', ['0000:86:00.4'], now=150.0)
        later = journal.Journal(self.path, clock=lambda: 500.0)
        # a kept its first time across the "restart", b is in use again
        self.assertEqual({'a': 100.0, 'c': 500.0},
                         later.first_seen('mdev', ['a', 'c']))
        self.assertEqual({'0000:86:00.4': 150.0},
                         later.first_seen('vf', ['0000:86:00.4']))

    def test_memory_only(self):
        j = journal.Journal()
        key = j.begin('mig_create', gpu='0000:07:00.0', start=0)
        self.assertEqual([], j.abandoned())
        j.done(key)
        self.assertEqual({}, j.intents())
        self.assertRaises(ValueError, j.begin, 'format_disk')
