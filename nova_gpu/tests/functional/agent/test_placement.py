"""The agent reads nova-compute's providers in Placement, and keeps heads.

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
from nova_gpu.core import gpu_sets
from nova_gpu.core import report as report_mod
from nova_gpu.tests.unit.agent import fakesys


class PlacementCase(testtools.TestCase):
    """Real Placement, and providers made as nova-compute makes them."""

    def setUp(self):
        super().setUp()
        fx = self.useFixture(placement_fx.PlacementFixture())
        sess = ks_session.Session(
            auth=token_endpoint.Token(fx.endpoint, 'admin'))
        self.conn = openstack.connection.Connection(
            session=sess, placement_endpoint_override=fx.endpoint)

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


class TestPlacementReader(PlacementCase):

    def setUp(self):
        super().setUp()
        root = os.path.join(tempfile.mkdtemp(), 'sys')
        fs = fakesys.FakeSysfs(root)
        for bus in ('3b', '5e'):
            fs.add_pci('0000:%s:00.0' % bus, '0x1eb8')
            fs.add_mdev_type('0000:%s:00.0' % bus, 'nvidia-222', 'T4-1Q', 16)
        self.inv = discovery.Discovery(sysfs.Sysfs(root), host='cmp1'
                                       ).discover()

    def test_report_gets_uuids_and_providers_stay_untouched(self):
        root = self.nova_compute_creates('cmp1')
        gpu0 = self.nova_compute_creates('cmp1_pci_0000_3b_00_0', root)
        reader = placement.PlacementClient(self.conn)
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


class TestHeads(PlacementCase):
    """Set traits on one free VF per GPU (SR-IOV + mdev), moved when used."""

    def _vf(self, root, address):
        name = report_mod.mdev_provider_name('cmp1', address)
        rp = self.nova_compute_creates(name, root)
        resp = self.conn.placement.put(
            '/resource_providers/%s/inventories' % rp.id,
            json={'resource_provider_generation': rp.generation,
                  'inventories': {'VGPU': {'total': 1}}},
            microversion='1.6')
        self.assertEqual(200, resp.status_code, resp.text)
        return name, rp.id

    def _report(self, names):
        return {'gpus': [
            {'index': i, 'providers': [
                {'name': n, 'kind': report_mod.VF_MDEV,
                 'resource_class': 'VGPU'} for n in vfs]}
            for i, vfs in enumerate(names)]}

    def _set_traits(self, uuid):
        resp = self.conn.placement.get(
            '/resource_providers/%s/traits' % uuid, microversion='1.6')
        return {t for t in resp.json()['traits'] if gpu_sets.is_set_trait(t)}

    def test_heads_move_off_used_vfs(self):
        root = self.nova_compute_creates('cmp1')
        vfs = [[self._vf(root, '0000:%s:00.%d' % (bus, fn)) for fn in (4, 5)]
               for bus in ('3b', '5e')]
        names = [[n for n, _u in gpu] for gpu in vfs]
        uuids = {n: u for gpu in vfs for n, u in gpu}
        client = placement.PlacementClient(self.conn)
        report = client.annotate(self._report(names))
        # 2 GPUs: every free VF is a head (gpu_sets.heads_per_gpu).
        self.assertEqual(4, report['agent']['heads_moved'])
        for gpu in (0, 1):
            for name in names[gpu]:
                self.assertEqual(gpu_sets.traits_at(gpu, 2),
                                 self._set_traits(uuids[name]))
        # OWNER_NOVA and nova-compute's own traits stay.
        resp = self.conn.placement.get(
            '/resource_providers/%s/traits' % uuids[names[0][0]],
            microversion='1.6')
        self.assertIn(os_traits.OWNER_NOVA, resp.json()['traits'])
        self.assertIn('CUSTOM_NVIDIA_222', resp.json()['traits'])
        # Again: nothing to change.
        self.assertEqual(0, client.annotate(
            self._report(names))['agent']['heads_moved'])
        # A guest takes a VF of GPU 0: its set traits go.
        consumer = '7a4c7e06-4f4c-4b1e-9a55-0d3b8e5f4a10'
        resp = self.conn.placement.put(
            '/allocations/%s' % consumer, json={
                'allocations': {uuids[names[0][0]]: {
                    'resources': {'VGPU': 1}}},
                'project_id': 'p', 'user_id': 'u',
                'consumer_generation': None},
            microversion='1.28')
        self.assertEqual(204, resp.status_code, resp.text)
        # The quick pass between cycles sees it, from the cached providers.
        self.assertEqual(1, client.keep_heads(*client.last))
        self.assertEqual(set(), self._set_traits(uuids[names[0][0]]))
        self.assertEqual(gpu_sets.traits_at(0, 2),
                         self._set_traits(uuids[names[0][1]]))
        # Freed again: it gets them back.
        resp = self.conn.placement.delete('/allocations/%s' % consumer)
        self.assertEqual(204, resp.status_code, resp.text)
        self.assertEqual(1, client.keep_heads(*client.last))
        self.assertEqual(gpu_sets.traits_at(0, 2),
                         self._set_traits(uuids[names[0][0]]))
