"""nova-gpu's one table printer: prettytable for people, and markdown for
the results kept in doc/source/results.

The simulator, the demo and the benchmarks print through ``text``; the
``nova-gpu`` CLI prints through cliff's table formatter, which is
prettytable with the same alignment (numbers right, text left). A module
at the package root: any layer may use it.
"""

import numbers

import prettytable


def _is_number(value):
    return isinstance(value, numbers.Number) and not isinstance(value, bool)


def _cell(value, float_format):
    if value is None:
        return '-'
    if float_format and isinstance(value, float):
        return float_format % value
    return str(value)


def text(header, rows, title=None, float_format=None, width=None):
    """``rows`` under ``header`` as a prettytable, a string.

    A column of numbers (and None) is right-aligned, any other
    left-aligned; None shows as ``-``; ``float_format`` (e.g. ``'%.2f'``)
    formats floats, which otherwise print as ``str`` does. ``width``: the
    most columns a line takes (prettytable wraps the widest cells).
    """
    rows = [list(row) for row in rows]
    table = prettytable.PrettyTable(field_names=[str(h) for h in header])
    for i, name in enumerate(table.field_names):
        column = [row[i] for row in rows]
        numeric = any(_is_number(c) for c in column) and all(
            _is_number(c) or c is None for c in column)
        table.align[name] = 'r' if numeric else 'l'
    for row in rows:
        table.add_row([_cell(c, float_format) for c in row])
    if title:
        table.title = title
    if width:
        table.max_table_width = width
    return table.get_string()


def markdown(header, rows):
    """``rows`` under ``header`` as a GitHub markdown table.

    Cells print as ``str``: the format of the files in doc/source/results.
    """
    lines = ['| ' + ' | '.join(str(h) for h in header) + ' |',
             '|' + '|'.join('---' for _ in header) + '|']
    for row in rows:
        lines.append('| ' + ' | '.join(str(c) for c in row) + ' |')
    return '\n'.join(lines)
