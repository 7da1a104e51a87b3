"""Every module of the installed package imports, from anywhere.

The installed package is the product (issue #26): the benchmarks, the
demo and the harness import only installed modules, never a source
tree's ``tests/`` through ``sys.path``. Each module is imported in a
fresh interpreter started outside the source tree, with the functional
environment (Nova, Placement, libvirt-python, numpy installed).
"""

import os
import pkgutil
import subprocess
import sys

import testtools

import nova_gpu

# The harness first: it puts the process in Nova's concurrency mode before
# any module imports eventlet's probes (oslo.privsep), as every test
# process and the demo do.
CODE = '''
import importlib, sys, traceback
import nova_gpu.tests.harness
failed = []
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except Exception:
        failed.append('%s: %s' % (name, traceback.format_exc(limit=1)))
for line in failed:
    print('NOT IMPORTED ' + line.replace('\\n', ' | '))
'''


def module_names():
    # ``__main__`` modules run when imported (``python -m``).
    return sorted(m.name for m in pkgutil.walk_packages(
        nova_gpu.__path__, 'nova_gpu.')
        if not m.name.endswith('.__main__'))


class PackageImportsTest(testtools.TestCase):

    def test_every_module_imports_outside_the_source_tree(self):
        names = module_names()
        self.assertGreater(len(names), 150)
        env = {k: v for k, v in os.environ.items() if k != 'PYTHONPATH'}
        proc = subprocess.run(
            [sys.executable, '-c', CODE] + names, capture_output=True,
            text=True, timeout=600, cwd='/', env=env)
        self.assertEqual(0, proc.returncode, proc.stderr[-2000:])
        self.assertEqual([], [line for line in proc.stdout.splitlines()
                              if line.startswith('NOT IMPORTED ')])
