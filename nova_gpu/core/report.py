"""The host GPU report: what the compute agent publishes about a host.

This is the one schema both sides share. The agent builds it from
discovery and sends it (oslo.messaging); the scheduler-side view turns it
back into a ``host.Host``. It is plain JSON-able data with a version so that
agents and schedulers of different releases can coexist during upgrades.

Schema (version 1)::

    {"version": 1,
     "host": "compute-1",          # nova-compute host name
     "nodename": "compute-1",      # hypervisor node name
     "generation": 17,             # increases with every report
     "cpu_milli": 128000, "memory_mib": 1048576,
     "numa_cells": [{"id": 0, "cpu_milli": 64000, "memory_mib": 524288}],
     "gpus": [{
        "index": 0, "address": "0000:3b:00.0", "model": "A100-40GB",
        "numa_node": 0, "pcie_switch": "0000:3a:00.0",
        "nvlink_peers": [1, 2, 3], "mig_enabled": false,
        "vgpu_types": ["A100-10C"],  # enabled types, or null for any
        "provider": "compute-1_pci_0000_3b_00_0",
        "devices": [                 # what is allocated now
          {"kind": "vgpu", "detail": "A100-10C", "uuid": "..."},
          {"kind": "mig", "detail": ["3g.20gb", 0, null], "uuid": "..."},
          {"kind": "whole"}]}]}
"""

from nova_gpu.core import exceptions
from nova_gpu.core import host as host_mod

VERSION = 1


def gpu_to_dict(gpu, provider=None, devices=None):
    return {
        'index': gpu.index, 'address': gpu.address,
        'model': gpu.model.name, 'numa_node': gpu.numa_node,
        'pcie_switch': gpu.pcie_switch,
        'nvlink_peers': sorted(gpu.nvlink_peers),
        'mig_enabled': gpu.mig_enabled,
        'vgpu_types': list(gpu.vgpu_types) if gpu.vgpu_types else None,
        'provider': provider,
        'devices': list(devices or ()),
    }


def host_to_dict(host, nodename=None, generation=0, providers=None,
                 devices=None):
    """Report for ``host``; ``providers``/``devices`` are keyed by index."""
    providers = providers or {}
    devices = devices or {}
    return {
        'version': VERSION, 'host': host.name,
        'nodename': nodename or host.name, 'generation': generation,
        'cpu_milli': host.cpu_milli, 'memory_mib': host.memory_mib,
        'numa_cells': [{'id': c.id, 'cpu_milli': c.cpu_milli,
                        'memory_mib': c.memory_mib}
                       for _, c in sorted(host.cells.items())],
        'gpus': [gpu_to_dict(g, providers.get(g.index),
                             devices.get(g.index)) for g in host.gpus],
    }


def host_from_dict(data, catalog):
    """Rebuild a ``host.Host`` (with its allocations) from a report."""
    if not isinstance(data, dict) or data.get('version') != VERSION:
        raise exceptions.InvalidRequest(
            'GPU report: unsupported or missing version %r (expected %d)'
            % (data.get('version') if isinstance(data, dict) else data,
               VERSION))
    try:
        name = data['host']
        gpus = []
        for raw in data['gpus']:
            gpus.append(host_mod.Gpu(
                raw['index'], catalog.model(raw['model']),
                address=raw.get('address', ''),
                numa_node=raw.get('numa_node') or 0,
                pcie_switch=raw.get('pcie_switch'),
                nvlink_peers=raw.get('nvlink_peers') or (),
                mig_enabled=bool(raw.get('mig_enabled')),
                vgpu_types=raw.get('vgpu_types')))
        cells = [host_mod.NumaCell(c['id'], c['cpu_milli'], c['memory_mib'])
                 for c in data.get('numa_cells') or ()]
        result = host_mod.Host(name, gpus, data.get('cpu_milli', 0),
                               data.get('memory_mib', 0), cells)
        for raw in data['gpus']:
            for dev in raw.get('devices') or ():
                detail = dev.get('detail')
                if isinstance(detail, list):
                    detail = tuple(detail)
                result.gpus[raw['index']].take(
                    host_mod.Slot(raw['index'], dev['kind'], detail))
    except (KeyError, TypeError) as e:
        raise exceptions.InvalidRequest(
            'GPU report from %r is malformed: missing or bad %s'
            % (data.get('host'), e)) from e
    return result


def providers_of(data):
    """Map GPU index -> Placement resource provider name, from a report."""
    return {g['index']: g.get('provider') for g in data.get('gpus', ())}
