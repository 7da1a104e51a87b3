"""The ini edits that put one of nova-gpu's etc/ files into a service's file.

Run by plugin.sh as ``python3 conf_ops.py SOURCE TARGET ETC_DIR``; prints
one edit per line for devstack's ini functions, fields separated by tabs:

* ``set <section> <option> <value>``: a single-valued option (iniset);
* ``multi <section> <option> <value>...``: a multi-valued option
  (iniset_multiline) holding the target's values and the source's;
* nothing where the target holds that already (running it twice changes
  nothing);
* a list option (``enabled_filters``, ``weight_classes``: one line of
  comma-separated items) is a ``set`` of the target's items that no
  nova-gpu file names, or that the source names too, in their order, with
  the source's items not there yet each put before the first item the
  source names after it (else last): devstack's own filters stay,
  GpuCandidateCutFilter lands before Nova's PCI filters and GpuFilter
  last, and a file that replaces nova-gpu's classes
  (nova-scheduler-large-cloud.conf) replaces them.

Parsing is oslo.config's, as the services read the files.

``python3 conf_ops.py --set-multi FILE SECTION OPTION VALUE...`` writes a
multi-valued option, one line per value, in place of the section's lines
of that option (devstack's ``iniset_multiline`` splits its values at
blanks: a JSON value such as a ``[pci] alias`` came out as one line per
word, and nova-api refused to start on them).
"""

import glob
import os
import re
import sys

from oslo_config import cfg

MULTI = {('filter_scheduler', 'available_filters'), ('pci', 'alias'),
         ('pci', 'device_spec'), ('gpu_scheduler', 'typical_requests')}
LISTS = {('filter_scheduler', 'enabled_filters'),
         ('filter_scheduler', 'weight_classes')}


def parse(path):
    """{(section, option): [values]} of an ini file, as oslo.config reads."""
    sections = {}
    if os.path.exists(path):
        cfg.ConfigParser(path, sections).parse()
    return {(s, o): v for s, options in sections.items()
            for o, v in options.items()}


def _items(values):
    return [i.strip() for v in values for i in v.split(',') if i.strip()]


def edits(source, target, etc_dir):
    """The edits, as tuples of fields."""
    ours = {}
    for path in glob.glob(os.path.join(etc_dir, '*.conf')):
        for key, values in parse(path).items():
            if key in LISTS:
                ours.setdefault(key, set()).update(_items(values))
    have = parse(target)
    result = []
    for key, values in parse(source).items():
        section, option = key
        if key in MULTI:
            merged = list(have.get(key, []))
            merged += [v for v in values if v not in merged]
            if merged != have.get(key):
                result.append(('multi', section, option) + tuple(merged))
        elif key in LISTS:
            wanted = _items(values[-1:])
            kept = [i for i in _items(have.get(key, [])[-1:])
                    if i in wanted or i not in ours.get(key, ())]
            for n, item in enumerate(wanted):
                if item in kept:
                    continue
                # Before the first item the source puts after it that is
                # there already (a filter before Nova's PCI filters), else
                # last.
                after = [kept.index(i) for i in wanted[n + 1:] if i in kept]
                kept.insert(min(after) if after else len(kept), item)
            if have.get(key, [None])[-1:] != [','.join(kept)]:
                result.append(('set', section, option, ','.join(kept)))
        elif have.get(key, [None])[-1:] != values[-1:]:
            result.append(('set', section, option, values[-1]))
    return result


def set_multi(path, section, option, values):
    """The option's lines of the section replaced by one line per value.

    The rest of the file (comments, other options, other sections) is left
    as it is; the section is added at the end where the file has none.
    """
    lines = []
    if os.path.exists(path):
        with open(path) as f:
            lines = f.read().splitlines()
    header = re.compile(r'^\[(.*)\]\s*$')
    mine = re.compile(r'^%s\s*=' % re.escape(option))
    new = ['%s = %s' % (option, v) for v in values]
    out, current, done = [], None, False
    for line in lines:
        match = header.match(line)
        if match:
            current = match.group(1)
            out.append(line)
            if current == section and not done:
                out.extend(new)
                done = True
            continue
        if current == section and mine.match(line):
            continue
        out.append(line)
    if not done:
        out += ([''] if out else []) + ['[%s]' % section] + new
    with open(path, 'w') as f:
        f.write('\n'.join(out) + '\n')


def main(argv=None):
    argv = argv or sys.argv[1:]
    if argv[0] == '--set-multi':
        set_multi(argv[1], argv[2], argv[3], argv[4:])
        return
    source, target, etc_dir = argv
    for edit in edits(source, target, etc_dir):
        print('\t'.join(edit))


if __name__ == '__main__':
    main()
