"""Helpers for the scheduler plugin unit tests: GPU hosts and reports,
and the notifications the scheduler sends.
"""

import json

import fixtures
from oslo_config import cfg
from oslo_config import fixture as config_fixture
import oslo_messaging as messaging
from oslo_messaging.notify import _impl_test
import testtools

from nova_gpu.core import catalog as catalog_mod
from nova_gpu.core import host as host_mod
from nova_gpu.core import notification
from nova_gpu.core import report as report_mod
from nova_gpu.scheduler import notifier as notifications
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


class Notifications(fixtures.Fixture):
    """Records what ``nova_gpu.scheduler.notifier`` sends, through an
    oslo.messaging Notifier (its ``test`` driver), as the wire carries it.
    """

    def _setUp(self):
        transport = messaging.get_notification_transport(cfg.CONF,
                                                         url='fake:/')
        self.addCleanup(transport.cleanup)
        notifications.set_notifier(messaging.Notifier(
            transport, driver='test', publisher_id='nova-gpu-scheduler:t'))
        self.addCleanup(notifications.set_notifier, None)
        _impl_test.reset()
        self.addCleanup(_impl_test.reset)

    def messages(self, event_type):
        """The messages of ``event_type`` sent so far, JSON round-tripped."""
        return [json.loads(json.dumps(m))
                for _ctxt, m, _prio, _retry in _impl_test.NOTIFICATIONS
                if m['event_type'] == event_type]

    def placed(self):
        """The placement payloads sent so far (``PlacementPayload``)."""
        return [notification.parse(m['event_type'], m['payload'])
                for m in self.messages(notification.PLACEMENT_EVENT)]


class TestCase(testtools.TestCase):

    def setUp(self):
        super().setUp()
        self.conf = self.useFixture(config_fixture.Config(cfg.CONF)).conf
        # What the scheduler would send is recorded, never sent: a test
        # must not build a transport to whatever broker the default URL
        # names (none, on a fresh machine) nor leave one to later tests.
        self.notices = self.useFixture(Notifications())
        self.now = 1000.0
        self.view = view_mod.GpuView(CATALOG, clock=lambda: self.now)

    def add_host(self, nodename, model, **kw):
        entry = self.view.ingest(gpu_report(nodename, model, **kw))
        self.view.set_provider_uuids(nodename, {
            provider(nodename, i): '%s-rp%d' % (nodename, i)
            for i in range(len(entry.host.gpus))})
        return self.view.get(nodename)
