"""The harness's lock for Nova's CellDatabases fixture (native threading).

Nova's fixture lock prefers writers: a reader arriving while a writer
waits queues behind it. With its database write lock that makes a cycle
under concurrent boots (nova_gpu.tests.harness.cloud._ReaderPreferringLock).
"""

import threading

import testtools

from nova_gpu.tests.harness import cloud


class ReaderPreferringLockTest(testtools.TestCase):

    def test_reader_enters_while_a_writer_waits(self):
        lock = cloud._ReaderPreferringLock()
        first_in = threading.Event()
        writer_waits = threading.Event()
        second_in = threading.Event()
        release = threading.Event()

        def first_reader():
            with lock.read_lock():
                first_in.set()
                release.wait(10)

        def writer():
            writer_waits.set()
            with lock.write_lock():
                pass

        def second_reader():
            with lock.read_lock():
                second_in.set()

        threads = [threading.Thread(target=first_reader)]
        threads[0].start()
        self.assertTrue(first_in.wait(10))
        threads.append(threading.Thread(target=writer))
        threads[1].start()
        self.assertTrue(writer_waits.wait(10))
        threads.append(threading.Thread(target=second_reader))
        threads[2].start()
        # A writer-preferring lock keeps the second reader out until the
        # first reader leaves: the deadlock's first half.
        self.assertTrue(second_in.wait(5))
        release.set()
        for t in threads:
            t.join(10)
            self.assertFalse(t.is_alive())

    def test_writer_excludes_readers_and_may_read(self):
        lock = cloud._ReaderPreferringLock()
        entered = threading.Event()
        with lock.write_lock():
            with lock.read_lock():
                with lock.write_lock():
                    pass
            t = threading.Thread(target=lambda: (
                lock.read_lock().__enter__(), entered.set()))
            t.start()
            self.assertFalse(entered.wait(0.3))
        self.assertTrue(entered.wait(10))
        t.join(10)

    def test_reader_cannot_become_writer(self):
        lock = cloud._ReaderPreferringLock()
        with lock.read_lock():
            self.assertRaisesRegex(RuntimeError, 'escalation',
                                   lock.write_lock().__enter__)
