"""Topology traits for nova-compute, as a provider config YAML file.

nova-compute owns the resource providers of physical GPUs and of their
parts (every provider ``HostInventory.providers`` names: mdev parents
``<nodename>_pci_<address>`` and PCI in Placement ``<nodename>_<ADDRESS>``)
and resets their traits at every periodic update, so traits set through
the Placement API vanish. Traits listed in a provider config file
(``[compute] provider_config_location``) are merged back by nova-compute
at every update, after the PCI in Placement providers are updated too
(nova/compute/resource_tracker.py ``_update_to_placement``:
``update_provider_tree_for_pci`` then ``_merge_provider_configs``).
nova-compute reads the file when it starts: restart it after the file
changed (``write`` says whether it did).
"""

import os

import yaml

SCHEMA_VERSION = '1.0'


def document(inventory):
    providers = []
    by_index = inventory.providers()
    for gpu in inventory.gpus:
        traits = sorted(gpu.traits())
        for provider in by_index[gpu.index]:
            providers.append({
                'identification': {'name': provider['name']},
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
