"""Root-only operations of the agent, through oslo.privsep.

Only writes to a short list of sysfs files are allowed, each checked
against a pattern, so that the privileged side cannot be talked into
writing elsewhere.
"""

import os
import re

from oslo_privsep import capabilities
from oslo_privsep import priv_context

sys_admin_pctxt = priv_context.PrivContext(
    'nova_gpu',
    cfg_section='nova_gpu_privsep',
    pypath=__name__ + '.sys_admin_pctxt',
    capabilities=[capabilities.CAP_SYS_ADMIN,
                  capabilities.CAP_DAC_OVERRIDE],
)

_PCI = r'[0-9a-f]{4}:[0-9a-f]{2}:[0-1][0-9a-f]\.[0-7]'
WRITABLE = re.compile(
    r'^bus/pci/(devices/%s/(nvidia/current_vgpu_type|driver_override|'
    r'driver/unbind)|drivers/[A-Za-z0-9_-]+/bind|drivers_probe)$' % _PCI)


def use_in_process():
    """Run privileged calls in this process (already root, or tests)."""
    sys_admin_pctxt.set_client_mode(False)


@sys_admin_pctxt.entrypoint
def write_sysfs(root, relpath, value):
    if not os.path.isabs(root) or not WRITABLE.match(relpath):
        raise PermissionError('refusing to write %r below %r'
                              % (relpath, root))
    with open(os.path.join(root, relpath), 'w') as f:
        f.write(value)
