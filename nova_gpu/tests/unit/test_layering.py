"""The layering rule of doc/source/architecture.rst, enforced on imports.

Every module of ``nova_gpu`` is parsed (``ast``, nothing is imported) and
each ``import`` / ``from ... import`` it holds, wherever it is (functions
included: a lazy import is still a dependency), is checked:

- the core (``nova_gpu.core``) imports nothing of nova_gpu outside itself
  and nothing of OpenStack;
- configuration (``nova_gpu.conf``) imports only the core;
- an adapter (agent, scheduler, sim, exporter, osc) imports the core,
  the configuration and itself, never another adapter;
- only the agent touches privsep (tools that run the agent in process,
  such as the agent reliability bench, may configure it);
- tools that put adapters together (bench, demo, tests) may import
  them, never the other way round;
- a module at the package root (``nova_gpu/wsgi_server.py``) belongs to
  no layer: any layer may import it, and it imports no adapter or tool.
"""

import ast
import os

import fixtures
import testtools

import nova_gpu

ROOT = os.path.dirname(nova_gpu.__file__)
CORE = 'core'
CONF = 'conf'
ADAPTERS = ('agent', 'scheduler', 'sim', 'exporter', 'osc', 'reclaim',
            'defrag')
# cmd: the entry points of the services (console_scripts).
TOOLS = ('bench', 'cmd', 'demo', 'tests')
# Top-level packages of OpenStack services and libraries.
OPENSTACK = ('nova', 'placement', 'oslo_config', 'oslo_log',
             'oslo_messaging', 'oslo_privsep', 'oslo_concurrency',
             'oslo_utils', 'oslo_serialization', 'oslo_service',
             'oslo_context', 'keystoneauth1', 'openstack', 'os_traits',
             'os_resource_classes', 'osc_lib', 'cliff', 'stevedore')
PRIVSEP = ('oslo_privsep', 'nova_gpu.agent.privsep')


def modules():
    """(dotted name, path) of every module of the nova_gpu package."""
    for dirpath, dirnames, filenames in os.walk(ROOT):
        dirnames[:] = [d for d in dirnames if not d.startswith(('.', '_'))]
        for filename in sorted(filenames):
            if not filename.endswith('.py'):
                continue
            path = os.path.join(dirpath, filename)
            rel = os.path.relpath(path, os.path.dirname(ROOT))[:-3]
            parts = rel.split(os.sep)
            if parts[-1] == '__init__':
                parts = parts[:-1]
            yield '.'.join(parts), path


def imports(name, path):
    """Every module name ``path`` imports (absolute, dotted)."""
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    package = name if path.endswith('__init__.py') else name.rpartition(
        '.')[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split('.')
                base = base[:len(base) - node.level + 1]
                module = '.'.join(base + ([node.module] if node.module
                                          else []))
            else:
                module = node.module
            # ``from nova_gpu.core import host`` imports nova_gpu.core.host.
            for alias in node.names:
                yield '%s.%s' % (module, alias.name)


def layer(dotted):
    """The nova_gpu top-level package of a module name, or None (outside
    nova_gpu, or a module at the package root such as
    ``nova_gpu.wsgi_server``: not a layer, any layer may import it).
    """
    parts = dotted.split('.')
    if parts[0] != 'nova_gpu' or len(parts) < 2:
        return None
    if not os.path.isdir(os.path.join(ROOT, parts[1])):
        return None
    return parts[1]


def problems(found_modules=None):
    """Every import breaking the rule, as sentences."""
    found = []
    for name, path in found_modules or modules():
        own = layer(name)
        for target in set(imports(name, path)):
            top = target.split('.')[0]
            other = layer(target)
            where = '%s imports %s' % (name, target)
            if any(target == p or target.startswith(p + '.')
                   for p in PRIVSEP) and own not in ('agent',) + TOOLS:
                found.append('%s: only the agent touches privsep' % where)
            if own == CORE:
                if top in OPENSTACK:
                    found.append('%s: the core imports no OpenStack' % where)
                elif other not in (None, CORE) or (
                        top == 'nova_gpu' and other is None):
                    found.append('%s: the core imports only itself' % where)
            elif own == CONF:
                if other not in (None, CORE, CONF):
                    found.append('%s: configuration imports only the core'
                                 % where)
            elif own in ADAPTERS:
                if other not in (None, CORE, CONF, own):
                    found.append('%s: adapters import the core, never '
                                 'each other' % where)
            elif own is None and other in ADAPTERS + TOOLS:
                found.append('%s: the package root imports no layer' % where)
    return sorted(found)


class LayeringTest(testtools.TestCase):

    def test_every_module_keeps_the_layering_rule(self):
        self.assertEqual([], problems())

    def test_every_layer_is_seen(self):
        # The walk finds the modules (so an empty result means something).
        layers = {layer(name) for name, _path in modules()}
        self.assertLessEqual({CORE, CONF, 'agent', 'scheduler', 'sim'},
                             layers)

    def test_a_violation_is_found(self):
        # The checker can fail: an adapter importing another one, and
        # privsep outside the agent.
        tmp = self.useFixture(fixtures.TempDir()).path
        path = os.path.join(tmp, 'probe.py')
        with open(path, 'w') as f:
            f.write('from nova_gpu.agent import privsep\n'
                    'def lazy():\n'
                    '    import nova_gpu.sim.state\n'
                    '    from . import hosts\n')
        found = problems([('nova_gpu.scheduler.probe', path)])
        self.assertEqual([
            'nova_gpu.scheduler.probe imports nova_gpu.agent.privsep: '
            'adapters import the core, never each other',
            'nova_gpu.scheduler.probe imports nova_gpu.agent.privsep: only '
            'the agent touches privsep',
            'nova_gpu.scheduler.probe imports nova_gpu.sim.state: adapters '
            'import the core, never each other'], found)
        core = os.path.join(tmp, 'core_probe.py')
        with open(core, 'w') as f:
            f.write('from oslo_config import cfg\n'
                    'from ..scheduler import view\n')
        self.assertEqual([
            'nova_gpu.core.probe imports nova_gpu.scheduler.view: the core '
            'imports only itself',
            'nova_gpu.core.probe imports oslo_config.cfg: the core imports '
            'no OpenStack'], problems([('nova_gpu.core.probe', core)]))

    def test_package_root_modules(self):
        # Any adapter may import a module at the package root; the core
        # may not, and such a module imports no adapter.
        tmp = self.useFixture(fixtures.TempDir()).path
        user = os.path.join(tmp, 'user.py')
        with open(user, 'w') as f:
            f.write('from nova_gpu import wsgi_server\n')
        self.assertEqual([], problems([('nova_gpu.exporter.probe', user)]))
        self.assertEqual([
            'nova_gpu.core.probe imports nova_gpu.wsgi_server: the core '
            'imports only itself'], problems([('nova_gpu.core.probe', user)]))
        root = os.path.join(tmp, 'root.py')
        with open(root, 'w') as f:
            f.write('from nova_gpu.exporter import api\n')
        self.assertEqual([
            'nova_gpu.probe imports nova_gpu.exporter.api: the package root '
            'imports no layer'], problems([('nova_gpu.probe', root)]))
