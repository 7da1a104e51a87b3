"""A fake NVIDIA Fabric Manager, faked only at its API (Shared NVSwitch).

It holds one baseboard's predefined partitions (the published table of
``nova_gpu/core/data/nvswitch_partitions.yaml``), GPUs named by physical
module ID and PCI bus ID, and answers as the Fabric Manager API does
(NVIDIA Fabric Manager User Guide, "Shared NVSwitch APIs"):

* activating an unknown partition ID: ``FM_ST_BADPARAM``; an unsupported
  one (failed NVLinks): ``FM_ST_NOT_SUPPORTED``; one that is active, or
  shares a GPU with an active one: ``FM_ST_IN_USE``;
* deactivating a partition that is not active: ``FM_ST_UNINITIALIZED``
  (modelled: the guide names the error of this case only loosely);
* Fabric Manager down: ``FM_ST_CONNECTION_NOT_VALID`` from every call;
* after a restart in resiliency (restart) mode Fabric Manager knows no
  activations until the hypervisor sets the activated list
  (``fmSetActivatedFabricPartitions``); until then activate and
  deactivate answer ``FM_ST_NOT_CONFIGURED`` (modelled).
"""

from nova_gpu.agent import fabric
from nova_gpu.core import partitions as partitions_mod


class FakeFabricManager(fabric.FabricManager):

    def __init__(self, addresses, baseboard='HGX-H100-8GPU',
                 unsupported=()):
        """``addresses[i]`` is the PCI address of module ``i + 1``."""
        count, parts = partitions_mod.published(baseboard)
        assert len(addresses) == count
        self.addresses = list(addresses)
        self.partitions = {pid: tuple(mods) for pid, mods in parts}
        self.unsupported = set(unsupported)
        self.active = set()
        self.down = False
        self.awaiting_list = False
        self.calls = []
        # Raise this error (an fmReturn_t) once from the next call named.
        self.fail_next = {}

    def _enter(self, op):
        self.calls.append(op)
        if self.down:
            raise fabric.FabricManagerError(
                op, fabric.FM_ST_CONNECTION_NOT_VALID)
        code = self.fail_next.pop(op, None)
        if code is not None:
            raise fabric.FabricManagerError(op, code)

    def _gpus(self, pid):
        return set(self.partitions[pid])

    def supported_partitions(self):
        self._enter('list')
        return [fabric.FmPartition(
            pid, pid in self.active,
            # FM's PCI bus IDs have an 8-digit domain, as NVML's.
            ['0000' + self.addresses[m - 1] for m in mods],
            mods) for pid, mods in sorted(self.partitions.items())]

    def unsupported_partitions(self):
        self._enter('unsupported')
        return sorted(self.unsupported)

    def activate(self, partition_id):
        self._enter('activate')
        if self.awaiting_list:
            raise fabric.FabricManagerError('activate',
                                            fabric.FM_ST_NOT_CONFIGURED)
        if partition_id not in self.partitions:
            raise fabric.FabricManagerError('activate',
                                            fabric.FM_ST_BADPARAM)
        if partition_id in self.unsupported:
            raise fabric.FabricManagerError('activate',
                                            fabric.FM_ST_NOT_SUPPORTED)
        held = set().union(*(self._gpus(p) for p in self.active))
        if partition_id in self.active or self._gpus(partition_id) & held:
            raise fabric.FabricManagerError('activate', fabric.FM_ST_IN_USE)
        self.active.add(partition_id)

    def deactivate(self, partition_id):
        self._enter('deactivate')
        if self.awaiting_list:
            raise fabric.FabricManagerError('deactivate',
                                            fabric.FM_ST_NOT_CONFIGURED)
        if partition_id not in self.partitions:
            raise fabric.FabricManagerError('deactivate',
                                            fabric.FM_ST_BADPARAM)
        if partition_id not in self.active:
            raise fabric.FabricManagerError('deactivate',
                                            fabric.FM_ST_UNINITIALIZED)
        self.active.discard(partition_id)

    def set_activated(self, partition_ids):
        self._enter('set_activated')
        ids = set(partition_ids)
        if not ids <= set(self.partitions):
            raise fabric.FabricManagerError('set_activated',
                                            fabric.FM_ST_BADPARAM)
        self.active = ids
        self.awaiting_list = False

    def restart(self):
        """Fabric Manager restarted (resiliency mode): it has forgotten
        which partitions are active and waits for the list.
        """
        self.active = set()
        self.awaiting_list = True
