"""GpuFilter's per-host fast paths give what the plain reading gives.

The filter reads Nova's NUMA cells through their public fields once per
compute-node update, maps every candidate's providers at once (the
compute node's CPUs and memory included, as Placement answers) and
reuses a host's last candidate order when Placement offers it the same
candidates again. Each is checked against the plain way on real Nova
objects.
"""

import copy
import datetime
import inspect
import json
import re
import types

from nova import objects
from nova.scheduler import host_manager
from oslo_utils.fixture import uuidsentinel as uuids

from nova_gpu.tests.functional.scheduler import test_filter_handlers
from nova_gpu.tests.functional.scheduler.test_filter_handlers import candidate
from nova_gpu.tests.unit.scheduler import base


def _topology(dedicated=True, pinned=(), cpu_usage=0, memory_usage=0):
    cells = []
    for cid in range(2):
        cpus = set(range(cid * 8, cid * 8 + 8))
        cells.append(objects.NUMACell(
            id=cid, socket=cid, cpuset=set() if dedicated else cpus,
            pcpuset=cpus if dedicated else set(), memory=65536,
            cpu_usage=cpu_usage, memory_usage=memory_usage + cid,
            pinned_cpus=set(p for p in pinned if p in cpus),
            siblings=[{c} for c in sorted(cpus)],
            mempages=[objects.NUMAPagesTopology(size_kb=4, total=1024,
                                                used=0)],
            network_metadata=objects.NetworkMetadata(physnets=set(),
                                                     tunneled=False)))
    # As HostState.update_from_compute_node makes it, from the DB's JSON.
    return objects.NUMATopology.obj_from_db_obj(
        objects.NUMATopology(cells=cells)._to_json())


def _with_root(nodename, *rps, root_resources=None):
    allocations = {nodename + '-root': {'resources': dict(
        root_resources or {'PCPU': 2, 'MEMORY_MB': 2048})}}
    allocations.update({rp: {'resources': {'VGPU': 1}} for rp in rps})
    return {'allocations': allocations,
            'mappings': {'': [nodename + '-root'], '_GPU': list(rps)}}


class CellsTest(base.TestCase):

    def setUp(self):
        super().setUp()
        objects.register_all()

    def _read(self, topo):
        from nova_gpu.scheduler import filters
        cells = tuple(map(filters._cell_usage, topo.cells))
        # The filter reads all of a host's cells at once: the same.
        state = host_manager.HostState('h1', 'h1', 'cell')
        state.numa_topology = topo
        spec = types.SimpleNamespace(alternatives=[types.SimpleNamespace(
            numa_affinity='prefer')])
        self.assertEqual((topo, cells, None),
                         filters._numa_usage(state, spec))
        return cells

    def test_dedicated_cells(self):
        cells = self._read(_topology(pinned={1, 2, 9}, memory_usage=100))
        self.assertEqual((0, 8000, 2000, 65536, 100), cells[0])
        self.assertEqual((1, 8000, 1000, 65536, 101), cells[1])

    def test_shared_cells(self):
        cells = self._read(_topology(dedicated=False, cpu_usage=3))
        self.assertEqual((0, 8000, 3000, 65536, 0), cells[0])

    def test_public_fields_only(self):
        # Nova offers the cells' fields as properties: the filter reads
        # no oslo.versionedobjects internals and edits no HostState dict.
        from nova_gpu.scheduler import filters
        source = inspect.getsource(filters)
        self.assertIsNone(re.search(r"[.'\"]_obj_", source))
        self.assertNotIn('__dict__', source)

    def test_filter_reads_each_hosts_own_topology(self):
        from nova_gpu.scheduler import filters
        state = host_manager.HostState('h1', 'h1', 'cell')
        state.numa_topology = _topology(pinned={0, 1})
        spec = types.SimpleNamespace(alternatives=[types.SimpleNamespace(
            numa_affinity='prefer')])
        self.assertEqual(((0, 8000, 2000, 65536, 0),
                          (1, 8000, 0, 65536, 1)),
                         filters.numa_cells(state, spec))
        # Nova replaces the object when the usage changes.
        state.numa_topology = _topology(pinned={0, 1, 2})
        self.assertEqual((0, 8000, 3000, 65536, 0),
                         filters.numa_cells(state, spec)[0])
        spec.alternatives[0].numa_affinity = 'none'
        self.assertIsNone(filters.numa_cells(state, spec))


class CellsOfOneUpdateTest(base.TestCase):
    """Nova deserialises every host's NUMA topology again before every
    request: the filter reads a host's cells once per compute-node update
    (``HostState.updated``), once that update is old enough for its stamp
    to name it (``filters.NUMA_SETTLE``).
    """

    NOW = datetime.datetime(2026, 12, 1, 12, 0, 0,
                            tzinfo=datetime.timezone.utc)

    def setUp(self):
        super().setUp()
        objects.register_all()
        from nova_gpu.scheduler import filters
        self.filters = filters
        self.spec = types.SimpleNamespace(alternatives=[
            types.SimpleNamespace(numa_affinity='prefer')])
        self.state = host_manager.HostState('h1', 'h1', 'cell')
        self.settled = filters.numa_settled(self.NOW)

    def _read(self, topo, updated, previous=None, settled=None):
        self.state.numa_topology = topo
        self.state.updated = updated
        return self.filters._numa_usage(
            self.state, self.spec, previous,
            self.settled if settled is None else settled)

    def _decision(self, numa):
        return types.SimpleNamespace(numa=numa)

    def test_a_settled_update_is_read_once(self):
        minute_ago = self.NOW - datetime.timedelta(minutes=1)
        first = self._read(_topology(pinned={1}), minute_ago)
        self.assertEqual(minute_ago, first[2])
        # Named by its update, the usage keeps no object alive.
        self.assertIsNone(first[0])
        # The next request: a new object of the same update. To show the
        # cells are not read again, this one holds other usage (a real
        # one of the same update holds the same).
        again = _topology(pinned={1, 2, 3})
        self.assertIs(first, self._read(again, minute_ago,
                                        self._decision(first)))

    def test_a_new_update_is_read(self):
        minute_ago = self.NOW - datetime.timedelta(minutes=1)
        first = self._read(_topology(pinned={1}), minute_ago)
        later = self.NOW - datetime.timedelta(seconds=30)
        second = self._read(_topology(pinned={1, 2, 3}), later,
                            self._decision(first))
        self.assertEqual(3000, second[1][0][2])
        self.assertEqual(later, second[2])

    def test_a_recent_update_is_read_every_time(self):
        # Its stamp may be shared by a later update in the same second.
        recent = self.NOW - self.filters.NUMA_SETTLE / 2
        first = self._read(_topology(pinned={1}), recent)
        self.assertIsNone(first[2])
        second = self._read(_topology(pinned={1, 2}), recent,
                            self._decision(first))
        self.assertEqual(2000, second[1][0][2])

    def test_stamps_that_cannot_be_compared_are_not_kept(self):
        naive = datetime.datetime(2026, 12, 1, 11, 0, 0)
        for updated, settled in ((None, self.settled),
                                 (naive, self.settled),
                                 (self.NOW - datetime.timedelta(hours=1),
                                  False)):
            self.state.updated = updated
            self.assertIsNone(self.filters._stamp(
                self.state, None if settled is False else settled))
        first = self._read(_topology(pinned={1}), naive)
        second = self._read(_topology(pinned={1, 2}), naive,
                            self._decision(first))
        self.assertEqual(2000, second[1][0][2])

    def test_the_same_object_needs_no_stamp(self):
        # The scheduler's own claim: a new object, its own stamp, kept
        # as long as Nova keeps the object.
        topo = _topology(pinned={1})
        first = self._read(topo, self.NOW)
        self.assertIsNone(first[2])
        self.assertIs(topo, first[0])
        self.assertIs(first, self._read(topo, self.NOW,
                                        self._decision(first)))
        # Another object of an update too young to be named: read.
        second = self._read(_topology(pinned={1, 2}), self.NOW,
                            self._decision(first))
        self.assertEqual(2000, second[1][0][2])

    def test_a_host_without_numa_topology_now(self):
        minute_ago = self.NOW - datetime.timedelta(minutes=1)
        first = self._read(_topology(pinned={1}), minute_ago)
        self.assertEqual((None, None, None), self._read(
            None, minute_ago, self._decision(first)))


class CellsThroughTheFilterTest(test_filter_handlers.FilterCase):

    def test_one_read_per_compute_node_update(self):
        # Requests through Nova's handler; between them Nova gives the
        # HostState a new object of the same update, as
        # HostState._update_from_compute_node does, then of a new one.
        from nova_gpu.scheduler import filters
        self.add_host('h1', 'A100-40GB', vgpu_type='A100-10C', per_numa=2)
        state = self.host_state('h1', [candidate('h1-rp0')])
        minute_ago = (datetime.datetime.now(datetime.timezone.utc)
                      - datetime.timedelta(minutes=1))
        cells = []
        for pinned, updated in (({1}, minute_ago), ({1, 2}, minute_ago),
                                ({1, 2}, minute_ago
                                 + datetime.timedelta(seconds=1))):
            state.numa_topology = _topology(pinned=pinned)
            state.updated = updated
            state.allocation_candidates = [candidate('h1-rp0')]
            self.assertEqual([state], self.run_filter(
                [state], self.request(resources__VGPU='1',
                                      hw__cpu_policy='dedicated')))
            cells.append(getattr(state, filters.DECISION).numa[1])
        self.assertIs(cells[0], cells[1])
        self.assertEqual(((0, 8000, 2000, 65536, 0),
                          (1, 8000, 0, 65536, 1)), cells[2])


class CandidatesTest(test_filter_handlers.FilterCase):

    def first_gpu_providers(self, state):
        return [sorted(rp for rp in c['allocations']
                       if not rp.endswith('-root'))
                for c in state.allocation_candidates]

    def test_compute_node_in_every_candidate_is_not_a_gpu(self):
        self.add_host('h1', 'A100-40GB', vgpu_type='A100-10C', used={2: 1})
        state = self.host_state('h1', [_with_root('h1', 'h1-rp0'),
                                       _with_root('h1', 'h1-rp1'),
                                       _with_root('h1', 'h1-rp2')])
        passed = self.run_filter([state], self.request(resources__VGPU='1'))
        self.assertEqual([state], passed)
        # As without the root (FilterTest.test_candidates_reordered_...).
        self.assertEqual([['h1-rp2'], ['h1-rp0'], ['h1-rp1']],
                         self.first_gpu_providers(state))
        entry = self.view.get('h1')
        self.assertEqual(
            tuple(entry.gpus_of(c, 'VGPU')
                  for c in state.allocation_candidates),
            entry.gpu_sets(state.allocation_candidates, 'VGPU'))

    def test_unnamed_provider_allocating_a_gpu_class_is_unknown(self):
        self.add_host('h1', 'A100-40GB', vgpu_type='A100-10C')
        entry = self.view.get('h1')
        gpu_root = _with_root('h1', 'h1-rp1',
                              root_resources={'VGPU': 1, 'PCPU': 2})
        candidates = [_with_root('h1', 'h1-rp0'), gpu_root,
                      _with_root('h1', 'h1-rp0', 'h1-rp3')]
        self.assertEqual(((0,), None, (0, 3)),
                         entry.gpu_sets(candidates, 'VGPU'))
        # The same provider names, one more candidate shape: not mixed up
        # with the first (each candidate's own classes decide).
        self.assertEqual((None, (0,)), entry.gpu_sets(
            [gpu_root, _with_root('h1', 'h1-rp0')], 'VGPU'))
        self.assertEqual(((3,), (0,)), entry.gpu_sets(
            [_with_root('h1', 'h1-rp3'), _with_root('h1', 'h1-rp0')],
            'VGPU'))

    def test_mapped_at_once_as_one_by_one(self):
        # Random candidate lists: GPU providers the host names or not, a
        # compute node in all, some or none of them, allocating a GPU
        # class or not; each mapped as gpus_of maps it alone.
        import random
        rng = random.Random(5)
        self.add_host('h1', 'A100-40GB', vgpu_type='A100-10C')
        entry = self.view.get('h1')
        rps = ['h1-rp%d' % g for g in range(4)] + ['stranger']
        shapes = set()
        for _ in range(400):
            candidates = []
            root_in = rng.choice(('all', 'some', 'none'))
            gpu_root = rng.random() < 0.2
            width = rng.randint(1, 3)
            for _c in range(rng.randint(1, 6)):
                picked = rng.sample(rps, width)
                with_root = root_in == 'all' or (
                    root_in == 'some' and rng.random() < 0.5)
                resources = {'PCPU': 2}
                if gpu_root and rng.random() < 0.5:
                    resources['VGPU'] = 1
                c = (_with_root('h1', *picked, root_resources=resources)
                     if with_root else {'allocations': {
                         rp: {'resources': {'VGPU': 1}} for rp in picked}})
                candidates.append(c)
            entry.rp_sets = None
            got = entry.gpu_sets(candidates, 'VGPU')
            self.assertEqual(
                tuple(entry.gpus_of(c, 'VGPU') for c in candidates), got,
                candidates)
            shapes.add((root_in, None in got))
        # every shape met, unknown sets among them
        self.assertEqual(6, len(shapes), shapes)

    def test_same_candidates_again_keep_their_order(self):
        self.add_host('h1', 'A100-40GB', vgpu_type='A100-10C', used={2: 1})
        offered = [_with_root('h1', 'h1-rp0'), _with_root('h1', 'h1-rp1'),
                   _with_root('h1', 'h1-rp2')]
        orders = []
        for i in range(3):
            # Fresh objects each request, as Nova deep-copies Placement's
            # parsed answer.
            state = self.host_state('h1', json.loads(json.dumps(offered)))
            spec_obj = self.request(resources__VGPU='1')
            spec_obj.instance_uuid = getattr(uuids, 'i%d' % i)
            self.assertEqual([state], self.run_filter([state], spec_obj))
            orders.append(self.first_gpu_providers(state))
        self.assertEqual([[['h1-rp2'], ['h1-rp0'], ['h1-rp1']]] * 3, orders)

    def test_new_provider_uuids_forget_the_last_order(self):
        self.add_host('h1', 'A100-40GB', vgpu_type='A100-10C', used={2: 1})
        offered = [_with_root('h1', 'h1-rp0'), _with_root('h1', 'h1-rp2')]
        state = self.host_state('h1', copy.deepcopy(offered))
        self.run_filter([state], self.request(resources__VGPU='1'))
        self.assertEqual([['h1-rp2'], ['h1-rp0']],
                         self.first_gpu_providers(state))
        # Placement's provider UUIDs now name the GPUs the other way
        # round (a provider recreated, say): the order follows.
        self.view.set_provider_uuids('h1', {
            base.provider('h1', 0): 'h1-rp2', base.provider('h1', 2):
            'h1-rp0'})
        state = self.host_state('h1', copy.deepcopy(offered))
        spec_obj = self.request(resources__VGPU='1')
        spec_obj.instance_uuid = uuids.i2
        self.run_filter([state], spec_obj)
        self.assertEqual([['h1-rp0'], ['h1-rp2']],
                         self.first_gpu_providers(state))
