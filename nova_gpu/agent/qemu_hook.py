"""nova-gpu-qemu-hook: a VF's vGPU type set just in time (design (b)).

libvirt runs its ``qemu`` hook (``/etc/libvirt/hooks/qemu``, or any
executable in ``/etc/libvirt/hooks/qemu.d/``) as root with the arguments
``<domain> <operation> <sub-operation> <extra>`` and the domain XML on
stdin. In the ``prepare begin`` phase, before libvirt allocates anything
for the domain, this hook gives every NVIDIA vendor-VFIO VF the domain
holds (a ``<hostdev type='pci'>`` whose device has ``nvidia/
current_vgpu_type``) the vGPU type of the instance's flavor: the
``gpu:profile`` extra spec, which Nova copies into the domain's metadata
(``<nova:flavor><nova:extraSpecs>``). Nova's PCI tracker chose the VF
(the scheduler's GpuFilter chose the GPU where that type can be set).

* A VF that already has the type is left as it is; a VF with another
  type, or whose ``creatable_vgpu_types`` does not offer the type now
  (the GPU took another time-sliced type meanwhile, no free GPU instance
  of the profile), fails the start with a message naming the VF: libvirt
  stops, Nova reschedules the instance. Another type is never set.
* All or nothing: when one VF of a multi-VF domain fails, the types this
  run set are cleared again.
* In the ``release end`` phase (the guest has stopped and libvirt has
  released its devices, or its start failed) the types of the domain's
  vendor-VFIO VFs are cleared again: with the hook installed a VF holds a
  type only while a guest holds the VF, so an idle GPU can take any type
  and the agent reports it so (``discovery.GpuRecord.vendor_vfio_types``).
  Live migration releases the source's VFs once the guest has left; a
  hard reboot releases and prepares again.
* On an HGX host in Fabric Manager's Shared NVSwitch mode (``[gpu_agent]
  nvswitch_mode = shared``) the NVSwitch partition of exactly the
  domain's whole GPUs (the NVIDIA GPU PFs among its hostdevs) is
  activated in ``prepare begin`` (``agent.fabric.PartitionKeeper``, a
  record in the state directory first) and deactivated in ``release
  end``; GPUs forming no partition, or Fabric Manager refusing, fail the
  start with a message naming the GPUs or Fabric Manager's error.
* Every other operation, a domain without Nova metadata or without
  ``gpu:profile`` (and, in Shared NVSwitch mode, without whole GPUs),
  and devices that are not vendor-VFIO VFs are left alone (exit 0).
* Bounded, since libvirt waits for the hook: at most ``MAX_XML``
  characters of XML are read, each PCI address is handled once however
  often the XML lists it, and ``prepare`` refuses (the guest does not
  start) a domain with more than ``MAX_HOSTDEVS`` PCI hostdevs, more than
  a guest can have. ``release`` refuses nothing, since the guest is gone
  anyway and a refusal would leave its VFs typed: it skips what is not a
  PCI address and clears only the addresses the host has.
* What the hook writes (libvirt logs the hook's stderr) names the domain
  and quotes the XML and sysfs: every such line goes through
  ``daemon.printable``, so a newline or an escape sequence in a domain
  name cannot forge or rewrite a log line.

libvirt gives every ``qemu`` hook call the domain XML on stdin and names
the phases ``prepare begin`` and ``release end``
(https://libvirt.org/hooks.html).

It never calls libvirt back (libvirt waits for the hook: a deadlock) and
reads only stdin and sysfs. The write goes through the privsep entry
point ``privsep.set_vgpu_type_if_free`` (compare and set, in the
privileged code). The sysfs root is ``[gpu_agent] sysfs_root`` of the
agent's configuration file (``/etc/nova-gpu/nova-gpu.conf``).

Install::

    mkdir -p /etc/libvirt/hooks/qemu.d
    ln -s "$(command -v nova-gpu-qemu-hook)" \\
        /etc/libvirt/hooks/qemu.d/nova-gpu
    systemctl restart libvirtd   # libvirt finds new hooks at start
"""

import re
import sys

from lxml import etree

from nova_gpu.agent import discovery
from nova_gpu.agent import errors
from nova_gpu.agent import fabric
from nova_gpu.agent import mixed_size_mode
from nova_gpu.agent import privsep
from nova_gpu.agent import sysfs as sysfs_mod
from nova_gpu.agent import vf_types
from nova_gpu.core import catalog as catalog_mod
from nova_gpu.core import exceptions
from nova_gpu.core import flavor as flavor_mod
from nova_gpu import daemon

NOVA_NS = 'http://openstack.org/xmlns/libvirt/nova/1.1'
PROFILE_KEY = 'gpu:profile'
MEMORY_KEY = 'gpu:memory'
_VENDOR_PREFIX = re.compile(r'^(GRID|NVIDIA)\s+', re.I)
MAX_XML = 16 * 2 ** 20  # a domain XML is kilobytes; refuse to read more
# PCI hostdevs of one domain: a q35 guest has a PCIe root port for each
# (Nova's [libvirt] num_pcie_ports is at most 28), a pc guest 32 slots.
MAX_HOSTDEVS = 256
PROG = 'nova-gpu-qemu-hook'
PREPARE = ('prepare', 'begin')
RELEASE = ('release', 'end')


class HookError(Exception):
    """The start must fail; the message says why (libvirt shows it)."""


def flavor_specs(root):
    """The flavor's extra specs in the domain's Nova metadata (a dict)."""
    specs = {}
    for spec in root.iterfind(
            'metadata/{%s}instance/{%s}flavor/{%s}extraSpecs/{%s}extraSpec'
            % ((NOVA_NS,) * 4)):
        name = spec.get('name')
        if name:
            specs[name] = (spec.text or '').strip()
    return specs


def flavor_profile(root):
    """The ``gpu:profile`` extra spec in the domain's Nova metadata."""
    return flavor_specs(root).get(PROFILE_KEY) or None


def asks_vgpu_type(specs):
    """The flavor names a vGPU type, or a need one is chosen for."""
    return bool(specs.get(PROFILE_KEY) or specs.get(MEMORY_KEY))


def _pci_addresses(root):
    """(element, PCI address or None) of each ``<hostdev type='pci'>``."""
    for addr in root.iterfind("devices/hostdev[@type='pci']/source/address"):
        try:
            yield addr, '%04x:%02x:%02x.%x' % tuple(
                int(addr.get(k), 16)
                for k in ('domain', 'bus', 'slot', 'function'))
        except (TypeError, ValueError):
            yield addr, None


def hostdev_addresses(root, limit=MAX_HOSTDEVS):
    """PCI addresses of the domain's ``<hostdev type='pci'>`` devices,
    each once, in the domain's order.

    HookError when one is not a PCI address, or when there are more than
    ``limit``.
    """
    found = {}  # ordered, each address once
    for addr, address in _pci_addresses(root):
        if address is None:
            raise HookError('hostdev address %s is not a PCI address'
                            % _quote(addr))
        found[address] = None
        if len(found) > limit:
            raise HookError('the domain has more than %d PCI hostdevs, '
                            'more than a guest can have; none was typed'
                            % limit)
    return list(found)


def _host_addresses(root, fs):
    """The domain's PCI hostdev addresses the host has, each once;
    whatever is not a PCI address is left out, never refused.
    """
    present = set(fs.pci_addresses())
    return list({address: None for _addr, address in _pci_addresses(root)
                 if address in present})


def _quote(element, limit=120):
    text = etree.tostring(element).decode()
    return text if len(text) <= limit else text[:limit] + '...'


def type_id_for(fn, profile):
    """The id of ``profile`` among the VF's creatable types, or None."""
    for type_id, name in fn.creatable_vgpu_types.items():
        if _VENDOR_PREFIX.sub('', name or '').strip() == profile:
            return type_id
    return None


def _function(fs, address):
    """The sysfs PCI function, or None where there is none."""
    try:
        return fs.pci_function(address)
    except errors.AgentError:
        return None


def _siblings(fs, fn):
    """The VFs of ``fn``'s PF (``fn`` among them)."""
    pf = _function(fs, fn.physfn)
    found = [_function(fs, a) for a in (pf.vfs if pf else ())]
    return [f for f in found if f is not None] or [fn]


def _type_names(vfs):
    """{type id: catalog name} the VFs list (a typed VF may no longer list
    its own type: its siblings name the id).
    """
    names = {}
    for vf in vfs:
        for type_id, name in vf.creatable_vgpu_types.items():
            names[type_id] = _VENDOR_PREFIX.sub('', name or '').strip()
    return names


def _model(fs, fn, catalog):
    """The catalog model of the VF's GPU (its PF's PCI product), or None."""
    pf = _function(fs, fn.physfn)
    return catalog.model_for_pci(pf.device_id) if pf else None


def _type_for(fs, fn, specs, catalog, mixed=False):
    """(type id, name) to give untyped VF ``fn``, or None when typed VF
    ``fn`` may keep its type; HookError when neither.

    The type: ``gpu:profile``, or for ``gpu:memory`` the scheduler's order
    of the types meeting the need (``core.flavor.vgpu_type_for``), first
    one the VF can take now: what the driver lists as creatable on it,
    narrowed as the agent reports the GPU to the scheduler
    (``discovery.settable_types``: one time-sliced type per GPU unless
    the GPU is in mixed-size mode, ``mixed``).
    """
    siblings = _siblings(fs, fn)
    names = _type_names(siblings)
    model = _model(fs, fn, catalog)
    profile = specs.get(PROFILE_KEY)
    try:
        if model is None:
            if not profile:
                raise HookError('the GPU of VF %s is not in the catalog: '
                                'no vGPU type can be chosen for %s'
                                % (fn.address, MEMORY_KEY))
            wanted = (profile,)
        else:
            wanted = flavor_mod.vgpu_types_for(specs, catalog, model)
        if fn.current_vgpu_type:
            current = names.get(fn.current_vgpu_type)
            if current is None or current in wanted:
                return None  # already typed (a reboot): left as it is
            raise HookError(
                'VF %s has vGPU type %s (%d), not %s: another type is '
                'never set on a VF' % (fn.address, current,
                                       fn.current_vgpu_type,
                                       ' or '.join(wanted)))
        creatable = {_VENDOR_PREFIX.sub('', n or '').strip()
                     for n in fn.creatable_vgpu_types.values()}
        typed = [names.get(vf.current_vgpu_type) for vf in siblings
                 if vf.current_vgpu_type]
        available = (creatable & set(discovery.settable_types(
            model, typed, creatable, mixed=mixed))
            if model is not None else creatable)
        if not available & set(wanted):
            raise HookError(
                'VF %s cannot take vGPU type %s now (creatable: %s)' % (
                    fn.address, ' or '.join(wanted),
                    ', '.join(sorted(available)) or 'none'))
        name = (flavor_mod.vgpu_type_for(specs, catalog, model, available)
                if model is not None else profile)
    except exceptions.GpuError as e:
        raise HookError('VF %s: %s' % (fn.address, e)) from None
    return type_id_for(fn, name), name


def prepare(xml, sysfs_root, catalog=None, mixed=frozenset()):
    """Type the domain's VFs for its flavor; ``[(vf, type id)]`` set.

    ``mixed``: PF addresses of the GPUs in mixed-size vGPU mode
    (``mixed_size_mode``).

    ``xml``: the domain XML (text, or parsed). Raises HookError (nothing
    left set by this call) when one cannot.
    """
    root = _parse(xml)
    specs = flavor_specs(root)
    if not asks_vgpu_type(specs):
        return []
    catalog = catalog or catalog_mod.load_catalog()
    fs = sysfs_mod.Sysfs(sysfs_root)
    wanted = []
    for address in hostdev_addresses(root):
        fn = _function(fs, address)
        if fn is None or fn.current_vgpu_type is None or not fn.physfn:
            continue  # not a vendor-VFIO VF: a PF, a NIC, an mdev VF
        found = _type_for(fs, fn, specs, catalog,
                          mixed=fn.physfn in mixed)
        if found is not None:
            wanted.append((address,) + found)
    done = []
    try:
        for address, type_id, _name in wanted:
            if privsep.set_vgpu_type_if_free(sysfs_root, address, type_id):
                done.append((address, type_id))
    except (OSError, ValueError) as e:
        for address, _type_id in reversed(done):
            try:
                privsep.clear_vgpu_type(sysfs_root, address)
            except (OSError, ValueError):
                pass  # reported below; the reconciler clears orphans
        raise HookError('setting vGPU type %s failed: %s' % (
            ', '.join(sorted({n for _a, _t, n in wanted})), e)) from None
    return done


def release(xml, sysfs_root):
    """Clear the type of the domain's typed vendor-VFIO VFs; the list.

    Only for a domain whose flavor asks a type (the hook typed its VFs);
    a failure is reported and the rest still cleared: the guest is gone
    whatever the hook says, and the agent's reconciler clears what stays.
    Refuses nothing (see the module); ``xml`` as for ``prepare``.
    """
    root = _parse(xml)
    if not asks_vgpu_type(flavor_specs(root)):
        return [], []
    fs = sysfs_mod.Sysfs(sysfs_root)
    cleared, failed = [], []
    for address in _host_addresses(root, fs):
        fn = _function(fs, address)
        if fn is None or not fn.current_vgpu_type or not fn.physfn:
            continue
        try:
            privsep.clear_vgpu_type(sysfs_root, address)
        except (OSError, ValueError) as e:
            failed.append('%s: %s' % (address, e))
        else:
            cleared.append(address)
    return cleared, failed


def _parse(xml):
    if etree.iselement(xml):
        return xml  # parsed once, by main()
    try:
        return etree.fromstring(xml.encode() if isinstance(xml, str)
                                else xml)
    except etree.XMLSyntaxError as e:
        raise HookError('domain XML cannot be read: %s' % e) from None


def _configured():
    """``[gpu_agent] sysfs_root``, ``state_dir`` and the NVSwitch
    ``fabric.PartitionKeeper`` (None unless ``nvswitch_mode = shared``)
    from the agent's configuration file.
    """
    from oslo_config import cfg

    conf = cfg.CONF  # nova_gpu.conf (imported by daemon): the options
    # libvirt's arguments are not ours: read no command line. The files
    # are checked as every program's are: a FIFO there would hang libvirt.
    daemon.read_config(conf, [], PROG)
    return (conf.gpu_agent.sysfs_root, conf.gpu_agent.state_dir,
            fabric.keeper_from_conf(conf))


def passthrough_gpus(root, sysfs_root):
    """The domain's whole GPUs (NVIDIA GPU PFs among its PCI hostdevs),
    each once: what its NVSwitch partition must hold.
    """
    gpus = sysfs_mod.Sysfs(sysfs_root).nvidia_gpus()
    return [a for a in hostdev_addresses(root)
            if a in gpus and not gpus[a].physfn]


def prepare_partition(keeper, domain, root, sysfs_root):
    """Activate the NVSwitch partition of the domain's whole GPUs; its
    ID, or None (no whole GPU, or the host is not in Shared NVSwitch
    mode). HookError, the guest not started, when the GPUs form no
    partition or Fabric Manager refuses: a guest on GPUs without their
    partition would find no NVLink fabric.
    """
    if keeper is None:
        return None
    gpus = passthrough_gpus(root, sysfs_root)
    if not gpus:
        return None
    try:
        return keeper.prepare(domain, gpus)
    except fabric.PartitionError as e:
        raise HookError(str(e)) from None


def _say(stderr, domain, what):
    """One line for libvirt's log: the domain name and ``what`` (text, or
    an error), both from outside, escaped (``daemon.printable``).
    """
    text = (daemon.describe_error(what) if isinstance(what, Exception)
            else daemon.printable(what))
    stderr.write('%s: domain %s: %s\n' % (PROG, daemon.printable(domain),
                                          text))


def _keep_record(change, state_dir, domain, stderr, *args):
    """Record (or forget) a VF's type for the restore at boot; a failure
    is reported and never fails the guest's start or stop.
    """
    if not state_dir:
        return
    try:
        change(state_dir, *args)
    except (OSError, ValueError) as e:
        _say(stderr, domain, 'VF %s: the record for the restore at boot '
             'failed: %s' % (args[0], e))


def main(argv=None, stdin=None, stderr=None, sysfs_root=None,
         state_dir=None, keeper=None):
    """The hook: exit status 0 (go on) or 1 (libvirt stops the start).

    Each VF typed is recorded in ``state_dir`` (``vf_types``), and
    forgotten when cleared, so that ``nova-gpu-restore`` types it again
    after a reboot while its domain is still defined. In Shared NVSwitch
    mode (``keeper``, from ``[gpu_agent] nvswitch_mode``) the partition
    of a guest's whole GPUs is activated first and deactivated at
    ``release end``; the agent's cycle settles what a crash left
    (``fabric.keep``).
    """
    argv = sys.argv[1:] if argv is None else argv
    stderr = stderr or sys.stderr
    phase = tuple(argv[1:3])
    if len(argv) < 3 or phase not in (PREPARE, RELEASE):
        return 0
    domain = argv[0]
    stdin = stdin or sys.stdin
    try:
        xml = stdin.read(MAX_XML + 1)
        if len(xml) > MAX_XML:
            raise HookError('domain XML larger than %d bytes' % MAX_XML)
        root = _parse(xml)
        typed = asks_vgpu_type(flavor_specs(root))
        if not typed and next(_pci_addresses(root), None) is None:
            return 0   # neither a VF to type nor a GPU to partition
        if sysfs_root is None:
            try:
                sysfs_root, state_dir, keeper = _configured()
            except Exception:
                if typed:
                    raise
                # Not a vGPU guest: it starts and stops whatever else is
                # wrong here (the agent's configuration file, say).
                return 0
            # libvirt runs hooks as root: no privsep daemon needed.
            privsep.use_in_process()
        if phase == RELEASE:
            return _release(domain, root, sysfs_root, state_dir, stderr,
                            keeper, typed)
        held = prepare_partition(keeper, domain, root, sysfs_root)
        try:
            done = prepare(root, sysfs_root, mixed=(
                mixed_size_mode.read(state_dir) if state_dir
                else frozenset())) if typed else []
        except Exception:
            if held is not None:
                _release_partition(keeper, domain, stderr)
            raise
        if held is not None:
            _say(stderr, domain, 'NVSwitch partition %d activated' % held)
    except (HookError, daemon.ConfigError) as e:
        _say(stderr, domain, e)
        return 1
    except Exception as e:  # a broken hook must say so, not hang libvirt
        _say(stderr, domain, 'unexpected error: %s' % e)
        return 1
    for address, type_id in done:
        _say(stderr, domain,
             'VF %s set to vGPU type %d' % (address, type_id))
        _keep_record(vf_types.record, state_dir, domain, stderr, address,
                     type_id)
    return 0


def _release_partition(keeper, domain, stderr):
    """Deactivate the domain's partition; a failure is reported (the
    agent's cycle deactivates it later), never raised.
    """
    try:
        pid = keeper.release(domain)
    except (fabric.FabricManagerError, OSError, ValueError) as e:
        _say(stderr, domain, 'deactivating its NVSwitch partition failed '
             '(the agent retries): %s' % e)
        return
    if pid is not None:
        _say(stderr, domain, 'NVSwitch partition %d deactivated' % pid)


def _release(domain, root, sysfs_root, state_dir, stderr, keeper=None,
             typed=True):
    if keeper is not None:
        _release_partition(keeper, domain, stderr)
    if not typed:
        return 0
    cleared, failed = release(root, sysfs_root)
    for address in cleared:
        _say(stderr, domain, 'VF %s vGPU type cleared' % address)
        _keep_record(vf_types.forget, state_dir, domain, stderr, address)
    for problem in failed:
        _say(stderr, domain, 'clearing VF %s' % problem)
    return 0  # the guest is gone: a release never fails


if __name__ == '__main__':
    sys.exit(main())
