"""Reusable test and demo harnesses (need nova's functional test tree).

Importing this package patches the process for eventlet, as importing
``nova.tests.functional`` does, but first: see :mod:`nova_gpu.testing.green`.
"""

from nova_gpu.testing import green

green.patch()
