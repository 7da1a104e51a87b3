#!/bin/bash
# Local git mirrors for devstack's GIT_BASE: OpenStack's git servers are
# not reachable from these machines, the package registries are. One bare
# repository per project that stack.sh clones, under DEST/openstack/, made
# from what can be reached:
#   - the services' sdists on PyPI (pip download --no-binary :all:), one
#     commit each, tagged with the release so that pbr computes the
#     version the sdist was released as, on branch master (what devstack
#     checks out);
#   - openstack/requirements and openstack/devstack: snapshots of the
#     public repositories, passed as bare git directories.
#
# build-mirrors.sh DEST SDIST_DIR REQUIREMENTS_GIT [NAME=PYPI_NAME==VERSION ...]
# An existing mirror is kept (delete it to rebuild it). EXTRA_REQUIREMENTS:
# a requirements file whose needs constrain the pins too (nova-gpu's).
set -euo pipefail

dest=$1 sdists=$2 requirements_git=$3
shift 3
mkdir -p "$dest/openstack" "$sdists"

# Fixed identity and dates: the same sdist gives the same commit id.
export GIT_AUTHOR_NAME="nova-gpu devstack-check" \
    GIT_AUTHOR_EMAIL="devstack-check@localhost" \
    GIT_COMMITTER_NAME="nova-gpu devstack-check" \
    GIT_COMMITTER_EMAIL="devstack-check@localhost" \
    GIT_AUTHOR_DATE="2026-01-01T00:00:00Z" \
    GIT_COMMITTER_DATE="2026-01-01T00:00:00Z"

for spec in "$@"; do
    name=${spec%%=*} req=${spec#*=}
    pypi=${req%%==*} version=${req#*==}
    repo=$dest/openstack/$name.git
    if [[ -d "$repo" ]]; then
        echo "mirror $name: kept ($repo)"
        continue
    fi
    # The sdist's file name uses the normalised project name
    # (openstack_placement-16.0.0.tar.gz).
    norm=${pypi//-/_}
    tarball=$(find "$sdists" -maxdepth 1 -iname "${norm}-${version}.tar.gz" \
        -print -quit)
    if [[ -z "$tarball" ]]; then
        pip download --quiet --no-deps --no-binary :all: -d "$sdists" \
            "$pypi==$version"
        tarball=$(find "$sdists" -maxdepth 1 -iname "${norm}-${version}.tar.gz" \
            -print -quit)
    fi
    [[ -n "$tarball" ]] || { echo "mirror $name: no sdist of $req" >&2; exit 1; }
    work=$(mktemp -d)
    # As root tar keeps the archive's owners; git refuses a tree owned
    # by another user.
    tar --no-same-owner -xzf "$tarball" -C "$work"
    src=$(find "$work" -mindepth 1 -maxdepth 1 -type d -print -quit)
    # Build leftovers of the sdist: pip -e regenerates them.
    rm -rf "$src"/*.egg-info
    git -C "$src" init -q -b master
    git -C "$src" add -A
    git -C "$src" commit -q -m "$pypi $version, from its sdist on PyPI"
    git -C "$src" tag -a -m "$version" "$version"
    git clone -q --bare "$src" "$repo"
    rm -rf "$work"
    echo "mirror $name: $pypi $version ($repo)"
done

# requirements: devstack clones it with GIT_DEPTH=0, checks out master and
# installs everything with -c upper-constraints.txt. Pins that the mirrored
# releases exclude are raised (constraints.py) in one commit on top of the
# snapshot, which says what it changed.
if [[ ! -d "$dest/openstack/requirements.git" ]]; then
    work=$(mktemp -d)
    git clone -q "$requirements_git" "$work/requirements"
    git -C "$work/requirements" checkout -q master
    tarballs=()
    for spec in "$@"; do
        req=${spec#*=}
        pypi=${req%%==*} version=${req#*==}
        tarballs+=("$(find "$sdists" -maxdepth 1 -iname "${pypi//-/_}-${version}.tar.gz" -print -quit)")
    done
    changes=$(python3 "$(dirname "$0")/constraints.py" \
        "$work/requirements/upper-constraints.txt" "${tarballs[@]}" \
        ${EXTRA_REQUIREMENTS:+"$EXTRA_REQUIREMENTS"})
    if [[ -n "$changes" ]]; then
        echo "$changes"
        git -C "$work/requirements" commit -q -a -m "upper-constraints: pins the mirrored releases need

The snapshot predates the releases mirrored here; each pin below is the
lowest release on PyPI that satisfies them (tools/devstack/constraints.py):

$changes"
    fi
    git clone -q --bare "$work/requirements" "$dest/openstack/requirements.git"
    rm -rf "$work"
    echo "mirror requirements: $(git -C "$dest/openstack/requirements.git" \
        log -1 --format='%h %s' master)"
fi
