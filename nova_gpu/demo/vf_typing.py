"""VFs typed on demand in the demo's cloud, where no agent runs.

A mixed-size host (``GpuHost.mixed_size``: vendor-VFIO VFs typed on
demand) gets its VFs' vGPU types from ``nova-gpu-qemu-hook`` when libvirt
prepares a guest, and the vGPU manager refuses a type the GPU has no room
for. The functional tests run the real hook on the agents' fake sysfs
trees (``nova_gpu.tests.harness.qemu_hook.QemuHookMixin``, with real
agents); the demo without ``--agents`` has neither, so ``OnDemandVfTypes``
plays both around the fake domains' start and stop:

* at start, each vendor-VFIO VF of a mixed-size GPU the domain holds is
  given the flavor's type (``gpu:profile``, or for ``gpu:memory`` the
  first type meeting the need that fits, ``core.flavor.vgpu_type_for``,
  as the hook chooses); where the GPU has no room for it (the fit rule
  of ``core.mixed_size``, the one the scheduler places by) the start
  fails as a failing hook fails it: a libvirtError, after which Nova
  reschedules the instance. All or nothing, as the hook.
* at stop, the domain's VFs lose their types again.

The types are kept in the harness's ``GpuState.vf_types``, which its
report of a mixed-size host reads as the agent reads sysfs.
"""

from lxml import etree

from nova_gpu.agent import qemu_hook
from nova_gpu.core import catalog as catalog_mod
from nova_gpu.core import exceptions
from nova_gpu.core import flavor as flavor_mod
from nova_gpu.core import host as host_mod
from nova_gpu.core import mixed_size


class NoRoom(Exception):
    """The VF cannot take the type now (the hook's start failure)."""


def choose_type(state, specs, catalog, pending=()):
    """The vGPU type an untyped VF of GPU ``state`` gets for a flavor
    with ``specs``, beside the types the GPU's VFs hold and ``pending``
    (given by this start); None when the flavor names no vGPU type.

    NoRoom where no type the flavor may have fits the GPU now.
    """
    model = state.model
    if not flavor_mod.vgpu_types_for(specs, catalog, model):
        return None
    gpu = host_mod.Gpu(state.index, model, mixed_size=state.spec.mixed_size)
    for name in list(state.vf_types.values()) + list(pending):
        gpu.take(host_mod.Slot(state.index, host_mod.VGPU, name))
    fitting = {name for name in flavor_mod.vgpu_types_for(
        specs, catalog, model) if gpu.vgpu_room(model.vgpu_profile(name))}
    try:
        return flavor_mod.vgpu_type_for(specs, catalog, model, fitting)
    except exceptions.GpuError as e:
        wanted = flavor_mod.vgpu_types_for(specs, catalog, model)
        if gpu.mixed_size:
            e = '; '.join(mixed_size.why_not(
                model, gpu.vgpu_counts(), model.vgpu_profile(name))
                for name in wanted)
        raise NoRoom(str(e)) from None


def type_vfs(states, xml, catalog=None):
    """Give the domain's VFs on mixed-size GPUs (``states``: the host's
    GpuState) their types; ``[(state, VF)]`` typed. NoRoom (nothing set)
    where one cannot be.
    """
    catalog = catalog or catalog_mod.load_catalog()
    root = etree.fromstring(xml.encode())
    specs = qemu_hook.flavor_specs(root)
    if not qemu_hook.asks_vgpu_type(specs):
        return []
    by_vf = {vf: state for state in states if state.spec.mixed_size
             for vf in state.vfs}
    wanted = []
    for address in qemu_hook.hostdev_addresses(root):
        state = by_vf.get(address)
        if state is None or address in state.vf_types:
            continue  # not such a VF, or typed already (a reboot)
        pending = [n for s, _vf, n in wanted if s is state]
        name = choose_type(state, specs, catalog, pending)
        if name is None:
            continue
        wanted.append((state, address, name))
    for state, address, name in wanted:
        state.vf_types[address] = name
    return [(state, address) for state, address, _name in wanted]


class OnDemandVfTypes:
    """Put before ``GpuCloudTestCase`` (``start_cloud``'s ``mixins``):
    VFs of mixed-size hosts typed at a guest's start, cleared at its stop.
    """

    def setUp(self):
        self.vf_typed = {}  # domain UUID -> [(GpuState, VF)]
        super().setUp()
        from nova_gpu.tests.harness import qemu_hook as hook_harness
        hook_harness.hook_fake_domains(self.useFixture, self.play_hook)

    def play_hook(self, dom, operation, sub_operation):
        """What the hook would do for ``dom`` in this phase: a
        ``HookRun`` whose non-zero status fails the start.
        """
        from nova_gpu.tests.harness import qemu_hook as hook_harness
        status, why = 0, ''
        if operation == 'prepare':
            try:
                self.prepare_vfs(dom)
            except NoRoom as e:
                status, why = 1, '%s: %s' % (qemu_hook.PROG, e)
        else:
            self.release_vfs(dom)
        return hook_harness.HookRun(None, dom.name(), operation, status, why)

    def _states_of(self, dom):
        for hostname, compute in self.computes.items():
            if (hostname in self._gpus
                    and compute.driver._host.get_connection()
                    is dom._connection):
                return self.gpu_states(hostname)
        return ()

    def prepare_vfs(self, dom):
        """libvirt's ``prepare begin``: type the domain's VFs (NoRoom:
        nothing typed, the start fails).
        """
        states = self._states_of(dom)
        xml = getattr(dom, 'nova_gpu_xml', None)
        if xml is None or not any(s.spec.mixed_size for s in states):
            return
        typed = type_vfs(states, xml)
        if typed:
            self.vf_typed[dom.UUIDString()] = typed

    def release_vfs(self, dom):
        """libvirt's ``release end``: the domain's VFs lose their type."""
        for state, vf in self.vf_typed.pop(dom.UUIDString(), ()):
            state.vf_types.pop(vf, None)

    def vf_type(self, hostname, vf):
        """The type VF ``vf`` of ``hostname`` was given, or None."""
        for state in self.gpu_states(hostname):
            if vf in state.vf_types:
                return state.vf_types[vf]
        return None
