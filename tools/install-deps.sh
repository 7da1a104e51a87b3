#!/bin/bash
# Install what the tests and the demo need on a Debian/Ubuntu machine:
# system packages listed in bindep.txt, and tox. Needs root (or sudo).
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=
if [ "$(id -u)" != 0 ]; then SUDO=sudo; fi

PY=${PYTHON:-python3}
if ! "$PY" -m pip --version >/dev/null 2>&1; then
    $SUDO apt-get update -q
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
        python3-pip python3-venv
fi
# tox and bindep go in their own venv so that a system Python managed by
# Debian (PEP 668) stays untouched.
TOOLS=${NOVA_GPU_TOOLS_VENV:-$PWD/.tox/.tools}
if [ ! -x "$TOOLS/bin/tox" ] || [ ! -x "$TOOLS/bin/bindep" ]; then
    "$PY" -m venv "$TOOLS"
    "$TOOLS/bin/pip" install -q 'tox>=4' bindep
fi
missing=$("$TOOLS/bin/bindep" -b test || true)
# Prometheus: the tests need only its binaries (promtool, prometheus), run
# on free ports. Installed on its own, without the node exporter it
# recommends, and its service (which would listen on :9090) is stopped
# and disabled again if the package started it.
listed=$(printf '%s\n' "$missing" | tr ' ' '\n')
if grep -qx prometheus <<<"$listed"; then
    missing=$(grep -vx prometheus <<<"$listed" | paste -sd' ' || true)
    $SUDO apt-get update -q
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
        --no-install-recommends prometheus
    if [ -d /run/systemd/system ]; then
        $SUDO systemctl disable --now prometheus.service >/dev/null 2>&1 \
            || true
    elif [ -x /etc/init.d/prometheus ]; then
        $SUDO /etc/init.d/prometheus stop >/dev/null 2>&1 || true
        $SUDO update-rc.d prometheus disable >/dev/null 2>&1 || true
    fi
fi
if [ -n "$missing" ]; then
    echo "Installing system packages: $missing"
    $SUDO apt-get update -q
    # With recommends: libvirt's daemon needs what it recommends (a QEMU
    # emulator to define test domains, dnsmasq, ...) to behave as tested.
    # shellcheck disable=SC2086
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q $missing
fi
echo "$TOOLS/bin"
