"""The agent's idle devices: NVML samples into windows, the report field."""

import types

import pynvml
import testtools

from nova_gpu.agent import agent as agent_mod
from nova_gpu.agent import host_metrics as exporter
from nova_gpu.agent import nvml as nvml_mod
from nova_gpu.core import idle
from nova_gpu.tests.unit.agent import fakenvml
from nova_gpu.tests.unit.exporter import test_host_exporter as host_test

CATALOG = host_test.CATALOG
T0 = 1700000000.0


class QuietNvml(host_test.TelemetryNvml):
    """The host exporter's fake NVML with a vGPU using ``sm`` percent."""

    sm = 0
    vgpu_util_unsupported = False

    def nvmlDeviceGetVgpuUtilization(self, dev, timestamp):
        if self.vgpu_util_unsupported:
            raise pynvml.NVMLError_NotSupported()
        return [types.SimpleNamespace(
            vgpuInstance=v, smUtil=types.SimpleNamespace(uiVal=self.sm))
            for v in sorted(dev.vgpus)]


def _nvml(sm=0, unsupported=False):
    lib = host_test._lib()
    lib.__class__ = QuietNvml
    lib.sm, lib.vgpu_util_unsupported = sm, unsupported
    return nvml_mod.Nvml(lib=lib)


def _report():
    report = host_test._report()
    # the MIG-backed vGPU's guest, as libvirt names it
    report['gpus'][0]['devices'][0]['instance'] = host_test.VM_UUID
    return report


def _run(nvml, minutes=31, tracker=None):
    tracker = tracker or idle.Tracker(idle_after=1800)
    report = None
    for n in range(minutes):
        report = _report()
        idle.annotate(report, exporter.utilisation_samples(nvml), tracker,
                      CATALOG, T0 + 60 * n)
    return report


class SamplesTest(testtools.TestCase):

    def test_samples_of_gpus_and_vgpus(self):
        samples = exporter.utilisation_samples(_nvml(sm=40))
        self.assertEqual({'compute': 0.87, 'memory_mib': 20480.0},
                         samples['gpus']['0000:07:00.0'])
        self.assertEqual([{'mdev': host_test.MDEV, 'vm': host_test.VM_UUID,
                           'gi': 1, 'compute': 0.4, 'memory_mib': 5120.0}],
                         samples['vgpus']['0000:07:00.0'])

    def test_no_nvml_no_samples(self):
        self.assertIsNone(exporter.utilisation_samples(None))


class AnnotateTest(testtools.TestCase):

    def test_an_idle_vgpu_after_30_minutes(self):
        report = _run(_nvml(sm=0), minutes=30)
        self.assertNotIn('idle', report['gpus'][0]['devices'][0])
        report = _run(_nvml(sm=0), minutes=31)
        dev = report['gpus'][0]['devices'][0]
        self.assertEqual(T0, dev['idle']['since'])
        self.assertEqual(1800, dev['idle']['seconds'])
        self.assertEqual(0.0, dev['idle']['peak_compute'])
        self.assertEqual(5120.0, dev['idle']['peak_memory_mib'])
        # 5 GiB used, no compute: the smallest A100 device holding it
        self.assertEqual('A100-5C', dev['idle']['suggestion'])
        # the MIG instance without a vGPU: NVML says nothing of it
        self.assertNotIn('idle', report['gpus'][0]['devices'][1])
        # the A100 itself is 87% busy
        self.assertNotIn('idle', report['gpus'][0])

    def test_a_busy_vgpu_is_not_idle(self):
        report = _run(_nvml(sm=40))
        self.assertNotIn('idle', report['gpus'][0]['devices'][0])

    def test_unsupported_counters_are_never_idle(self):
        report = _run(_nvml(unsupported=True))
        self.assertNotIn('idle', report['gpus'][0]['devices'][0])
        tracker = idle.Tracker(idle_after=1800)
        for n in range(40):
            idle.annotate(_report(), None, tracker, CATALOG, T0 + 60 * n)
        self.assertEqual(idle.UNKNOWN, tracker.verdict(
            host_test.MDEV, T0 + 2400).state)


VM2 = '7c2f1e0d-8d54-4e54-8e3c-5d3b2c0a1b22'
MDEV2 = 'c0ffee00-0000-4000-8000-000000000002'
H100_ADDRESS = '0000:1b:00.0'
A100_ADDRESS = '0000:07:00.0'


class MigNvml(fakenvml.FakePynvml):
    """fakenvml's GPUs with their use, as NVML reads it on a KVM host.

    NVML's documentation: a GPU in MIG mode has no utilisation of its
    own (nvmlDeviceGetUtilizationRates: NOT_SUPPORTED); a vGPU's is read
    per vGPU instance; a GPU instance's through GPM (Hopper on).
    """

    vgpu_sm = {}        # vGPU instance -> SM percent
    vgpu_vm = {}        # vGPU instance -> VM UUID

    def nvmlDeviceGetUtilizationRates(self, dev):
        if dev.mig:
            raise pynvml.NVMLError_NotSupported()
        return types.SimpleNamespace(gpu=dev.util, memory=0)

    def nvmlDeviceGetMemoryInfo(self, dev):
        if hasattr(dev, 'gi_id'):
            return self.mig_memory_info(dev)
        return types.SimpleNamespace(total=dev.memory_mib * 2 ** 20,
                                     used=1024 * 2 ** 20)

    def nvmlDeviceGetVgpuUtilization(self, dev, timestamp):
        return [types.SimpleNamespace(
            vgpuInstance=v, smUtil=types.SimpleNamespace(
                uiVal=self.vgpu_sm.get(v, 0))) for v in sorted(dev.vgpus)]

    def nvmlVgpuInstanceGetVmID(self, vgpu):
        return (self.vgpu_vm[vgpu].encode(), pynvml.NVML_VGPU_VM_ID_UUID)

    def nvmlVgpuInstanceGetFbUsage(self, vgpu):
        return 2 * 2 ** 30


def _mig_host(gpu_name='NVIDIA H100 80GB HBM3', memory=81559):
    """One GPU in MIG mode: a 3g instance at slice 0 running a guest's
    MIG-backed vGPU, a 2g instance at slice 4 used by another guest with
    no vGPU NVML sees (only the instance's own figures), and a whole L4
    with a time-sliced vGPU, and a vendor-VFIO VF vGPU on a second L4.
    """
    big = fakenvml.FakeGpu('00000000:1B:00.0', gpu_name, memory, mig=True)
    l4 = fakenvml.FakeGpu('00000000:3B:00.0', 'NVIDIA L4', 23034)
    l4b = fakenvml.FakeGpu('00000000:5E:00.0', 'NVIDIA L4', 23034)
    l4.util = l4b.util = 10
    lib = MigNvml([big, l4, l4b])
    lib.vgpu_sm, lib.vgpu_vm = {}, {}
    g3 = lib.add_gi(big, pynvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE, 0)
    g2 = lib.add_gi(big, pynvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE, 4)
    big.gis[g3]['cis'] = big.gis[g2]['cis'] = 1
    big.gi_memory_used = {g3: 3000, g2: 500}
    v = lib.start_vgpu_on(big, g3)
    lib.vgpu_vm[v] = host_test.VM_UUID
    # a second vGPU of the same guest, time-sliced on the L4
    w = lib.start_vgpu_on(l4, None, MDEV2)
    lib.vgpu_vm[w] = host_test.VM_UUID
    # a VF vGPU (no mdev) of another guest on the second L4
    x = lib.start_vgpu_on(l4b, None)
    lib.vgpu_vm[x] = VM2
    lib.ids = {'g3': g3, 'g2': g2, 'v': v, 'w': w, 'x': x}
    return lib


def _mig_report(model='H100-80GB'):
    return {'host': 'gpu-1', 'gpus': [
        {'index': 0, 'address': H100_ADDRESS, 'model': model,
         'devices': [
             # the MIG-backed vGPU's instance, as the agent reports it
             {'kind': 'mig', 'detail': ['3g.40gb', 0, None],
              'instance': host_test.VM_UUID},
             {'kind': 'mig', 'detail': ['2g.20gb', 4, None],
              'instance': VM2}]},
        {'index': 1, 'address': '0000:3b:00.0', 'model': 'L4',
         'devices': [{'kind': 'vgpu', 'detail': 'L4-12C', 'uuid': MDEV2,
                      'instance': host_test.VM_UUID}]},
        {'index': 2, 'address': '0000:5e:00.0', 'model': 'L4',
         'devices': [{'kind': 'vgpu', 'detail': 'L4-12C',
                      'vf': '0000:5e:00.4', 'instance': VM2}]},
        # a GPU passed through: NVML on the host does not list it
        {'index': 3, 'address': '0000:9d:00.0', 'model': 'L4',
         'devices': [{'kind': 'whole', 'instance': VM2}]}]}


class EveryDeviceKindTest(testtools.TestCase):
    """Each device a guest can hold gets NVML's verdict where NVML reads
    it, UNKNOWN (never idle) where it cannot.
    """

    def run_passes(self, lib, minutes=31, model='H100-80GB'):
        nvml = nvml_mod.Nvml(lib=lib)
        tracker, gpm = idle.Tracker(idle_after=1800), {}
        report = None
        for n in range(minutes):
            report = _mig_report(model)
            idle.annotate(report, exporter.utilisation_samples(nvml, gpm),
                          tracker, CATALOG, T0 + 60 * n)
        return report, tracker, gpm

    def marks(self, report):
        return [[('idle' in d) for d in g['devices']]
                for g in report['gpus']]

    def test_gpu_instances_from_gpm(self):
        lib = _mig_host()
        big = lib.gpus[0]
        big.gi_util = {lib.ids['g3']: 60, lib.ids['g2']: 1}
        # GPM's first figure comes at the second pass
        report, tracker, gpm = self.run_passes(lib, minutes=32)
        # 3g busy (GPM 60%); the 2g used at 1% of itself: idle, its
        # frame buffer from its MIG device; the L4 vGPUs at 0%: idle;
        # the passed-through GPU: unknown
        self.assertEqual([[False, True], [True], [True], [False]],
                         self.marks(report))
        mark = report['gpus'][0]['devices'][1]['idle']
        self.assertEqual(500.0, mark['peak_memory_mib'])
        self.assertAlmostEqual(0.01 * 2 / 7, mark['peak_compute'])
        self.assertEqual(idle.UNKNOWN, tracker.verdict(
            '0000:9d:00.0/whole', T0 + 1800).state)
        # one GPM sample kept per instance, the older ones freed
        self.assertEqual(2, len(gpm))
        self.assertEqual(2, len(lib.gpm_samples))

    def test_a_busy_mig_backed_vgpu_by_its_instance(self):
        lib = _mig_host()
        lib.gpus[0].gi_util = {}   # GPM reads nothing of its own...
        lib.gpus[0].gpm = False    # ...as on an A100 (no GPM)
        lib.vgpu_sm = {lib.ids['v']: 50}
        report, _t, _g = self.run_passes(lib)
        # the 3g instance's vGPU (matched by its GPU instance, though its
        # guest has a vGPU on the L4 too) is busy; the 2g instance has
        # no vGPU and no GPM: unknown, never idle
        self.assertEqual([[False, False], [True], [True], [False]],
                         self.marks(report))

    def test_an_idle_mig_backed_vgpu_without_gpm(self):
        lib = _mig_host()
        lib.gpus[0].gpm = False
        report, tracker, _g = self.run_passes(lib)
        # the vGPU on the 3g instance at 0%: idle, with the instance's
        # frame buffer
        self.assertEqual([[True, False], [True], [True], [False]],
                         self.marks(report))
        self.assertEqual(3000.0, report['gpus'][0]['devices'][0][
            'idle']['peak_memory_mib'])
        self.assertEqual(idle.UNKNOWN, tracker.verdict(
            '%s/mig@4' % H100_ADDRESS, T0 + 1800).state)

    def test_samples_of_gpu_instances(self):
        lib = _mig_host()
        lib.gpus[0].gi_util = {lib.ids['g3']: 25}
        nvml, gpm = nvml_mod.Nvml(lib=lib), {}
        first = exporter.utilisation_samples(nvml, gpm)
        # GPM's activity needs two samples: none at the first pass
        self.assertEqual([None, None], [
            m['compute'] for m in first['migs'][H100_ADDRESS]])
        second = exporter.utilisation_samples(nvml, gpm)
        self.assertEqual([
            {'gi': lib.ids['g3'], 'start': 0, 'compute': 0.25,
             'memory_mib': 3000.0},
            {'gi': lib.ids['g2'], 'start': 4, 'compute': 0.0,
             'memory_mib': 500.0}], second['migs'][H100_ADDRESS])
        self.assertIsNone(second['gpus'][H100_ADDRESS]['compute'])
        self.assertEqual(lib.ids['g3'],
                         second['vgpus'][H100_ADDRESS][0]['gi'])
        # an instance destroyed: its GPM sample freed
        lib.gpus[0].gis.pop(lib.ids['g2'])
        exporter.utilisation_samples(nvml, gpm)
        self.assertEqual(1, len(lib.gpm_samples))


class AgentHookTest(testtools.TestCase):

    def test_add_idle_marks_the_report(self):
        agent = types.SimpleNamespace(
            idle=idle.Tracker(idle_after=1800), nvml=_nvml(sm=0),
            catalog=CATALOG, gpm_samples={})
        for n in range(31):
            report = _report()
            agent_mod.Agent._add_idle(agent, report, now=T0 + 60 * n)
        self.assertIn('idle', report['gpus'][0]['devices'][0])

    def test_add_idle_never_raises(self):
        agent = types.SimpleNamespace(idle=idle.Tracker(), nvml=None,
                                      catalog=None, gpm_samples={})
        report = _report()
        agent_mod.Agent._add_idle(agent, report, now=T0)  # logged
        self.assertNotIn('idle', report['gpus'][0]['devices'][0])

    def test_off(self):
        agent = types.SimpleNamespace(idle=None)
        report = _report()
        agent_mod.Agent._add_idle(agent, report)
        self.assertNotIn('idle', report['gpus'][0]['devices'][0])
