"""The agent reads, never writes, nova-compute's providers in Placement.

Real Placement (in process, behind wsgi-intercept) reached through
openstacksdk, as the agent does.
"""

import os
import tempfile

from keystoneauth1 import session as ks_session
from keystoneauth1 import token_endpoint
import openstack
import os_traits
from placement.tests.functional.fixtures import placement as placement_fx
import testtools

from nova_gpu.agent import discovery
from nova_gpu.agent import placement
from nova_gpu.agent import sysfs
from tests.unit.agent import fakesys


class TestPlacementReader(testtools.TestCase):

    def setUp(self):
        super().setUp()
        fx = self.useFixture(placement_fx.PlacementFixture())
        sess = ks_session.Session(
            auth=token_endpoint.Token(fx.endpoint, 'admin'))
        self.conn = openstack.connection.Connection(
            session=sess, placement_endpoint_override=fx.endpoint)
        root = os.path.join(tempfile.mkdtemp(), 'sys')
        fs = fakesys.FakeSysfs(root)
        for bus in ('3b', '5e'):
            fs.add_pci('0000:%s:00.0' % bus, '0x1eb8')
            fs.add_mdev_type('0000:%s:00.0' % bus, 'nvidia-222', 'T4-1Q', 16)
        self.inv = discovery.Discovery(sysfs.Sysfs(root), host='cmp1'
                                       ).discover()

    def nova_compute_creates(self, name, parent=None):
        """What nova-compute's report client does for a GPU provider."""
        p = self.conn.placement
        rp = p.create_resource_provider(
            name=name, parent_provider_id=parent.id if parent else None)
        traits = [os_traits.OWNER_NOVA, 'CUSTOM_NVIDIA_222']
        p.create_trait('CUSTOM_NVIDIA_222')
        resp = p.put('/resource_providers/%s/traits' % rp.id,
                     json={'traits': traits,
                           'resource_provider_generation': rp.generation},
                     microversion='1.6')
        self.assertEqual(200, resp.status_code, resp.text)
        return p.get_resource_provider(rp.id)

    def test_report_gets_uuids_and_providers_stay_untouched(self):
        root = self.nova_compute_creates('cmp1')
        gpu0 = self.nova_compute_creates('cmp1_pci_0000_3b_00_0', root)
        reader = placement.PlacementReader(self.conn)
        report = reader.annotate(self.inv.report())
        self.assertEqual(gpu0.id, report['gpus'][0]['provider_uuid'])
        self.assertEqual({'cmp1_pci_0000_3b_00_0': gpu0.id},
                         report['gpus'][0]['provider_uuids'])
        self.assertIsNone(report['gpus'][1]['provider_uuid'])
        self.assertEqual({'cmp1_pci_0000_5e_00_0': None},
                         report['gpus'][1]['provider_uuids'])
        self.assertEqual(['cmp1_pci_0000_5e_00_0'],
                         report['agent']['placement_missing'])
        info = reader.providers(['cmp1_pci_0000_3b_00_0'])[
            'cmp1_pci_0000_3b_00_0']
        self.assertTrue(info['owner_nova'])
        # read only: generation and traits as nova-compute left them
        after = self.conn.placement.get_resource_provider(gpu0.id)
        self.assertEqual(gpu0.generation, after.generation)
        self.assertEqual([os_traits.OWNER_NOVA, 'CUSTOM_NVIDIA_222'],
                         sorted(info['traits'], reverse=True))
