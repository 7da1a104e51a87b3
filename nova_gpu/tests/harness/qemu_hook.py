"""libvirt's ``qemu`` hook in the in-process cloud.

Nova's fake libvirt (``nova.tests.fixtures.libvirt``) runs no hooks. A
real libvirtd runs ``/etc/libvirt/hooks/qemu.d/*`` with the domain XML on
stdin: at ``prepare begin`` before it starts a guest (an exit status other
than 0 stops the start: Nova gets a libvirtError and reschedules the
instance) and at ``release end`` once the guest has stopped
(https://libvirt.org/hooks.html). ``QemuHookMixin`` does the same around
the fake domains' ``createWithFlags`` and ``destroy``: it runs the real
``nova-gpu-qemu-hook`` program, as a process of its own, on the fake sysfs
tree of the domain's host (``[gpu_agent] sysfs_root`` and the agent's
``state_dir`` from the environment, as oslo.config reads
``OS_<GROUP>__<OPTION>``).

It also gives ``vfio`` hosts their vendor VFIO files: each VF lists every
time-sliced type of the model as creatable (the fake driver does not narrow
a VF's list when the VF or a sibling takes a type, so the agent's report
must not rely on the lists alone); ``preset`` VFs hold the host's type,
``on_demand`` VFs none.

List it before ``AgentReportsMixin`` among a ``GpuCloudTestCase``'s bases:
the hook works on the agents' fake sysfs trees.
"""

import collections
import os
import subprocess
import sys

import fixtures

from nova_gpu.tests.harness import cloud

HOOK = (sys.executable, '-m', 'nova_gpu.agent.qemu_hook')
HOOK_TIMEOUT = 60

HookRun = collections.namedtuple(
    'HookRun', 'host domain phase returncode stderr')


class QemuHookMixin:

    def setUp(self):
        self.hook_runs = []
        super().setUp()
        hook_fake_domains(self.useFixture, self.run_qemu_hook)

    # -- the hook ------------------------------------------------------------

    def host_of_domain(self, dom):
        for hostname, host in self.agent_hosts.items():
            if host.conn is dom._connection:
                return hostname
        return None

    def run_qemu_hook(self, dom, operation, sub_operation):
        """Run ``nova-gpu-qemu-hook`` for ``dom`` as libvirtd would."""
        hostname = self.host_of_domain(dom)
        xml = getattr(dom, 'nova_gpu_xml', None)
        if hostname is None or xml is None:
            return None
        run = run_hook(hostname, dom.name(), xml, operation, sub_operation,
                       {'sysfs_root': self.agent_hosts[hostname].root,
                        'state_dir': os.path.join(self.agent_dirs[hostname],
                                                  'state')})
        self.hook_runs.append(run)
        return run

    # -- vendor VFIO files ------------------------------------------------

    def _vendor_vfio(self, spec):
        """Every VF lists every time-sliced type as creatable (the fake
        driver never narrows the lists); ``preset`` VFs hold the host's
        type, ``on_demand`` ones none.
        """
        if getattr(spec, 'path', None) != cloud.VFIO:
            return super()._vendor_vfio(spec)
        return vendor_vfio_files(spec, self.gpu_states(spec.name))

    def _pci_resource_classes(self, spec):
        # An untyped pool has no type to key its class by: key it by PF.
        if getattr(spec, 'vf_types', cloud.PRESET) != cloud.ON_DEMAND:
            return super()._pci_resource_classes(spec)
        return {state.address: self.path_names.vfio_rc
                for state in self.gpu_states(spec.name)}

    def agent_options(self, hostname):
        options = super().agent_options(hostname)
        if self._host_specs[hostname].vf_types == cloud.ON_DEMAND:
            options['vf_types_on_demand'] = 'true'
        return options

    def vf_types_of(self, hostname):
        """{GPU index: {VF address: catalog type or None}} from sysfs."""
        from nova_gpu.agent import sysfs as sysfs_mod
        fs = sysfs_mod.Sysfs(self.agent_hosts[hostname].root)
        spec = self._host_specs[hostname]
        model = cloud.catalog_mod.load_catalog().model(spec.model)
        by_id = {fake_type_id(name): name for name in model.vgpu_profiles}
        result = {}
        for state in self.gpu_states(hostname):
            result[state.index] = {
                vf: by_id.get(fs.pci_function(vf).current_vgpu_type)
                for vf in state.vfs}
        return result


def hook_fake_domains(use, run_qemu_hook):
    """Run libvirt's ``qemu`` hook around Nova's fake libvirt domains.

    ``run_qemu_hook(dom, operation, sub_operation)`` (a ``HookRun``, or
    None where no hook runs) is called at ``prepare begin`` before a
    domain starts (a non-zero exit status fails the start with libvirt's
    error) and at ``release end`` after a running one is destroyed;
    ``use(fixture)`` installs each patch. The domain's XML, as Nova gave
    it, is ``dom.nova_gpu_xml``.
    """
    from nova.tests.fixtures import libvirt as fakelibvirt
    domain = fakelibvirt.Domain
    init, create, destroy = (domain.__init__, domain.createWithFlags,
                             domain.destroy)

    def keeping_xml(dom, connection, xml, *args, **kwargs):
        init(dom, connection, xml, *args, **kwargs)
        # libvirt keeps the XML it was given, metadata included; the
        # fake rebuilds its XMLDesc without the metadata.
        dom.nova_gpu_xml = xml

    def hooked_create(dom, flags):
        run = run_qemu_hook(dom, 'prepare', 'begin')
        if run is not None and run.returncode != 0:
            raise fakelibvirt.make_libvirtError(
                fakelibvirt.libvirtError,
                'Hook script execution failed: internal error: Child '
                'process (%s %s prepare begin -) unexpected exit status '
                '%d: %s' % (' '.join(HOOK), dom.name(), run.returncode,
                            run.stderr.strip()),
                error_code=fakelibvirt.VIR_ERR_INTERNAL_ERROR,
                error_domain=fakelibvirt.VIR_FROM_QEMU)
        return create(dom, flags)

    def hooked_destroy(dom):
        was_running = dom.isActive()
        destroy(dom)
        if was_running:
            run_qemu_hook(dom, 'release', 'end')

    for name, fn in (('__init__', keeping_xml),
                     ('createWithFlags', hooked_create),
                     ('destroy', hooked_destroy)):
        use(fixtures.MonkeyPatch(
            'nova.tests.fixtures.libvirt.Domain.' + name, fn))


def run_hook(host, domain, xml, operation, sub_operation, agent_options):
    """``nova-gpu-qemu-hook`` run as libvirtd runs it, as a process of its
    own, with ``[gpu_agent]`` options ``agent_options`` from the
    environment (oslo.config reads ``OS_GPU_AGENT__<OPTION>`` before the
    files); a ``HookRun``.
    """
    env = dict(os.environ, **{'OS_GPU_AGENT__%s' % k.upper(): str(v)
                              for k, v in agent_options.items()})
    proc = subprocess.run(
        HOOK + (domain, operation, sub_operation, '-'), input=xml,
        capture_output=True, text=True, env=env, timeout=HOOK_TIMEOUT)
    return HookRun(host, domain, operation, proc.returncode, proc.stderr)


def vendor_vfio_files(spec, gpus):
    """NVIDIA's vendor VFIO files of the VFs of ``gpus`` (``GpuState``) on
    a ``vfio`` host ``spec``: VF address -> ({type id: name} creatable,
    type id preset, 0 for none). Every VF lists every time-sliced type of
    the model (the fake driver never narrows the lists); ``preset`` VFs
    hold the host's type, ``on_demand`` ones none.
    """
    model = cloud.catalog_mod.load_catalog().model(spec.model)
    creatable = {
        fake_type_id(name): 'NVIDIA ' + name
        for name, profile in model.vgpu_profiles.items()
        if not profile.mig_backed}
    current = (0 if spec.vf_types == cloud.ON_DEMAND
               else fake_type_id(spec.vgpu_type))
    return {vf: (creatable, current) for state in gpus for vf in state.vfs}


def fake_type_id(name):
    """The fake driver's type id of catalog vGPU type ``name``."""
    return int(cloud.mdev_type_id(name).split('-')[1])
