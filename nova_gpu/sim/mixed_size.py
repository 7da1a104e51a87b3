"""Equal-size against mixed-size vGPU mode on a vGPU-heavy trace.

Each GPU-sharing task of an Alibaba pod list (``0 < gpu_milli < 1000``,
one GPU) asks the smallest time-sliced vGPU type of ``--model`` whose
frame buffer covers its share; tasks arrive at ``creation_time`` and
leave at ``deletion_time``. Equal-size mode is ``host.Gpu``'s own rule
(one type per GPU until it empties); mixed-size mode is
``core.mixed_size`` (placement IDs). Both place on the fullest GPU that
fits (best fit). Reported: the allocated frame-buffer share when the
first request fails and the share of requests refused.

Example::

    python -m nova_gpu.sim.mixed_size --model L40S --gpus 64 \\
        --tasks ../shared/traces/alibaba-gpu-v2023/\\
openb_pod_list_gpushare100.csv
"""

import argparse
import csv
import random
import sys

from nova_gpu.core import catalog as catalog_mod
from nova_gpu.core import exceptions
from nova_gpu.core import host as host_mod
from nova_gpu.core import mixed_size

MODES = ('equal-size', 'mixed-size')


def vgpu_requests(rows, model):
    """``(arrive, leave, profile)`` for every GPU-sharing task in ``rows``."""
    types = sorted((p for p in model.vgpu_profiles.values()
                    if not p.mig_backed),
                   key=lambda p: p.framebuffer_mib)
    out = []
    for row in rows:
        milli, count = int(row['gpu_milli']), int(row['num_gpu'])
        if count != 1 or not 0 < milli < 1000:
            continue
        need = milli * model.framebuffer_mib / 1000
        profile = next(p for p in types if p.framebuffer_mib >= need)
        leave = row.get('deletion_time') or ''
        out.append((int(row.get('creation_time') or 0),
                    int(leave) if leave else None, profile))
    out.sort(key=lambda r: r[0])
    return out


class _Equal:
    def __init__(self, model):
        self.gpu = host_mod.Gpu(0, model)

    def used_mib(self):
        return sum(self.gpu.model.vgpu_profiles[n].framebuffer_mib * c
                   for n, c in self.gpu.vgpus.items())

    def fits(self, profile):
        return self.gpu.vgpu_room(profile) > 0

    def place(self, profile):
        self.gpu.take(host_mod.Slot(0, host_mod.VGPU, profile.name))
        return profile

    def remove(self, token):
        self.gpu.give_back(host_mod.Slot(0, host_mod.VGPU, token.name))


class _Mixed:
    def __init__(self, model):
        self.gpu = mixed_size.Placements(model)

    def used_mib(self):
        return self.gpu.used_mib

    def fits(self, profile):
        return self.gpu.fits(profile)

    def place(self, profile):
        return self.gpu.place(profile)

    def remove(self, token):
        self.gpu.remove(token)


def replay(model, gpus, requests, mode):
    """Replay ``requests`` on ``gpus`` GPUs of ``model`` in ``mode``."""
    make = {'equal-size': _Equal, 'mixed-size': _Mixed}[mode]
    pool = [make(model) for _ in range(gpus)]
    total = gpus * model.framebuffer_mib
    leaving = []  # (time, gpu index, token)
    first_fail, refused, used = None, 0, 0
    for arrive, leave, profile in requests:
        leaving.sort(key=lambda e: e[0])
        while leaving and leaving[0][0] <= arrive:
            _, index, token, mib = leaving.pop(0)
            pool[index].remove(token)
            used -= mib
        fitting = [i for i, g in enumerate(pool) if g.fits(profile)]
        if not fitting:
            refused += 1
            if first_fail is None:
                first_fail = used / total
            continue
        index = max(fitting, key=lambda i: (pool[i].used_mib(), -i))
        token = pool[index].place(profile)
        used += profile.framebuffer_mib
        if leave is not None:
            leaving.append((leave, index, token, profile.framebuffer_mib))
    return {'mode': mode, 'requests': len(requests), 'refused': refused,
            'refused_share': refused / len(requests) if requests else 0.0,
            'alloc_at_first_fail': first_fail}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--model', default='L40S',
                   help='catalog GPU model with a mixed-size mode')
    p.add_argument('--gpus', type=int, default=64, help='GPUs in the pool')
    p.add_argument('--tasks', required=True, help='Alibaba pod list CSV')
    p.add_argument('--limit', type=int, default=0,
                   help='replay only the first N vGPU requests (0: all)')
    p.add_argument('--seeds', default='',
                   help='comma-separated seeds: shuffle arrival order '
                        '(keeping lifetimes) once per seed')
    args = p.parse_args(argv)
    try:
        model = catalog_mod.load_catalog().model(args.model)
        if not mixed_size.supported(model):
            raise exceptions.InvalidRequest(
                '--model: %s has no mixed-size vGPU mode in the catalog'
                % model.name)
        if args.gpus < 1:
            raise exceptions.InvalidRequest('--gpus must be at least 1')
        with open(args.tasks, newline='') as f:
            requests = vgpu_requests(csv.DictReader(f), model)
    except (exceptions.GpuError, OSError, KeyError,
            ValueError) as exc:
        sys.stderr.write('nova-gpu mixed-size: %s\n' % exc)
        return 2
    if args.limit:
        requests = requests[:args.limit]
    runs = [None] + [int(s) for s in args.seeds.split(',') if s.strip()]
    print('| seed | mode | requests | refused | alloc at first fail |')
    print('|------|------|---------:|--------:|--------------------:|')
    for seed in runs:
        reqs = requests
        if seed is not None:
            reqs = _shuffled(requests, seed)
        for mode in MODES:
            r = replay(model, args.gpus, reqs, mode)
            first = r['alloc_at_first_fail']
            print('| %s | %s | %d | %.1f%% | %s |' % (
                'trace' if seed is None else seed, mode, r['requests'],
                100 * r['refused_share'],
                'none failed' if first is None else '%.1f%%' % (100 * first)))
    return 0


def _shuffled(requests, seed):
    """The requests with arrival times permuted, each keeping its life."""
    rng = random.Random(seed)
    times = [a for a, _, _ in requests]
    order = list(requests)
    rng.shuffle(order)
    out = []
    for t, (a, leave, profile) in zip(times, order):
        out.append((t, None if leave is None else t + leave - a, profile))
    return out


if __name__ == '__main__':
    sys.exit(main())
