"""Functional tests: real Nova, Placement, libvirtd, mdevctl, RabbitMQ.

A watchdog bounds every test, and the worker's exit after its last one.
A hang here (a green thread blocked in a call eventlet did not patch, a
thread that never ends) would otherwise hold CI until its global limit
and say nothing. When the watchdog fires it prints the stack of every
thread and every green thread to the worker's real stderr and ends the
worker, so stestr reports the test that hung, with the stacks that show
why.

The watchdog is an OS thread and sleeps with the original ``time.sleep``:
where the suite runs under eventlet (``OS_NOVA_DISABLE_EVENTLET_PATCHING``
false; Nova 34's default is native threading), monkey patching cannot
turn it into a green thread that a blocked hub would starve.
``faulthandler``'s C watchdog backs it up should the interpreter itself
be stuck.
"""

import faulthandler
import gc
import os
import sys
import traceback

import testtools

from nova_gpu.tests import harness  # noqa: F401 (chooses the mode first)
from nova_gpu.tests.harness import green

# Longer than any test's own timeout (OS_TEST_TIMEOUT, test_serve's 600 s)
# so that those fail first, with their own message, where they can.
WATCHDOG_S = int(os.environ.get('NOVA_GPU_TEST_WATCHDOG', '900'))

if green.is_green():
    from eventlet import patcher
    _real_time = patcher.original('time')
    _real_thread = patcher.original('_thread')
else:  # native threading: nothing is patched (and eventlet is poisoned)
    import _thread as _real_thread
    import time as _real_time
_deadline = [None, '']  # monotonic deadline, what it bounds


def _dump_and_exit():
    out = sys.__stderr__
    out.write('\n=== nova-gpu test watchdog: %s still running after %d s; '
              'stacks follow ===\n' % (_deadline[1], WATCHDOG_S))
    for ident, frame in sys._current_frames().items():
        out.write('\n--- thread %s ---\n' % ident)
        traceback.print_stack(frame, file=out)
    try:
        import greenlet
        for obj in gc.get_objects():
            if isinstance(obj, greenlet.greenlet) and obj.gr_frame:
                out.write('\n--- green thread %r ---\n' % obj)
                traceback.print_stack(obj.gr_frame, file=out)
    except Exception as e:  # the thread stacks above still help
        out.write('green thread stacks unavailable: %s\n' % e)
    out.flush()
    os._exit(1)


def _watch():
    while True:
        _real_time.sleep(2)
        deadline = _deadline[0]
        if deadline is not None and _real_time.monotonic() > deadline:
            _dump_and_exit()


def _arm(what):
    _deadline[:] = [_real_time.monotonic() + WATCHDOG_S, what]
    faulthandler.dump_traceback_later(WATCHDOG_S + 60, exit=True,
                                      file=sys.__stderr__)


_run = testtools.TestCase.run


def _run_under_watchdog(self, result=None):
    _arm(self.id())
    try:
        return _run(self, result)
    finally:
        # Armed again rather than cancelled: after a worker's last test it
        # bounds the worker's exit (threads still to join).
        _arm('the worker after %s' % self.id())


if WATCHDOG_S > 0 and not getattr(testtools.TestCase.run,
                                  '_nova_gpu_watchdog', False):
    _run_under_watchdog._nova_gpu_watchdog = True
    testtools.TestCase.run = _run_under_watchdog
    _real_thread.start_new_thread(_watch, ())
