"""Carve to demand in real Nova: vendor-VFIO VFs typed just in time.

Design (b) of doc/source/carving.rst, end to end. Two H100 hosts whose
VFs are PCI devices in Placement (NVIDIA vendor-specific VFIO, vGPU 17+):

* ``h100-static``: every VF preset to H100-20C, the static layout an
  operator scripts for a cloud that asked for small vGPUs (Nova's way);
* ``h100-jit``: no VF typed; ``nova-gpu-qemu-hook`` gives a VF the type of
  the guest's flavor when libvirt prepares the guest and clears it when
  libvirt releases it.

Real ``nova-gpu-agent`` processes read each host's fake sysfs (the VFs'
``nvidia/current_vgpu_type``) and report, over RabbitMQ, the types each GPU
can take now; GpuFilter places only there. Nova's fake libvirt runs the
real hook program at each guest start and stop
(``nova_gpu.tests.harness.qemu_hook``). Demand shifts from H100-20C to
H100-40C:
the static layout refuses the large vGPUs, the on-demand host serves them
on its idle GPU, and on the GPU its small guests leave, without touching a
VF in use.
"""

import os

from nova_gpu.tests.harness import agent_process
from nova_gpu.tests.harness import cloud
from nova_gpu.tests.harness import qemu_hook

SMALL, LARGE = 'H100-20C', 'H100-40C'
HOSTS = (
    cloud.GpuHost('h100-static', 'H100-80GB', SMALL, gpus=1,
                  path=cloud.VFIO),
    # 4 VFs per GPU (H100-20C's maximum): room for 4 small or 2 large.
    cloud.GpuHost('h100-jit', 'H100-80GB', SMALL, gpus=2, path=cloud.VFIO,
                  vf_types=cloud.ON_DEMAND),
)


class VfTypesOnDemandTest(qemu_hook.QemuHookMixin,
                          agent_process.AgentReportsMixin,
                          cloud.GpuCloudTestCase):
    HOSTS = HOSTS

    def host_of(self, server):
        return self.admin_api.get_server(server['id'])[
            'OS-EXT-SRV-ATTR:host']

    def vf_of(self, server):
        """(GPU index, VF address) the guest holds, from its domain XML."""
        _uuids, addresses = cloud.hostdev_refs(self.domain_xml(server))
        (vf,) = addresses
        host = self.host_of(server)
        (gpu,) = [s.index for s in self.gpu_states(host) if vf in s.vfs]
        return gpu, vf

    def assert_types(self, hostname, expected):
        """Each GPU's VFs hold ``expected[gpu]`` ({type: count}), and never
        two time-sliced types (the driver's equal-size mode).
        """
        found = {}
        for gpu, vfs in self.vf_types_of(hostname).items():
            counts = {}
            for name in vfs.values():
                if name:
                    counts[name] = counts.get(name, 0) + 1
            found[gpu] = counts
            self.assertLessEqual(len(counts), 1, (hostname, gpu, vfs))
        self.assertEqual(expected, found)

    def boot_refused(self, flavor, **kw):
        server = self.boot(flavor, expected_state='ERROR', **kw)
        self.assertIn('No valid host', server['fault']['message'])
        return server

    def test_demand_shift_served_where_static_refuses(self):
        small = self.create_gpu_flavor({'gpu:profile': SMALL,
                                        'gpu:backend': 'vfio'})
        large = self.create_gpu_flavor({'gpu:profile': LARGE,
                                        'gpu:backend': 'vfio'})
        self.sync_gpu_reports()
        self.assert_types('h100-static', {0: {SMALL: 4}})
        self.assert_types('h100-jit', {0: {}, 1: {}})

        # Small demand: both layouts serve it; the plugin packs the
        # on-demand host's guests on one GPU, each VF typed at its start.
        static_small = self.boot(small, host='h100-static')
        smalls = []
        for _ in range(3):
            smalls.append(self.boot(small, host='h100-jit'))
            self.sync_gpu_reports()  # the agent saw the VF typed
        gpus = {self.vf_of(s)[0] for s in smalls}
        self.assertEqual(1, len(gpus))
        (busy,) = gpus
        idle = 1 - busy
        self.assert_types('h100-jit', {busy: {SMALL: 3}, idle: {}})

        # Demand shifts to large vGPUs. The static layout refuses them:
        # its VFs hold H100-20C, and Nova reads types only at start.
        self.sync_gpu_reports()
        self.boot_refused(large, host='h100-static')
        # The on-demand host serves them on its idle GPU (the only GPU
        # that can take H100-40C now), two per GPU.
        larges = []
        for _ in range(2):
            larges.append(self.boot(large))
            self.sync_gpu_reports()
        for server in larges:
            self.assertEqual('h100-jit', self.host_of(server))
            self.assertEqual(idle, self.vf_of(server)[0])
        self.assert_types('h100-jit', {busy: {SMALL: 3}, idle: {LARGE: 2}})
        # Nothing can take a third now: the busy GPU holds small guests.
        self.sync_gpu_reports()
        self.boot_refused(large)

        # The small guests leave: libvirt releases their VFs, the hook
        # clears the types, the agents report an idle GPU, and it takes
        # the large type for the next guest.
        in_use = {s['id']: self.vf_of(s) for s in larges + [static_small]}
        for server in smalls:
            self._delete_server(server)
        self.assert_types('h100-jit', {busy: {}, idle: {LARGE: 2}})
        self.sync_gpu_reports()
        third = self.boot(large)
        self.assertEqual(('h100-jit', busy),
                         (self.host_of(third), self.vf_of(third)[0]))
        self.assert_types('h100-jit', {busy: {LARGE: 1}, idle: {LARGE: 2}})
        # No device in use was touched: each guest still holds its VF,
        # typed as when it started.
        for server_id, (gpu, vf) in in_use.items():
            server = self.api.get_server(server_id)
            self.assertEqual('ACTIVE', server['status'])
            self.assertEqual((gpu, vf), self.vf_of(server))
        types = self.vf_types_of('h100-jit')
        self.assertEqual([LARGE, LARGE],
                         [types[self.vf_of(s)[0]][self.vf_of(s)[1]]
                          for s in larges])
        self.assert_types('h100-static', {0: {SMALL: 4}})
        # Every server that capacity allowed is ACTIVE; the refused ones
        # are the static host's large vGPU and the third large while both
        # GPUs were taken.
        statuses = sorted(s['status'] for s in self.api.get_servers())
        self.assertEqual(['ACTIVE'] * 4 + ['ERROR'] * 2, statuses)
        # The hook recorded the types of the VFs guests hold, for the
        # restore at boot (and forgot the released ones).
        from nova_gpu.agent import vf_types
        held = {vf: qemu_hook.fake_type_id(LARGE) for gpu, vf in map(
            self.vf_of, larges + [third])}
        self.assertEqual(held, vf_types.VfTypes(os.path.join(
            self.agent_dirs['h100-jit'], 'state')).load())
        # The hook ran at every start and stop on the hosts, and never
        # refused a start: GpuFilter only placed where the type could be
        # set.
        runs = [(r.phase, r.returncode) for r in self.hook_runs]
        self.assertEqual(7, runs.count(('prepare', 0)), self.hook_runs)
        self.assertEqual(3, runs.count(('release', 0)), self.hook_runs)
        self.assertEqual(10, len(runs), self.hook_runs)
