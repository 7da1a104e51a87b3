"""Reliability: NVML faults during the agent's discovery.

Each round builds a host as the agent's unit tests fake it (NVML at the
``pynvml`` boundary, ``nova_gpu/tests/unit/agent/fakenvml.py``; the kernel's
sysfs
as a directory tree, ``fakesys.py``): an HGX H100 board of 8 GPUs, or an
A100 in MIG mode with two GPU instances. Then NVML fails, per GPU, in one
of three ways, drawn at random:

* the GPU falls off the bus ("GPU is lost" from every call about it);
* one call the report must be right about (handle, PCI address, name,
  memory, MIG mode, MIG instances) fails with another NVML error
  (timeout, unknown error, insufficient permissions...);
* one call that only refines the report (NUMA node, NVLinks, vGPU types,
  PCIe topology) fails with such an error.

In a few rounds NVML cannot even count the GPUs. Discovery runs, the
report is built, parsed back and ingested by a scheduler view, as the
scheduler does. Measured, against what each fault must give:

* unnamed errors: anything but an agent error out of discovery or the
  report (target 0);
* GPUs NVML could not read reported as usable (target 0), and GPUs it
  could read missing from the report (target 0);
* GPUs left out that the report's ``left_out`` or the view does not name
  (target 0);
* rounds where NVML cannot count the GPUs and the cycle does not fail
  with "NVML cannot count the GPUs" (target 0).

Everything runs in process; no network.
"""

import logging
import random
import tempfile

import pynvml

from nova_gpu.agent import discovery
from nova_gpu.agent import errors
from nova_gpu.agent import nvml as nvml_mod
from nova_gpu.agent import sysfs
from nova_gpu.bench import reliability
from nova_gpu.core import catalog as catalog_mod
from nova_gpu.core import report as report_mod
from nova_gpu.scheduler import view as view_mod

PART = 'nvml'
FULL = 600
QUICK = 100
# NVML errors a faulty GPU or driver answers (not "not supported", which
# is an answer: no such feature).
ERRORS = (pynvml.NVML_ERROR_UNKNOWN, pynvml.NVML_ERROR_TIMEOUT,
          pynvml.NVML_ERROR_NO_PERMISSION, pynvml.NVML_ERROR_IRQ_ISSUE,
          pynvml.NVML_ERROR_CORRUPTED_INFOROM, pynvml.NVML_ERROR_MEMORY,
          pynvml.NVML_ERROR_UNINITIALIZED)
# Calls whose failure leaves the GPU out, and those that only refine it.
REQUIRED = ('nvmlDeviceGetHandleByIndex', 'nvmlDeviceGetPciInfo',
            'nvmlDeviceGetName', 'nvmlDeviceGetMemoryInfo',
            'nvmlDeviceGetMigMode')
REQUIRED_MIG = ('nvmlDeviceGetGpuInstances', 'nvmlGpuInstanceGetInfo')
REFINING = ('nvmlDeviceGetNumaNodeId', 'nvmlDeviceGetNvLinkState',
            'nvmlDeviceGetSupportedVgpus', 'nvmlDeviceGetCreatableVgpus',
            'nvmlVgpuTypeGetName', 'nvmlDeviceGetTopologyCommonAncestor')


def _host(rng, root):
    """``(fake pynvml, [GPU addresses], MIG host?)`` of one round."""
    # The fakes of the agent's unit tests (run from the source tree, as
    # the other parts that fake hardware).
    from nova_gpu.tests.unit.agent import fakenvml
    from nova_gpu.tests.unit.agent import fakesys
    fs = fakesys.FakeSysfs(root)
    if rng.random() < 0.75:
        fakenvml.hgx_h100_sysfs(fs)
        lib = fakenvml.hgx_h100()
        return lib, ['0000:%s:00.0' % b for b in fakenvml.H100_BUS], False
    fs.add_pci('0000:07:00.0', '0x20b0')
    return fakenvml.a100_mig(), ['0000:07:00.0'], True


def _faults(rng, lib, addresses, mig):
    """Make NVML fail; return the addresses that must be left out."""
    out = set()
    for address in addresses:
        draw = rng.random()
        if draw < 0.1:
            lib.lose(address)
            out.add(address)
        elif draw < 0.2:
            # MIG calls take GPU instance handles: on the one-GPU MIG
            # host they fail for every GPU, that is this one.
            calls = REQUIRED + (REQUIRED_MIG if mig else ())
            call = rng.choice(calls)
            lib.fail(call, rng.choice(ERRORS),
                     None if call in REQUIRED_MIG else address)
            out.add(address)
        elif draw < 0.3:
            call = rng.choice(REFINING)
            # Some take no GPU handle (a type id, two handles): they fail
            # for every GPU, which must all stay.
            lib.fail(call, rng.choice(ERRORS),
                     address if call in REFINING[:4] else None)
    return out


def _round(rng, catalog, counts):
    with tempfile.TemporaryDirectory() as tmp:
        lib, addresses, mig = _host(rng, tmp + '/sys')
        uncountable = rng.random() < 0.03
        if uncountable:
            lib.fail('nvmlDeviceGetCount', rng.choice(ERRORS))
            out = set()
        else:
            out = _faults(rng, lib, addresses, mig)
        try:
            inventory = discovery.Discovery(
                sysfs.Sysfs(tmp + '/sys'), nvml_mod.Nvml(lib=lib), catalog,
                host='h').discover()
            report = inventory.report(generation=1)
            parsed = report_mod.parse(report, catalog)
            entry = view_mod.GpuView(catalog).ingest(report)
        except errors.AgentError as e:
            if not (uncountable and 'NVML cannot count the GPUs' in str(e)):
                counts['unnamed'] += 1
            counts['uncountable'] += uncountable
            return
        except Exception:  # what the agent must never raise
            counts['unnamed'] += 1
            return
    counts['uncountable_missed'] += uncountable
    reported = {g['address'] for g in report['gpus']}
    counts['rounds'] += 1
    counts['left_out'] += len(out)
    counts['unreadable_reported'] += len(reported & out)
    counts['readable_missing'] += len(set(addresses) - out - reported)
    named = {g.address for g in parsed.left_out}
    counts['unnamed_left_out'] += len(out ^ named) + len(
        out ^ {g.address for g in entry.left_out})


def run(quick=False, rounds=None, seed=20261203):
    """Run the rounds; return Figure rows."""
    n = rounds or (QUICK if quick else FULL)
    rng = random.Random(seed)
    catalog = catalog_mod.load_catalog()
    counts = dict.fromkeys(
        ('rounds', 'left_out', 'unreadable_reported', 'readable_missing',
         'unnamed_left_out', 'unnamed', 'uncountable',
         'uncountable_missed'), 0)
    log = logging.getLogger(nvml_mod.__name__)
    saved = log.level
    log.setLevel(logging.CRITICAL)  # one WARNING per fault: expected
    try:
        for _ in range(n):
            _round(rng, catalog, counts)
    finally:
        log.setLevel(saved)

    def figure(name, value, target='0'):
        ok = value == 0 if target == '0' else True
        return reliability.Figure(PART, name, value, target, ok)
    return [
        figure('rounds reported / failed as NVML cannot count the GPUs',
               '%d / %d' % (counts['rounds'], counts['uncountable']), '-'),
        figure('GPUs left out (lost or unreadable)', counts['left_out'],
               '-'),
        figure('unnamed errors out of discovery or the report',
               counts['unnamed']),
        figure('GPUs NVML could not read reported as usable',
               counts['unreadable_reported']),
        figure('GPUs NVML could read missing from the report',
               counts['readable_missing']),
        figure('GPUs left out that left_out or the view does not name',
               counts['unnamed_left_out']),
        figure('NVML that cannot count, not failing the cycle by name',
               counts['uncountable_missed']),
    ]


if __name__ == '__main__':
    import sys
    sys.exit(reliability.part_main(PART, run))
