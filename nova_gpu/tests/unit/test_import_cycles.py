"""No import circles among the modules of nova_gpu.

Every module is parsed as ``test_layering`` parses it (``ast``, nothing is
imported), and each of its imports of another nova_gpu module, at module
level or inside a function (a lazy import only hides a circle until the
function runs), is an edge of the import graph. A circle (a strongly
connected set of two modules or more) means neither module can be read,
tested or moved without the other; the test names each circle it finds.
"""

import os

import fixtures
import testtools

from nova_gpu.tests.unit import test_layering

# Circles entirely inside nova_gpu.scheduler, allowed while they are
# being removed (#26 item 1), each as the set of its modules, e.g.
# frozenset(('nova_gpu.scheduler.filters', 'nova_gpu.scheduler.listener',
# 'nova_gpu.scheduler.weighers')), now gone. One that is gone must be
# taken out of here.
KNOWN = ()


def graph(found_modules=None):
    """Module name -> the set of nova_gpu modules it imports."""
    found = dict(found_modules or test_layering.modules())
    edges = {}
    for name, path in found.items():
        targets = set()
        for target in test_layering.imports(name, path):
            # ``from nova_gpu.core.report import EVENT_TYPE`` imports the
            # module nova_gpu.core.report: drop names until one is known.
            while target and target not in found:
                target = target.rpartition('.')[0]
            if target and target != name:
                targets.add(target)
        edges[name] = targets
    return edges


def circles(edges):
    """Every strongly connected set of two modules or more (Tarjan's
    algorithm, iterative: no recursion limit on a deep graph).
    """
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    counter = 0
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                members = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    members.add(member)
                    if member == node:
                        break
                if len(members) > 1:
                    found.append(frozenset(members))
    return found


def path_of(members, edges):
    """One circle through ``members`` as ``a -> b -> ... -> a``."""
    start = min(members)
    # Breadth first from start back to start, inside the set.
    came = {start: None}
    queue = [start]
    end = None
    while queue and end is None:
        node = queue.pop(0)
        for child in sorted(edges[node] & members):
            if child == start:
                end = node
                break
            if child not in came:
                came[child] = node
                queue.append(child)
    steps = [start]
    while end is not None and end != start:
        steps.append(end)
        end = came[end]
    return ' -> '.join([start] + steps[:0:-1] + [start])


def problems(edges, known=KNOWN):
    """Every circle not in ``known``, and every ``known`` one that is
    gone, as sentences.
    """
    found = circles(edges)
    result = ['import circle: %s' % path_of(c, edges)
              for c in found if not any(c <= k for k in known)]
    result += ['known circle %s is gone: take it out of KNOWN'
               % ', '.join(sorted(k)) for k in known
               if not any(c <= k for c in found)]
    return sorted(result)


class ImportCyclesTest(testtools.TestCase):

    def test_no_import_circle(self):
        self.assertEqual([], problems(graph()))

    def test_known_circles_stay_inside_the_scheduler(self):
        for members in KNOWN:
            self.assertTrue(all(m.startswith('nova_gpu.scheduler.')
                                for m in members), members)

    def test_the_graph_is_the_package(self):
        edges = graph()
        self.assertLessEqual({'nova_gpu.core.report', 'nova_gpu.listening'},
                             edges['nova_gpu.exporter.listener'])

    def test_a_circle_is_found(self):
        # The checker can fail: a circle through a lazy import, named
        # along its path, and a known circle that is gone.
        tmp = self.useFixture(fixtures.TempDir()).path
        sources = {
            'nova_gpu.probe_a': 'from nova_gpu import probe_b\n',
            'nova_gpu.probe_b': ('def lazy():\n'
                                 '    from nova_gpu.probe_c import X\n'),
            'nova_gpu.probe_c': 'import nova_gpu.probe_a\nX = 1\n',
            'nova_gpu.probe_d': 'from nova_gpu import probe_a\n',
        }
        found = []
        for name, text in sources.items():
            path = os.path.join(tmp, name + '.py')
            with open(path, 'w') as f:
                f.write(text)
            found.append((name, path))
        gone = frozenset(('nova_gpu.probe_x', 'nova_gpu.probe_y'))
        self.assertEqual([
            'import circle: nova_gpu.probe_a -> nova_gpu.probe_b -> '
            'nova_gpu.probe_c -> nova_gpu.probe_a',
            'known circle nova_gpu.probe_x, nova_gpu.probe_y is gone: take '
            'it out of KNOWN'], problems(graph(found), known=(gone,)))
        self.assertEqual([], problems(graph(found), known=(
            frozenset(name for name, _ in found),)))
