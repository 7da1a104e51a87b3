"""The GPUs in mixed-size vGPU mode, as the agent last read them.

``nova-gpu-qemu-hook`` reads no NVML, and NVML alone says whether a GPU
runs NVIDIA's mixed-size (heterogeneous) vGPU mode. The agent writes the
PF addresses of its GPUs in that mode (``mixed_size.json`` in ``[gpu_agent]
state_dir``) when they change; the hook then lets a VF take a type of
another size than its siblings' (the scheduler placed the guest by the
GPU's placement slots, ``core.mixed_size``). Without the file, or where
it cannot be read, every GPU is taken as in equal-size mode: the hook
refuses a second size, the safe side.
"""

import os

from oslo_log import log as logging

from nova_gpu import atomic_file

LOG = logging.getLogger(__name__)
STORE_NAME = 'mixed_size.json'


def write(state_dir, addresses):
    """Record ``addresses`` (PF PCI addresses) as the GPUs in the mode."""
    atomic_file.write_json(os.path.join(state_dir, STORE_NAME),
                           sorted(addresses))


def read(state_dir):
    """The PF addresses recorded, as a frozenset (empty when none)."""
    path = os.path.join(state_dir, STORE_NAME)
    try:
        found = atomic_file.read_json(path)
    except atomic_file.Unreadable as e:
        LOG.warning('%s; every GPU taken as in equal-size mode', e)
        return frozenset()
    if not isinstance(found, list):
        return frozenset()
    return frozenset(a for a in found if isinstance(a, str))
