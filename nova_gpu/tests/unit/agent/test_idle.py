"""The agent's idle devices: NVML samples into windows, the report field."""

import types

import pynvml
import testtools

from nova_gpu.agent import agent as agent_mod
from nova_gpu.agent import host_metrics as exporter
from nova_gpu.agent import nvml as nvml_mod
from nova_gpu.core import idle
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
                           'compute': 0.4, 'memory_mib': 5120.0}],
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


class AgentHookTest(testtools.TestCase):

    def test_add_idle_marks_the_report(self):
        agent = types.SimpleNamespace(
            idle=idle.Tracker(idle_after=1800), nvml=_nvml(sm=0),
            catalog=CATALOG)
        for n in range(31):
            report = _report()
            agent_mod.Agent._add_idle(agent, report, now=T0 + 60 * n)
        self.assertIn('idle', report['gpus'][0]['devices'][0])

    def test_add_idle_never_raises(self):
        agent = types.SimpleNamespace(idle=idle.Tracker(), nvml=None,
                                      catalog=None)
        report = _report()
        agent_mod.Agent._add_idle(agent, report, now=T0)  # logged
        self.assertNotIn('idle', report['gpus'][0]['devices'][0])

    def test_off(self):
        agent = types.SimpleNamespace(idle=None)
        report = _report()
        agent_mod.Agent._add_idle(agent, report)
        self.assertNotIn('idle', report['gpus'][0]['devices'][0])
