import os
import tempfile

import testtools

from nova_gpu.core import exceptions
from nova_gpu.sim import trace

DATA = os.path.join(os.path.dirname(trace.__file__), 'data')
NODES = os.path.join(DATA, 'small_nodes.csv')
TASKS = os.path.join(DATA, 'small_tasks.csv')


class TraceLoadTest(testtools.TestCase):

    def write(self, text):
        fd, path = tempfile.mkstemp(suffix='.csv')
        self.addCleanup(os.unlink, path)
        with os.fdopen(fd, 'w') as f:
            f.write(text)
        return path

    def test_small_trace_loads(self):
        nodes = trace.load_nodes(NODES)
        tasks = trace.load_tasks(TASKS)
        self.assertEqual(16, len(nodes))
        self.assertEqual(78000, nodes.total_gpu_milli)
        self.assertEqual(116, len(tasks))
        self.assertIn(frozenset({'T4'}), tasks.spec)

    def test_nodes_without_gpus_are_dropped(self):
        path = self.write('sn,cpu_milli,memory_mib,gpu,model\n'
                          'a,1000,1024,0,\nb,2000,2048,2,T4\n')
        nodes = trace.load_nodes(path)
        self.assertEqual(['b'], nodes.names)

    def test_missing_column_is_named(self):
        path = self.write('sn,cpu_milli,gpu,model\na,1,1,T4\n')
        err = self.assertRaises(exceptions.InvalidRequest,
                                trace.load_nodes, path)
        self.assertIn('memory_mib', str(err))
        self.assertIn(path, str(err))

    def test_bad_number_names_line_and_column(self):
        path = self.write('name,cpu_milli,memory_mib,num_gpu,gpu_milli\n'
                          't,abc,1,1,500\n')
        err = self.assertRaises(exceptions.InvalidRequest,
                                trace.load_tasks, path)
        self.assertIn('line 2', str(err))
        self.assertIn('cpu_milli', str(err))

    def test_share_on_several_gpus_is_refused(self):
        path = self.write('name,cpu_milli,memory_mib,num_gpu,gpu_milli\n'
                          't,1,1,2,500\n')
        self.assertRaises(exceptions.InvalidRequest, trace.load_tasks, path)

    def test_missing_file_is_named(self):
        err = self.assertRaises(exceptions.InvalidRequest,
                                trace.load_tasks, '/nonexistent.csv')
        self.assertIn('/nonexistent.csv', str(err))


class WorkloadTest(testtools.TestCase):

    def setUp(self):
        super().setUp()
        self.tasks = trace.load_tasks(TASKS)

    def test_tune_up_keeps_every_task_and_stops_at_target(self):
        capacity = 50000
        work = trace.workload(self.tasks, capacity, 4.0, 1)
        total = int(work.gpu_request.sum())
        self.assertLessEqual(total, 4.0 * capacity)
        self.assertGreater(total, 4.0 * capacity - 8000)
        for name in self.tasks.names:
            self.assertIn(name, work.names)

    def test_tune_down_removes_tasks(self):
        work = trace.workload(self.tasks, 50000, 1.0, 1)
        self.assertLessEqual(int(work.gpu_request.sum()), 50000)
        self.assertLess(len(work), len(self.tasks))

    def test_seed_decides_the_order(self):
        a = trace.workload(self.tasks, 78000, 1.3, 42)
        b = trace.workload(self.tasks, 78000, 1.3, 42)
        c = trace.workload(self.tasks, 78000, 1.3, 43)
        self.assertEqual(a.names, b.names)
        self.assertNotEqual(a.names, c.names)

    def test_typical_tasks_cover_the_list_and_sum_to_one(self):
        typical = trace.typical_tasks(self.tasks)
        self.assertAlmostEqual(1.0, sum(t.weight for t in typical))
        weights = [t.weight for t in typical]
        self.assertEqual(sorted(weights, reverse=True), weights)
