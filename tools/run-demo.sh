#!/bin/bash
# The main job of the README: start an all-in-one GPU cloud in process
# (real Nova API, conductor, scheduler and Placement with the nova-gpu
# filter and weighers, simulated GPU hypervisors), boot GPU servers through
# the API and show where they landed. Extra arguments go to nova-gpu-demo,
# e.g. --stock to compare with Nova's own weighers.
set -euo pipefail
cd "$(dirname "$0")/.."
bindir=$(tools/install-deps.sh | tail -n 1)
exec "$bindir/tox" -e demo -- "$@"
