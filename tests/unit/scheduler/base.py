"""Helpers for the scheduler plugin unit tests: GPU hosts and reports."""

from oslo_config import cfg
from oslo_config import fixture as config_fixture
import testtools

from nova_gpu.core import catalog as catalog_mod
from nova_gpu.core import host as host_mod
from nova_gpu.core import report as report_mod
from nova_gpu.scheduler import view as view_mod

CATALOG = catalog_mod.load_catalog()


def provider(nodename, index):
    return '%s_pci_0000_%02x_00_0' % (nodename, 0x81 + index)


def gpu_report(nodename, model, count=4, vgpu_type=None, per_numa=2,
               nvlink=(), used=None, generation=1):
    """A report of ``count`` GPUs of ``model``; ``used``: index -> n."""
    model = CATALOG.model(model)
    gpus = []
    for i in range(count):
        peers = [p for group in nvlink if i in group for p in group if p != i]
        gpus.append(host_mod.Gpu(
            i, model, address='0000:%02x:00.0' % (0x81 + i),
            numa_node=i // per_numa, pcie_switch='sw%d' % (i // per_numa),
            nvlink_peers=peers,
            vgpu_types=[vgpu_type] if vgpu_type else None))
    cells = [host_mod.NumaCell(n, 16000, 65536)
             for n in range(max(1, (count + per_numa - 1) // per_numa))]
    host = host_mod.Host(nodename, gpus, 16000 * len(cells),
                         65536 * len(cells), cells)
    devices = {i: [{'kind': 'vgpu', 'detail': vgpu_type}] * n
               for i, n in (used or {}).items()}
    return report_mod.host_to_dict(
        host, nodename, generation,
        providers={i: provider(nodename, i) for i in range(count)},
        devices=devices)


class TestCase(testtools.TestCase):

    def setUp(self):
        super().setUp()
        self.conf = self.useFixture(config_fixture.Config(cfg.CONF)).conf
        self.now = 1000.0
        self.view = view_mod.GpuView(CATALOG, clock=lambda: self.now)

    def add_host(self, nodename, model, **kw):
        entry = self.view.ingest(gpu_report(nodename, model, **kw))
        self.view.set_provider_uuids(nodename, {
            provider(nodename, i): '%s-rp%d' % (nodename, i)
            for i in range(len(entry.host.gpus))})
        return self.view.get(nodename)
