"""Raise upper-constraints.txt pins that the mirrored releases exclude.

devstack installs every project with ``-c upper-constraints.txt`` of the
requirements repository. The snapshot of openstack/requirements that can
be reached here may predate the releases the mirrors hold (nova 34.0.0
needs keystoneauth1>=5.16.0; the snapshot pins 5.15.0), and the final
constraints of the series' branch are not reachable. For each requirement
of the given sdists (and of requirements files) whose pin in
upper-constraints.txt it excludes, the pin becomes the lowest final
release on PyPI that satisfies it: the closest to what the series' own
constraints would hold. Prints one line per change; run by
build-mirrors.sh, which commits the result in the requirements mirror.

    python3 constraints.py UPPER_CONSTRAINTS SOURCE...

SOURCE: an sdist (.tar.gz, its requirements.txt is read) or a
requirements file.
"""

import json
import re
import sys
import tarfile
import urllib.request

from packaging.requirements import InvalidRequirement
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion
from packaging.version import Version

PIN = re.compile(
    r'^(?P<name>[A-Za-z0-9._-]+)===(?P<version>[^;\s]+)(?P<rest>.*)$')


def requirement_lines(source):
    if source.endswith('.tar.gz'):
        with tarfile.open(source) as tar:
            for member in tar.getmembers():
                # <name>-<version>/requirements.txt, the top level only.
                if member.name.count('/') == 1 and member.name.endswith(
                        '/requirements.txt'):
                    return tar.extractfile(member).read().decode().splitlines()
        return []
    with open(source) as f:
        return f.read().splitlines()


def requirements(sources):
    for source in sources:
        for line in requirement_lines(source):
            line = line.split('#', 1)[0].strip()
            if not line or line.startswith('-'):
                continue
            try:
                req = Requirement(line)
            except InvalidRequirement:
                continue
            if req.marker is not None and not req.marker.evaluate():
                continue
            yield source, req


def releases(name):
    url = 'https://pypi.org/pypi/%s/json' % name
    with urllib.request.urlopen(url, timeout=60) as response:
        data = json.load(response)
    versions = []
    for text, files in data['releases'].items():
        try:
            version = Version(text)
        except InvalidVersion:
            continue
        if files and not version.is_prerelease and not all(
                f.get('yanked') for f in files):
            versions.append(version)
    return sorted(versions)


def main(argv=None):
    argv = argv or sys.argv[1:]
    path, sources = argv[0], argv[1:]
    with open(path) as f:
        lines = f.read().splitlines()
    pins = {}
    for index, line in enumerate(lines):
        match = PIN.match(line)
        if match:
            pins[canonicalize_name(match['name'])] = index
    changed = False
    for source, req in requirements(sources):
        index = pins.get(canonicalize_name(req.name))
        if index is None:
            continue
        match = PIN.match(lines[index])
        pinned = Version(match['version'])
        if req.specifier.contains(pinned, prereleases=True):
            continue
        fits = [v for v in releases(req.name)
                if v > pinned and req.specifier.contains(v)]
        if not fits:
            print('%s===%s: no release on PyPI satisfies %s (%s)'
                  % (match['name'], pinned, req, source), file=sys.stderr)
            return 1
        lines[index] = '%s===%s%s' % (match['name'], fits[0], match['rest'])
        changed = True
        print('%s: %s -> %s (%s needs %s)' % (match['name'], pinned, fits[0],
                                              source.rsplit('/', 1)[-1], req))
    if changed:
        with open(path, 'w') as f:
            f.write('\n'.join(lines) + '\n')
    return 0


if __name__ == '__main__':
    sys.exit(main())
