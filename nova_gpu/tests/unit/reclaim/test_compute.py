"""The openstacksdk client of the reclaimer, on a fake connection."""

from unittest import mock

from openstack import exceptions as sdk_exceptions
import testtools

from nova_gpu import conf  # noqa: F401  (registers [gpu_scheduler])
from nova_gpu.reclaim import compute


class Response:
    status_code = 200

    def __init__(self, body):
        self.body = body

    def json(self):
        return self.body


class HelpersTest(testtools.TestCase):

    def test_asks_gpu(self):
        for specs in ({'gpu:profile': 'A100-10C'}, {'resources:VGPU': '1'},
                      {'resources1:CUSTOM_NVIDIA_GPU': '1'},
                      {'pci_passthrough:alias': 'nvidia-gpu:1'}):
            self.assertTrue(compute.asks_gpu(specs), specs)
        self.assertFalse(compute.asks_gpu({'hw:cpu_policy': 'dedicated'}))
        self.assertFalse(compute.asks_gpu(None))

    def test_gpu_providers(self):
        allocations = {
            'rp1': {'resources': {'VGPU': 1}},
            'rp2': {'resources': {'VCPU': 2, 'MEMORY_MB': 2048}},
            'rp3': {'resources': {'CUSTOM_NVIDIA_GPU': 2,
                                  'CUSTOM_OTHER': 1}}}
        self.assertEqual(
            {'name-rp1': {'VGPU': 1}, 'name-rp3': {'CUSTOM_NVIDIA_GPU': 2}},
            compute.gpu_providers(allocations, lambda u: 'name-' + u))


class SdkComputeTest(testtools.TestCase):

    def setUp(self):
        super().setUp()
        self.conn = mock.Mock()
        self.server = mock.Mock(
            id='s1', status='ACTIVE', compute_host='h0', project_id='p',
            user_id='u', flavor={'extra_specs': {'resources:VGPU': '1'}})
        self.server.name = 'one'
        self.conn.compute.servers.return_value = [self.server]
        self.conn.compute.get_server.return_value = self.server

        def get(path, microversion=None, raise_exc=True):
            if path.startswith('/allocations/'):
                return Response({'allocations': {
                    'rp1': {'resources': {'VGPU': 1}}}})
            return Response({'name': 'h0_pci_0000_81_00_0'})
        self.conn.placement.get.side_effect = get
        self.client = compute.SdkCompute(self.conn)

    def test_servers_with_gpu_providers(self):
        (info,) = self.client.servers()
        self.assertEqual(('s1', 'one', 'h0', 'ACTIVE', 'p', 'u'),
                         (info.id, info.name, info.host, info.status,
                          info.project_id, info.user_id))
        self.assertEqual({'h0_pci_0000_81_00_0': {'VGPU': 1}},
                         info.providers)
        self.conn.compute.servers.assert_called_once_with(
            details=True, all_projects=True)
        # Provider names are cached.
        self.client.server('s1')
        paths = [c.args[0] for c in self.conn.placement.get.call_args_list]
        self.assertEqual(1, paths.count('/resource_providers/rp1'))

    def test_gone_server_is_none(self):
        self.conn.compute.get_server.side_effect = (
            sdk_exceptions.NotFoundException('gone'))
        self.assertIsNone(self.client.server('s1'))

    def test_actions(self):
        self.client.set_metadata('s1', {'k': 'v'})
        self.client.shelve('s1')
        self.client.shelve_offload('s1')
        self.client.delete('s1')
        self.client.live_migrate('s1', 'h1')
        c = self.conn.compute
        c.set_server_metadata.assert_called_once_with('s1', k='v')
        c.shelve_server.assert_called_once_with('s1')
        c.shelve_offload_server.assert_called_once_with('s1')
        c.delete_server.assert_called_once_with('s1')
        c.live_migrate_server.assert_called_once_with(
            's1', host='h1', block_migration='auto')

    def test_flavor(self):
        f = mock.Mock(extra_specs={'gpu:profile': 'T4-16C'}, vcpus=2,
                      ram=2048)
        self.conn.compute.find_flavor.return_value = f
        self.assertEqual(({'gpu:profile': 'T4-16C'}, 2, 2048),
                         self.client.flavor('big'))
