#!/bin/bash
# The main job of the README: start an all-in-one GPU cloud in process
# (real Nova API, conductor, scheduler and Placement with the nova-gpu
# filter and weighers, simulated GPU hypervisors), boot GPU servers through
# the API and show where they landed. Extra arguments go to nova-gpu-demo,
# e.g. --stock to compare with Nova's own weighers.
#
# --serve: keep the cloud running instead, its APIs on 127.0.0.1 with a
# clouds.yaml for the openstack command (nova_gpu/demo/serve.py, options
# after --serve go to it), until Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/.."
bindir=$(tools/install-deps.sh | tail -n 1)
if [ "${1:-}" = --serve ]; then
    shift
    # tox prepares the environment only: it would kill the cloud half a
    # second after Ctrl-C, before it has stopped.
    "$bindir/tox" -q -e demo --notest
    exec .tox/demo/bin/python -m nova_gpu.demo.serve "$@"
fi
exec "$bindir/tox" -e demo -- "$@"
