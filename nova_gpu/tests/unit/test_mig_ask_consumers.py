"""Every consumer of the core serves bare MIG asks by one rule (issue 25, 4).

A GPU in MIG mode whose enabled vGPU type is MIG-backed (A100-2-10C on a
2g.10gb GPU instance) serves ``gpu:mig=2g.10gb`` and nothing of another
size: Nova hands a guest the type its VF carries. The rule is the core's
(``host.Gpu.serves_mig``); the scheduler's view (what GpuFilter and the
weighers read), the cloud exporter's free-device counts (what ``openstack
gpu`` shows) and the simulator reach it through the core only.
"""

import os

import testtools

from nova_gpu.core import catalog as catalog_mod
from nova_gpu.core import fixtures
from nova_gpu.core import host as host_mod
from nova_gpu.core import report as report_mod
from nova_gpu.exporter import cloud
from nova_gpu.scheduler import gpu_spec
from nova_gpu.scheduler import view as view_mod
from nova_gpu.sim import nova_modes
from nova_gpu.sim import trace as trace_mod

CATALOG = catalog_mod.load_catalog()
ENABLED = 'A100-2-10C'


def mig_backed_report(name='a100-mig'):
    """Two A100s in MIG mode set up for A100-2-10C: three VFs each."""
    host = fixtures.hgx_host(name, CATALOG.model('A100-40GB'), gpus=2,
                             mig=True, vgpu_types=[ENABLED])
    providers = {g.index: [report_mod.provider_dict(
        report_mod.mdev_provider_name(name, g.address[:-1] + str(f)),
        report_mod.VF_MDEV, g.address[:-1] + str(f), vgpu_type=ENABLED)
        for f in (4, 5, 6)] for g in host.gpus}
    return report_mod.host_to_dict(host, name, 1, providers)


def spec(**specs):
    specs = {k.replace('__', ':'): v for k, v in specs.items()}
    specs['resources:VGPU'] = '1'
    return gpu_spec.parse(specs, CATALOG, vcpus=2, memory_mb=2048)


class _SpecObj:
    instance_uuid = 'i-1'
    num_instances = 1


class SchedulerViewTest(testtools.TestCase):
    """What GpuFilter asks (``GpuView.decide``) and the weighers read."""

    def setUp(self):
        super().setUp()
        self.view = view_mod.GpuView(CATALOG, clock=lambda: 1000.0)
        self.entry = self.view.ingest(mig_backed_report())

    def decide(self, asked):
        self.obj = _SpecObj()
        return self.view.decide(self.view.request(self.obj, asked),
                                'a100-mig', 0)

    def test_other_sizes_refused_the_enabled_one_served(self):
        for asked in (spec(gpu__mig='3g.20gb'),
                      spec(gpu__memory='12GB', gpu__kind='mig')):
            decision = self.decide(asked)
            self.assertIsNone(decision.ranked)
            self.assertIn('0 of 2 GPUs can take a ', decision.why)
        decision = self.decide(spec(gpu__mig='2g.10gb'))
        self.assertIsNone(decision.why)
        (slot,) = decision.ranked.choice.placement.slots
        self.assertEqual('2g.10gb', slot.detail[0])


class ExporterCapacityTest(testtools.TestCase):
    """Free devices per profile (the exporter's API, ``openstack gpu``)."""

    def test_free_mig_devices_follow_the_enabled_type(self):
        report = report_mod.parse(mig_backed_report(), CATALOG)
        figures = cloud.host_figures(report.host,
                                     cloud.offered_requests(report))
        free = figures.free_devices
        self.assertEqual(6, free[('A100-40GB', host_mod.MIG, '2g.10gb')])
        for name in ('3g.20gb', '4g.20gb', '7g.40gb', '1g.5gb'):
            self.assertEqual(0, free[('A100-40GB', host_mod.MIG, name)],
                             name)
        # Offered are the sizes the GPUs serve: an empty host has no
        # fragmentation, as for any other setup.
        self.assertEqual(0, figures.fragmentation_milli)


class SimulatorTest(testtools.TestCase):
    """The MIG-mode replay places through the core engine."""

    def test_replay_places_only_the_size_the_gpus_are_set_up_for(self):
        data = os.path.join(os.path.dirname(nova_modes.__file__), 'data')
        nodes = trace_mod.load_nodes(os.path.join(data, 'small_nodes.csv'))
        replay = nova_modes.Replay(nodes, 'mig', 'ours', [], [],
                                   catalog=CATALOG)
        for host in replay.hosts:
            model = host.gpus[0].model
            enabled = [n for n, p in model.vgpu_profiles.items()
                       if p.mig_profile == '1g.10gb'][:1]
            host.gpus = [host_mod.Gpu(g.index, model, mig_enabled=True,
                                      vgpu_types=enabled)
                         for g in host.gpus]
        # 100 milli: 1g.10gb, the enabled size; 400 milli: 3g.40gb.
        self.assertIsNotNone(replay.place((1000, 1024, 1, 100)))
        self.assertIsNone(replay.place((1000, 1024, 1, 400)))
