"""nova-gpu's tests, shipped with the package as Nova ships nova.tests.

The fakes of hardware we lack (NVML, sysfs, a GPU host) and the harness
that starts Nova with the plugin (``harness``) live here, so that the
demo and the benchmarks import only installed modules.
"""

import os

# The source tree holding this package: tests that read the checkout's
# files (etc/, doc/, devstack/, tools/) find them under it.
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
