"""Plain-text tables of the demo: placements, allocation, comparison.

Everything here is formatting of results already computed; the numbers
come from the cloud (Nova's API, the fake hypervisors) and the core's
fragmentation measure.
"""

from lxml import etree

from nova_gpu import tables


def table(headers, rows, title=None):
    """Numbers right-aligned, floats to two decimals, None as ``-``."""
    return tables.text(headers, rows, title, float_format='%.2f')


def _is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


PLACEMENT_HEADERS = ('#', 'server', 'flavor', 'asks', 'result', 'host',
                     'path', 'GPU (PCI)', 'VF / function', 'device', 'NUMA')


def placements(results, title):
    """One row per server, in boot order."""
    rows = []
    for i, r in enumerate(results, 1):
        functions = [f for f, g in zip(r.functions, r.gpus) if f != g]
        rows.append((i, r.name, r.flavor, r.asks, r.result, r.host,
                     r.path, ' '.join(r.gpus) or None,
                     ' '.join(functions) or None,
                     ' '.join(r.devices) or None,
                     ','.join(str(n) for n in r.numa) or None))
    return table(PLACEMENT_HEADERS, rows, title)


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
