"""Reusable test and demo harnesses (need nova's functional test tree).

Importing this package puts the process in Nova 34's default concurrency
mode (native threading) or, where ``OS_NOVA_DISABLE_EVENTLET_PATCHING``
asks for it, patches it for eventlet, before any nova module is imported:
see :mod:`nova_gpu.tests.harness.green`.
"""

from nova_gpu.tests.harness import green

green.patch()
