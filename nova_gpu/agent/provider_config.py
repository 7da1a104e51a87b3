"""Topology traits for nova-compute, as a provider config YAML file.

nova-compute owns the resource providers of physical GPUs and of their
parts (every provider ``HostInventory.providers`` names: mdev parents
``<nodename>_pci_<address>`` and PCI in Placement ``<nodename>_<ADDRESS>``)
and writes their traits from its own view at every periodic update, which
keeps a trait set through the Placement API on one kind and not on the
other (Nova 34):

* mdev (VGPU) providers: the libvirt driver only adds ``OWNER_NOVA``
  (nova/virt/libvirt/driver.py, ``update_provider_tree`` ->
  ``_update_provider_tree_for_vgpu`` -> ``_ensure_pgpu_providers``:
  ``provider_tree.add_traits(pgpu_rp_name, ot.OWNER_NOVA)``) and keeps the
  rest, so a trait set through the API stays;
* PCI in Placement providers: their traits are replaced, at every update,
  by those of the ``[pci] device_spec`` entry (its ``traits`` tag,
  ``COMPUTE_MANAGED_PCI_DEVICE``) plus ``OWNER_NOVA``
  (nova/compute/pci_placement_translator.py,
  ``PciResourceProvider.update_provider_tree``:
  ``provider_tree.update_traits(self.name, self.traits)``). A trait set
  through the API is gone once nova-compute's provider cache has read it
  (``[compute] resource_provider_association_refresh``, 300 s by default,
  ``SchedulerReportClient._refresh_associations``) and the next update
  writes its own set back (``set_traits_for_provider`` replaces the
  provider's traits whenever the new tree's differ from that cache).

Traits listed in a provider config file (``[compute]
provider_config_location``) are merged in by nova-compute at every update,
after the PCI in Placement providers are updated
(nova/compute/resource_tracker.py ``_update_to_placement``:
``update_provider_tree_for_pci`` then ``_merge_provider_configs``), so they
stay on both kinds: that is why the agent writes one and never sets traits
through the API. nova-compute reads the file when it starts
(``ResourceTracker.__init__``, ``provider_config.get_provider_configs``):
restart it after the file changed (``write`` says whether it did). The
file is replaced whole (``nova_gpu.atomic_file``): nova-compute, even after
a power cut, reads the old file or the new one, never a truncated one.

With ``quota=True`` (``[gpu_agent] quota_inventory``) the file also gives
the compute node's root provider, by its name, the GPU quota classes of
``core.quota.host_inventory``: custom inventory, which
``_merge_provider_configs`` adds to the provider tree (Nova refuses
standard classes and classes the virt driver reports there,
nova/compute/provider_config.py ``_validate_provider_config``).
"""

import os

import yaml

from nova_gpu import atomic_file
from nova_gpu.core import gpu_sets
from nova_gpu.core import quota as quota_mod

SCHEMA_VERSION = '1.0'


def document(inventory, quota=False):
    """The provider config of a discovered host (``HostInventory``);
    ``quota``: with the GPU quota inventory on its root provider.
    """
    by_index = inventory.providers()
    root = None
    if quota:
        root = root_entry(inventory.nodename, quota_mod.host_inventory(
            (g.model, [p['kind'] for p in by_index[g.index]])
            for g in inventory.gpus))
    return document_of([{'index': g.index, 'providers': by_index[g.index],
                         'traits': g.traits()} for g in inventory.gpus],
                       root=root)


def root_entry(nodename, inventories):
    """The entry of the root provider ``nodename`` (the hypervisor host
    name Nova names it by) with ``inventories`` (``{class: {'total': n,
    ...}}``); None when there is nothing to add.
    """
    if not inventories:
        return None
    return {'identification': {'name': nodename},
            'inventories': {'additional': [
                {rc: dict(inv)} for rc, inv in sorted(inventories.items())]}}


def document_of(gpus, root=None):
    """The provider config of ``gpus`` (``index``, ``providers`` as the
    report lists them, topology ``traits``): each GPU's topology traits on
    every provider of it, and the set traits of the GPUs that stand for
    themselves in multi-GPU requests (``core.gpu_sets.static_traits``;
    the heads of GPUs whose VFs are providers move, so the agent keeps
    those in Placement, ``agent.placement``). ``root``: an entry of
    ``root_entry`` to add first.
    """
    sets = gpu_sets.static_traits(gpus)
    providers = [root] if root else []
    for gpu in gpus:
        for provider in gpu['providers']:
            traits = set(gpu['traits']) | sets.get(provider['name'], set())
            if traits:  # Nova's schema wants something to add
                providers.append({
                    'identification': {'name': provider['name']},
                    'traits': {'additional': sorted(traits)}})
    return {'meta': {'schema_version': SCHEMA_VERSION},
            'providers': providers}


def render(document):
    return ('# Written by nova-gpu-agent; do not edit. GPU topology traits '
            'for nova-compute.\n'
            + yaml.safe_dump(document, default_flow_style=False,
                             sort_keys=False))


def write(inventory, path, quota=False):
    """Write the file of ``inventory`` if its content changed; return True
    if it did. ``quota``: see ``document``.
    """
    return write_document(document(inventory, quota=quota), path)


def write_document(doc, path):
    """Write ``doc`` to ``path`` if that changes it; True if it did."""
    text = render(doc)
    try:
        with open(path) as f:
            if f.read() == text:
                return False
    except OSError:
        pass
    os.makedirs(os.path.dirname(path) or '.', exist_ok=True)
    # nova-compute (another user, maybe) reads it: 0o644, as before.
    atomic_file.write(path, text, mode=0o644)
    return True
