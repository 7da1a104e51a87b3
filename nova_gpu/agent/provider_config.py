"""Topology traits for nova-compute, as a provider config YAML file.

nova-compute owns the resource providers of physical GPUs
(``<nodename>_pci_<address>``) and resets their traits at every periodic
update, so traits set through the Placement API vanish. Traits listed in a
provider config file (``[compute] provider_config_location``) are merged
back by nova-compute at every update. nova-compute reads the file when it
starts: restart it after the file changed (``write`` says whether it did).
"""

import os

import yaml

from nova_gpu.agent import discovery

SCHEMA_VERSION = '1.0'


def document(inventory):
    providers = []
    for gpu in inventory.gpus:
        traits = sorted(gpu.traits())
        for address in gpu.provider_addresses():
            providers.append({
                'identification': {
                    'name': discovery.provider_name(inventory.nodename,
                                                    address)},
                'traits': {'additional': traits}})
    return {'meta': {'schema_version': SCHEMA_VERSION},
            'providers': providers}


def render(inventory):
    return ('# Written by nova-gpu-agent; do not edit. GPU topology traits '
            'for nova-compute.\n'
            + yaml.safe_dump(document(inventory), default_flow_style=False,
                             sort_keys=False))


def write(inventory, path):
    """Write the file if its content changed; return True if it did."""
    text = render(inventory)
    try:
        with open(path) as f:
            if f.read() == text:
                return False
    except OSError:
        pass
    os.makedirs(os.path.dirname(path) or '.', exist_ok=True)
    tmp = path + '.tmp'
    with open(tmp, 'w') as f:
        f.write(text)
    os.rename(tmp, path)
    return True
