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
* Every other operation, a domain without Nova metadata or without
  ``gpu:profile``, and devices that are not vendor-VFIO VFs are left
  alone (exit 0).

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

from nova_gpu.agent import errors
from nova_gpu.agent import privsep
from nova_gpu.agent import sysfs as sysfs_mod

NOVA_NS = 'http://openstack.org/xmlns/libvirt/nova/1.1'
PROFILE_KEY = 'gpu:profile'
_VENDOR_PREFIX = re.compile(r'^(GRID|NVIDIA)\s+', re.I)
MAX_XML = 16 * 2 ** 20  # a domain XML is kilobytes; refuse to read more


class HookError(Exception):
    """The start must fail; the message says why (libvirt shows it)."""


def flavor_profile(root):
    """The ``gpu:profile`` extra spec in the domain's Nova metadata."""
    for spec in root.iterfind(
            'metadata/{%s}instance/{%s}flavor/{%s}extraSpecs/{%s}extraSpec'
            % ((NOVA_NS,) * 4)):
        if spec.get('name') == PROFILE_KEY:
            return (spec.text or '').strip() or None
    return None


def hostdev_addresses(root):
    """PCI addresses of the domain's ``<hostdev type='pci'>`` devices."""
    found = []
    for addr in root.iterfind("devices/hostdev[@type='pci']/source/address"):
        try:
            found.append('%04x:%02x:%02x.%x' % tuple(
                int(addr.get(k), 16)
                for k in ('domain', 'bus', 'slot', 'function')))
        except (TypeError, ValueError):
            raise HookError('hostdev address %s is not a PCI address'
                            % etree.tostring(addr).decode()) from None
    return found


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


def _sibling_id(fs, fn, profile):
    pf = _function(fs, fn.physfn)
    for address in (pf.vfs if pf else ()):
        sibling = _function(fs, address)
        found = type_id_for(sibling, profile) if sibling else None
        if found is not None:
            return found
    return None


def prepare(xml, sysfs_root):
    """Type the domain's VFs for its flavor; ``[(vf, type id)]`` set.

    Raises HookError (nothing left set by this call) when one cannot.
    """
    try:
        root = etree.fromstring(xml.encode() if isinstance(xml, str)
                                else xml)
    except etree.XMLSyntaxError as e:
        raise HookError('domain XML cannot be read: %s' % e) from None
    profile = flavor_profile(root)
    if profile is None:
        return []
    fs = sysfs_mod.Sysfs(sysfs_root)
    wanted = []
    for address in hostdev_addresses(root):
        fn = _function(fs, address)
        if fn is None or fn.current_vgpu_type is None or not fn.physfn:
            continue  # not a vendor-VFIO VF: a PF, a NIC, an mdev VF
        type_id = type_id_for(fn, profile)
        if fn.current_vgpu_type:
            # A typed VF may no longer list its own type: its siblings
            # name the id.
            known = type_id if type_id is not None else _sibling_id(
                fs, fn, profile)
            if known is None or fn.current_vgpu_type == known:
                continue  # already typed (a reboot): left as it is
            raise HookError(
                'VF %s has vGPU type %d, not %s (%d): another type is '
                'never set on a VF' % (address, fn.current_vgpu_type,
                                       profile, known))
        if type_id is None:
            raise HookError(
                'VF %s cannot take vGPU type %s now (creatable: %s)' % (
                    address, profile,
                    ', '.join(sorted(_VENDOR_PREFIX.sub('', n) for n in
                                     fn.creatable_vgpu_types.values()))
                    or 'none'))
        wanted.append((address, type_id))
    done = []
    try:
        for address, type_id in wanted:
            if privsep.set_vgpu_type_if_free(sysfs_root, address, type_id):
                done.append((address, type_id))
    except (OSError, ValueError) as e:
        for address, _type_id in reversed(done):
            try:
                privsep.clear_vgpu_type(sysfs_root, address)
            except (OSError, ValueError):
                pass  # reported below; the reconciler clears orphans
        raise HookError('setting vGPU type %s failed: %s'
                        % (profile, e)) from None
    return done


def _sysfs_root():
    """``[gpu_agent] sysfs_root`` from the agent's configuration file."""
    from oslo_config import cfg

    import nova_gpu.conf  # noqa: F401 - registers the options
    conf = cfg.CONF
    # libvirt's arguments are not ours: read no command line.
    conf([], project='nova-gpu', prog='nova-gpu-qemu-hook')
    return conf.gpu_agent.sysfs_root


def main(argv=None, stdin=None, stderr=None, sysfs_root=None):
    """The hook: exit status 0 (go on) or 1 (libvirt stops the start)."""
    argv = sys.argv[1:] if argv is None else argv
    stderr = stderr or sys.stderr
    if len(argv) < 3 or (argv[1], argv[2]) != ('prepare', 'begin'):
        return 0
    stdin = stdin or sys.stdin
    try:
        xml = stdin.read(MAX_XML + 1)
        if len(xml) > MAX_XML:
            raise HookError('domain XML larger than %d bytes' % MAX_XML)
        if sysfs_root is None:
            sysfs_root = _sysfs_root()
            # libvirt runs hooks as root: no privsep daemon needed.
            privsep.use_in_process()
        done = prepare(xml, sysfs_root)
    except HookError as e:
        stderr.write('nova-gpu-qemu-hook: domain %s: %s\n' % (argv[0], e))
        return 1
    except Exception as e:  # a broken hook must say so, not hang libvirt
        stderr.write('nova-gpu-qemu-hook: domain %s: unexpected error: '
                     '%s\n' % (argv[0], e))
        return 1
    for address, type_id in done:
        stderr.write('nova-gpu-qemu-hook: domain %s: VF %s set to vGPU '
                     'type %d\n' % (argv[0], address, type_id))
    return 0


if __name__ == '__main__':
    sys.exit(main())
