"""Summaries of replay runs: means over seeds, published figures, plot."""

import csv
import os

import numpy as np

from nova_gpu.core import exceptions

POINTS = (100, 130)
# The FGD artifact's policy directory names in fgd_expected_alloc.csv.
PUBLISHED_NAMES = {'random': '01-Random', 'bestfit': '05-BestFit',
                   'fgd': '06-FGD'}


def mean_curve(curves):
    """Mean over runs of {percent: ratio} curves (keys all runs share)."""
    keys = sorted(set.intersection(*(set(c) for c in curves)))
    return {k: round(float(np.mean([c[k] for c in curves])), 2)
            for k in keys}


def published(path, workload, policy, points=POINTS, seeds=None):
    """Mean published allocation ratio at ``points``, or None."""
    name = PUBLISHED_NAMES.get(policy)
    if name is None or not path or not os.path.isfile(path):
        return None
    rows = []
    with open(path, newline='') as f:
        for row in csv.DictReader(f):
            if (row['workload'] in (workload, 'openb_pod_list_' + workload)
                    and row['sc_policy'] == name
                    and (seeds is None or int(row['seed']) in seeds)):
                rows.append(row)
    if not rows:
        return None
    return {p: round(float(np.mean([float(r[str(p)]) for r in rows])), 2)
            for p in points}


def plot(curves, path, title):
    """PNG of allocation ratio against arrived request, one line a policy.

    matplotlib is imported here, with the Agg backend, so that only the
    plot needs it.
    """
    try:
        import matplotlib
        matplotlib.use('Agg')
        from matplotlib import pyplot
    except ImportError:
        raise exceptions.InvalidRequest(
            'plotting needs matplotlib (pip install matplotlib, or tox -e '
            'bench)') from None
    fig, ax = pyplot.subplots(figsize=(7, 4.5))
    for name, curve in curves.items():
        xs = sorted(curve)
        ax.plot(xs, [curve[x] for x in xs], label=name, linewidth=1.4)
    ax.plot([0, 100], [0, 100], color='grey', linewidth=0.6,
            linestyle=':')
    ax.set_xlabel('Arrived GPU request (% of cluster GPU capacity)')
    ax.set_ylabel('GPU allocation ratio (%)')
    ax.set_title(title)
    ax.set_xlim(0, 130)
    ax.grid(True, linewidth=0.3)
    ax.legend(loc='lower right')
    inset = ax.inset_axes([0.08, 0.45, 0.38, 0.4])
    for name, curve in curves.items():
        xs = [x for x in sorted(curve) if x >= 80]
        inset.plot(xs, [curve[x] for x in xs], linewidth=1.2)
    inset.set_xlim(80, 130)
    inset.set_ylim(84, 98)
    inset.grid(True, linewidth=0.3)
    inset.set_title('80-130%', fontsize=8)
    inset.tick_params(labelsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    pyplot.close(fig)
