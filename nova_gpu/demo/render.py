"""Plain-text tables of the demo: placements, allocation, comparison.

Everything here is formatting of results already computed; the numbers
come from the cloud (Nova's API, the fake hypervisors) and the core's
fragmentation measure.
"""

import textwrap

from lxml import etree

from nova_gpu import tables


# The demo's tables fit a terminal of this many columns.
WIDTH = 120


def table(headers, rows, title=None):
    """Numbers right-aligned, floats to two decimals, None as ``-``;
    at most ``WIDTH`` columns wide (long cells wrap).
    """
    return tables.text(headers, rows, title, float_format='%.2f',
                       width=WIDTH)


def _is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


PLACEMENT_HEADERS = ('server', 'flavor', 'result', 'host', 'path',
                     'PCI function', 'device', 'NUMA')


def flavors(results, title):
    """What each flavor of ``results`` asks, once."""
    asks = {}
    for r in results:
        asks.setdefault(r.flavor, r.asks)
    return table(('flavor', 'asks'), sorted(asks.items()), title)


def placements(results, title):
    """One row per server, in boot order.

    One line per device (a four-GPU server takes four lines, not a row of
    300 columns): the PCI function it came from (the VF, or the GPU where
    the device is on the GPU's own function) and the device.
    """
    rows = []
    for r in results:
        rows.append((r.name, r.flavor, r.result, r.host, r.path,
                     '\n'.join(r.functions) or None,
                     '\n'.join(r.devices) or None,
                     ','.join(str(n) for n in r.numa) or None))
    return table(PLACEMENT_HEADERS, rows, title)


def refusals(results, title):
    """Why each server of ``results`` is not ACTIVE: nova-gpu's reason
    on each host its GpuFilter refused it on, else Nova's fault (host
    ``-``).
    """
    lines = [title]
    for r in results:
        for host, why in r.why:
            lines.append('  %s (%s):' % (r.name, 'GpuFilter on %s' % host
                                         if host else r.result))
            lines += textwrap.wrap(why, WIDTH, initial_indent='    ',
                                   subsequent_indent='    ')
    return '\n'.join(lines)


def allocation(hosts, title):
    """Per host: GPUs, what is used, and the expected fragmentation."""
    rows = []
    for h in hosts:
        rows.append((h.name, h.model, h.gpus, h.used_gpus, h.free_gpus,
                     h.idle_gpus, h.fragmentation, h.layout))
    return table(('host', 'model', 'GPUs', 'used', 'free', 'idle GPUs',
                  'frag.', 'per-GPU use'), rows, title)


def comparison(ours, stock, title):
    """Side by side outcome of the same request sequence."""
    rows = []
    for (label, a), (_label, b) in zip(ours, stock):
        rows.append((label, a, b, _diff(a, b)))
    return table(('', 'nova-gpu', 'stock Nova', 'difference'), rows, title)


def _diff(a, b):
    if _is_number(a) and _is_number(b):
        d = a - b
        if isinstance(d, float):
            return '%+.2f' % d
        return '%+d' % d
    return '' if a == b else 'differs'


def hostdevs(domain_xml):
    """The ``<hostdev>`` elements of a libvirt domain XML, indented."""
    root = etree.fromstring(domain_xml.encode()
                            if isinstance(domain_xml, str) else domain_xml)
    parts = []
    for dev in root.iter('hostdev'):
        dev.tail = None
        etree.indent(dev, space='  ')
        parts.append(etree.tostring(dev, encoding='unicode'))
    return '\n'.join(parts)
