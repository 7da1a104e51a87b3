"""Micro-benchmark: time to score one 8-GPU host with the placement engine.

Run with ``tox -e bench`` or ``python -m nova_gpu.bench.core_bench``.
"""

import argparse
import sys
import timeit

from nova_gpu.core import catalog as catalog_mod
from nova_gpu.core import demand as demand_mod
from nova_gpu.core import engine as engine_mod
from nova_gpu.core import fixtures
from nova_gpu.core import request as request_mod
from nova_gpu import tables


def _scenarios(catalog):
    a100 = catalog.model('A100-40GB')
    h100 = catalog.model('H100-80GB')
    vgpu_host = fixtures.hgx_host('vgpu', a100)
    mig_host = fixtures.hgx_host('mig', a100, mig=True)
    nvlink_host = fixtures.hgx_host('nvlink', h100)
    engine = engine_mod.PlacementEngine(demand_mod.catalog_demand(
        catalog, models={'A100-40GB', 'H100-80GB'}))
    # Part-fill each host so the engine has real choices to weigh.
    for host, req, n in (
            (vgpu_host, request_mod.GpuRequest('vgpu', 'A100-10C'), 5),
            (vgpu_host, request_mod.GpuRequest('vgpu', 'A100-20C'), 3),
            (mig_host, request_mod.GpuRequest('mig', '3g.20gb'), 3),
            (mig_host, request_mod.GpuRequest('mig', '1g.5gb'), 5),
            (nvlink_host, request_mod.GpuRequest('whole', count=2), 1)):
        for _ in range(n):
            host.allocate(engine.best(host, req).placement)
    return engine, [
        ('vGPU A100-10C', vgpu_host,
         request_mod.GpuRequest('vgpu', 'A100-10C')),
        ('MIG 2g.10gb', mig_host, request_mod.GpuRequest('mig', '2g.10gb')),
        ('4 GPUs, NVLink', nvlink_host,
         request_mod.GpuRequest('whole', count=4, topology='nvlink')),
    ]


def run(number=3000):
    catalog = catalog_mod.load_catalog()
    engine, scenarios = _scenarios(catalog)
    rows = []
    for label, host, req in scenarios:
        engine.best(host, req)  # warm the per-GPU memo, as a scheduler is
        warm = min(timeit.repeat(lambda: engine.best(host, req),
                                 number=number, repeat=3)) / number
        cold = min(timeit.repeat(lambda: (engine._memo.clear(),
                                          engine.best(host, req)),
                                 number=number // 10, repeat=3)) / (
            number // 10)
        rows.append((label, len(engine.rank(host, req)), warm * 1e6,
                     cold * 1e6))
    print('Placement engine: score one 8-GPU host (best of 3 runs)')
    print(tables.markdown(
        ('request', 'choices', 'us per host (warm memo)',
         'us per host (cold memo)'),
        [(label, n, '%.1f' % warm, '%.1f' % cold)
         for label, n, warm, cold in rows]))
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog='python -m nova_gpu.bench.core_bench',
        description='Placement engine: the cost of scoring one host.')
    parser.add_argument('--number', type=_positive, default=3000,
                        help='calls per timed run (warm memo)')
    run(parser.parse_args(argv).number)
    return 0


def _positive(text):
    value = int(text)
    if value < 10:
        raise argparse.ArgumentTypeError('must be at least 10, not %s'
                                         % text)
    return value


if __name__ == '__main__':
    sys.exit(main())
