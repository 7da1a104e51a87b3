"""Root-only operations of the agent, through oslo.privsep.

Each entry point does one thing a GPU agent needs (set a VF's vGPU type,
clear it, enable a PF's SR-IOV VFs, bind a PCI function to vfio-pci), as
os-brick's do: the sysfs
paths are built here, in the privileged code, from arguments checked here
(a PCI address, a bounded integer type id). Nothing the unprivileged side
sends can name another file.

``root`` is where sysfs is mounted: ``/sys`` on a host, a fake tree in
tests. It must be an absolute, normalised path to a directory that looks
like sysfs (``bus/pci/devices``), and every device path built below it
must stay within it once symlinks are resolved.
"""

import os
import re
import subprocess

from oslo_privsep import capabilities
from oslo_privsep import priv_context

sys_admin_pctxt = priv_context.PrivContext(
    'nova_gpu',
    cfg_section='nova_gpu_privsep',
    pypath=__name__ + '.sys_admin_pctxt',
    capabilities=[capabilities.CAP_SYS_ADMIN,
                  capabilities.CAP_DAC_OVERRIDE],
)

# \A...\Z: a trailing newline ("0000:3b:00.0\n") is refused, which $ would
# let through.
PCI_ADDR_RE = re.compile(r'\A[0-9a-f]{4}:[0-9a-f]{2}:[0-1][0-9a-f]\.[0-7]\Z')
MAX_VGPU_TYPE_ID = 2 ** 31 - 1
# PCI SR-IOV capability: TotalVFs is a 16-bit field.
MAX_VFS = 0xffff
# NVIDIA's tool (vGPU manager package): "sriov-manage -e <ssss:bb:dd.f>".
SRIOV_MANAGE = '/usr/lib/nvidia/sriov-manage'
SRIOV_MANAGE_TIMEOUT = 120
VFIO_DRIVER = 'vfio-pci'


def use_in_process():
    """Run privileged calls in this process (already root, or tests)."""
    sys_admin_pctxt.set_client_mode(False)


def _check_root(root):
    if not isinstance(root, str) or not os.path.isabs(root) or \
            os.path.normpath(root) != root.rstrip('/') or '\0' in root:
        raise PermissionError('sysfs root must be an absolute, normalised '
                              'path: %r' % (root,))
    if not os.path.isdir(os.path.join(root, 'bus', 'pci', 'devices')):
        raise PermissionError('sysfs root %r has no bus/pci/devices: not '
                              'a sysfs tree' % (root,))
    return root


def _check_address(address):
    if not isinstance(address, str) or not PCI_ADDR_RE.match(address):
        raise ValueError('not a PCI address (DDDD:BB:SS.F, lower-case '
                         'hex): %r' % (address,))
    return address


def _check_type_id(type_id):
    if isinstance(type_id, bool) or not isinstance(type_id, int) or \
            not 0 < type_id <= MAX_VGPU_TYPE_ID:
        raise ValueError('vGPU type id must be an integer from 1 to %d: %r'
                         % (MAX_VGPU_TYPE_ID, type_id))
    return type_id


def _device_dir(root, address):
    """``<root>/bus/pci/devices/<address>``, checked to resolve inside
    ``<root>/devices`` (a PCI device's real directory).
    """
    root = _check_root(root)
    base = os.path.join(root, 'bus', 'pci', 'devices',
                        _check_address(address))
    real = os.path.realpath(base)
    if not real.startswith(os.path.realpath(os.path.join(root, 'devices'))
                           + os.sep) or not os.path.isdir(real):
        raise FileNotFoundError('no PCI device %s below %s'
                                % (address, root))
    return base


def _write(path, value):
    with open(path, 'w') as f:
        f.write(value)


def _write_vgpu_type(root, address, value):
    path = os.path.join(_device_dir(root, address), 'nvidia',
                        'current_vgpu_type')
    if not os.path.isfile(path):
        raise FileNotFoundError('%s has no nvidia/current_vgpu_type: not a '
                                'VF of an NVIDIA vendor VFIO GPU' % address)
    _write(path, '%d\n' % value)


@sys_admin_pctxt.entrypoint
def set_vgpu_type(root, address, type_id):
    """Give SR-IOV VF ``address`` the NVIDIA vGPU type ``type_id``.

    Writes the decimal id to ``<root>/bus/pci/devices/<address>/nvidia/
    current_vgpu_type`` (NVIDIA vendor VFIO, vGPU 17+).
    """
    _write_vgpu_type(root, address, _check_type_id(type_id))


@sys_admin_pctxt.entrypoint
def set_vgpu_type_if_free(root, address, type_id):
    """Give VF ``address`` the vGPU type ``type_id`` unless it has one.

    Compare and set, for the just-in-time type of the ``qemu`` hook: True
    when written, False when the VF has ``type_id`` already; a VF with
    another type is refused (PermissionError), never re-typed.
    """
    _check_type_id(type_id)
    path = os.path.join(_device_dir(root, address), 'nvidia',
                        'current_vgpu_type')
    try:
        with open(path) as f:
            current = int(f.read().strip() or 0)
    except FileNotFoundError:
        raise FileNotFoundError('%s has no nvidia/current_vgpu_type: not a '
                                'VF of an NVIDIA vendor VFIO GPU'
                                % address) from None
    except ValueError:
        raise ValueError('%s: nvidia/current_vgpu_type is not a number'
                         % address) from None
    if current == type_id:
        return False
    if current:
        raise PermissionError('VF %s already has vGPU type %d'
                              % (address, current))
    _write_vgpu_type(root, address, type_id)
    return True


@sys_admin_pctxt.entrypoint
def clear_vgpu_type(root, address):
    """Free SR-IOV VF ``address``: write ``0`` to its
    ``nvidia/current_vgpu_type``.
    """
    _write_vgpu_type(root, address, 0)


@sys_admin_pctxt.entrypoint
def bind_vfio_pci(root, address):
    """Bind PCI function ``address`` to vfio-pci.

    Sets its ``driver_override`` to ``vfio-pci``, unbinds it from its
    current driver (if any) and asks the kernel to probe it again
    (``bus/pci/drivers_probe``), as ``driverctl`` does.
    """
    base = _device_dir(root, address)
    _write(os.path.join(base, 'driver_override'), VFIO_DRIVER + '\n')
    if os.path.lexists(os.path.join(base, 'driver')):
        _write(os.path.join(base, 'driver', 'unbind'), address)
    _write(os.path.join(root, 'bus', 'pci', 'drivers_probe'), address)


def _read_int(path, what):
    try:
        with open(path) as f:
            return int(f.read().strip())
    except FileNotFoundError:
        raise FileNotFoundError('%s: no %s (not an SR-IOV physical '
                                'function)' % (path, what)) from None
    except ValueError:
        raise ValueError('%s is not a number' % path) from None


@sys_admin_pctxt.entrypoint
def enable_sriov_vfs(root, address, count):
    """Enable ``count`` SR-IOV VFs on PF ``address``, as NVIDIA's
    ``sriov-manage -e`` does after each boot.

    The kernel's interface is ``<root>/bus/pci/devices/<address>/
    sriov_numvfs`` (Documentation/PCI/pci-iov-howto.rst: write the number
    of VFs, 0 disables them). Only from 0: a PF that has another non-zero
    number is refused (PermissionError; the kernel would answer EBUSY and
    changing it would take VFs from guests). True when enabled now, False
    when the PF has ``count`` already.

    ``sriov-manage -e`` writes the same file, but with the PF unbound from
    the nvidia driver and bound to ``pci-pf-stub`` meanwhile, because the
    driver takes no ``sriov_numvfs`` write itself. So when the write fails
    on the real ``/sys`` and the tool is installed, it is run (it always
    enables ``sriov_totalvfs`` VFs, hence only for that count).
    """
    base = _device_dir(root, address)
    if isinstance(count, bool) or not isinstance(count, int) or \
            not 0 < count <= MAX_VFS:
        raise ValueError('VF count must be an integer from 1 to %d: %r'
                         % (MAX_VFS, count))
    numvfs = os.path.join(base, 'sriov_numvfs')
    total = _read_int(os.path.join(base, 'sriov_totalvfs'),
                      'sriov_totalvfs')
    if count > total:
        raise ValueError('%s supports %d VFs, not %d' % (address, total,
                                                         count))
    current = _read_int(numvfs, 'sriov_numvfs')
    if current == count:
        return False
    if current:
        raise PermissionError('%s has %d VFs enabled, not %d: disable them '
                              'first (sriov-manage -d)' % (address, current,
                                                           count))
    try:
        _write(numvfs, '%d\n' % count)
    except OSError as e:
        if root != '/sys' or count != total or \
                not os.access(SRIOV_MANAGE, os.X_OK):
            raise OSError(e.errno, 'writing %d to %s failed (%s); NVIDIA\'s '
                          '%s is not there to do it' % (
                              count, numvfs, e.strerror or e,
                              SRIOV_MANAGE)) from None
        try:
            subprocess.run([SRIOV_MANAGE, '-e', address], check=True,
                           timeout=SRIOV_MANAGE_TIMEOUT,
                           stdin=subprocess.DEVNULL,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        except subprocess.CalledProcessError as e:
            raise OSError('%s -e %s failed (exit %d): %s' % (
                SRIOV_MANAGE, address, e.returncode,
                (e.stderr or b'').decode(errors='replace').strip()
            )) from None
        except subprocess.TimeoutExpired:
            raise OSError('%s -e %s did not finish in %d s' % (
                SRIOV_MANAGE, address, SRIOV_MANAGE_TIMEOUT)) from None
    if _read_int(numvfs, 'sriov_numvfs') != count:
        raise OSError('%s did not take %d VFs' % (address, count))
    return True
