#!/bin/bash
# shellcheck shell=bash
# What the checks of tools/devstack-check.sh share (verify.sh,
# verify-gpu.sh, verify-restart.sh source it): PASS/FAIL lines, the
# openstack CLI as devstack's demo user and as its admin (the entries of
# /etc/openstack/clouds.yaml devstack wrote), a wait.

FAILED=0
# devstack's clouds.yaml entries: "devstack" is the demo user of the demo
# project, "devstack-admin" the admin.
USER_CLOUD=devstack
ADMIN_CLOUD=devstack-admin
IMAGE=devstack-check-empty
# Nova's environment (devstack's global virtual environment), for the
# scripts that sourced this.
# shellcheck disable=SC2034
VENV_BIN=/opt/stack/data/venv/bin

pass() { echo "PASS $*"; }
fail() { echo "FAIL $*"; FAILED=1; }
# check DESCRIPTION CMD...: PASS or FAIL by the command's status.
check() {
    local what=$1
    shift
    if "$@"; then pass "$what"; else fail "$what"; fi
}
os_user() { openstack --os-cloud "$USER_CLOUD" "$@"; }
os_admin() { openstack --os-cloud "$ADMIN_CLOUD" "$@"; }

# wait_until SECONDS CMD...: true once CMD succeeds, false after SECONDS.
wait_until() {
    local deadline=$(( SECONDS + $1 ))
    shift
    until "$@"; do
        (( SECONDS < deadline )) || return 1
        sleep 3
    done
}

# ensure_image: the image every check boots (an empty qcow2 disk: no
# image server is reachable from here; QEMU runs it, its firmware finds
# nothing to boot, which is all Nova needs for ACTIVE).
ensure_image() {
    if ! os_admin image show "$IMAGE" >/dev/null 2>&1; then
        qemu-img create -q -f qcow2 "/tmp/$IMAGE.qcow2" 1G
        os_admin image create --public --disk-format qcow2 \
            --container-format bare --file "/tmp/$IMAGE.qcow2" "$IMAGE" \
            -f value -c id >/dev/null
    fi
}

json() { python3 -c "import json, sys; d = json.load(sys.stdin); $1"; }

# gpu_flavor NAME [--quota] SPEC...: a flavor with these gpu: keys and the Nova keys
# openstack gpu flavor keys prints for them (as the admin: flavors are).
gpu_flavor() {
    local name=$1 spec key value
    shift
    os_admin flavor show "$name" >/dev/null 2>&1 && return 0
    local -a props=() keys=()
    if [[ ${1:-} == --quota ]]; then
        # Also the GPU quota classes (doc/source/quotas.rst).
        keys+=(--quota)
        shift
    fi
    for spec in "$@"; do
        props+=(--property "$spec")
        keys+=(--property "$spec")
    done
    while read -r key value; do
        [[ -n "$key" ]] && props+=(--property "$key=$value")
    done < <(os_admin gpu flavor keys "${keys[@]}" -f value)
    os_admin flavor create --vcpus 1 --ram 512 --disk 1 "${props[@]}" \
        "$name" -f value -c id >/dev/null
}

# boot NAME FLAVOR: create as the demo user and wait; prints the server's id.
boot() {
    os_user server create --flavor "$2" --image "$IMAGE" --nic none \
        --wait "$1" -f value -c id
}

# refused_with SERVER WHAT PATTERN SINCE: SERVER (name or id) ended with
# NoValidHost and devstack@n-sch's journal since SINCE has the plugin's
# reason matching PATTERN (grep -o, to the end of the quoted message).
refused_with() {
    local fault reason
    fault=$(os_user server show "$1" -f value -c fault 2>/dev/null || true)
    reason=$(journalctl -u devstack@n-sch --since "$4" --no-pager -o cat |
        grep -m1 -o "$3[^\"]*" || true)
    if grep -q "No valid host" <<< "$fault" && [[ -n "$reason" ]]; then
        pass "$2: NoValidHost; devstack@n-sch: ${reason:0:200}"
    else
        fail "$2: fault '$(cut -c1-100 <<< "$fault")', reason in n-sch: '$reason'"
    fi
}

# finish NAME: the summary line and the exit status of a check script.
finish() {
    if [[ $FAILED == 0 ]]; then
        echo "$1: all checks passed"
    else
        echo "$1: some checks FAILED"
    fi
    exit "$FAILED"
}
