#!/bin/bash
# The test command of the README: installs what it needs, then runs the
# style checks, the unit tests and the functional tests (real Nova and
# Placement in process, a real libvirtd, mdevctl and RabbitMQ).
set -euo pipefail
cd "$(dirname "$0")/.."
bindir=$(tools/install-deps.sh | tail -n 1)
exec "$bindir/tox" -e "${NOVA_GPU_TOX_ENVS:-pep8,py3,functional}" "$@"
