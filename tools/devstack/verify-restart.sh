#!/bin/bash
# The restart checks of tools/devstack-check.sh (issue 24, item 5), run in
# the container as devstack's user after verify-gpu.sh: for each unit
# (nova-gpu-scheduler as devstack@n-sch, the cell conductor, the fake
# vf-mdev host's nova-compute and its nova-gpu-agent, RabbitMQ) the demo
# user boots a server of the vf-mdev flavor and the unit is restarted while
# it builds. Then:
#   - the server reaches ACTIVE (or, where its own compute restarted, the
#     ERROR Nova gives a build its compute dropped), never stays in BUILD
#     (except Nova's own end of a build whose call to the restarted
#     conductor was lost: BUILD with no task, the compute having reverted
#     it; noted, not failed);
#   - no report is lost: a report of the host the agent took after the
#     restart reaches nova-gpu-scheduler (its journal), and the scheduler
#     dropped none;
#   - once the server is deleted, no allocation of it is left and every GPU
#     provider of the host is unused again in Placement, and the agent's
#     report lists no device of it.
# Prints what it restarted and one PASS/FAIL line per check.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tools/devstack/verify-lib.sh
source "$HERE/verify-lib.sh"

PATH_UNDER_TEST=vf-mdev
HOST=$(hostname -s)-$PATH_UNDER_TEST
FLAVOR=devstack-check-$PATH_UNDER_TEST
UNITS=(devstack@n-sch devstack@n-cond-cell1 "devstack@n-gpu-fake-$PATH_UNDER_TEST"
       "devstack@nova-gpu-agent-fake-$PATH_UNDER_TEST" rabbitmq-server)

systemctl is-active --quiet "devstack@n-gpu-fake-$PATH_UNDER_TEST" || {
    fail "no fake $PATH_UNDER_TEST host (NOVA_GPU_FAKE_HARDWARE is off)"
    finish verify-restart
}
ensure_image
gpu_flavor "$FLAVOR" gpu:profile=A100-10C

# gpu_usage: the GPU resources in use on the host's providers, "RC=N"
# each, in Placement.
gpu_usage() {
    local root
    root=$(os_admin resource provider list --name "$HOST" -f value -c uuid)
    os_admin resource provider list --in-tree "$root" -f value -c uuid |
        while read -r rp; do
            os_admin resource provider usage show "$rp" -f value
        done | awk '($1 == "VGPU" || $1 ~ /^CUSTOM_NVIDIA/) && $2 != 0 {print $1 "=" $2}'
}

# ingested_since TIME: report lines of the host in nova-gpu-scheduler's
# journal since TIME.
ingested_since() {
    journalctl -u devstack@n-sch --since "$1" --no-pager -o cat |
        grep -c "GPU report .* of $HOST ingested" || true
}

# held_by SERVER: devices the host's latest report lists for the server.
held_by() {
    os_admin gpu host show "$HOST" -f json 2>/dev/null | json "
n = 0
def walk(x):
    global n
    if isinstance(x, dict):
        if x.get('instance') == '$1':
            n += 1
        for v in x.values():
            walk(v)
    elif isinstance(x, list):
        for v in x:
            walk(v)
walk(d)
print(n)" 2>/dev/null || echo "?"
}

in_use=$(gpu_usage)
if [[ -z "$in_use" ]]; then
    pass "before: no GPU of $HOST in use in Placement"
else
    fail "before: GPUs of $HOST in use: $in_use"
fi

for unit in "${UNITS[@]}"; do
    short=${unit#devstack@}
    name=devstack-check-restart-$short
    echo "--- restart $unit while $name ($FLAVOR) builds"
    os_user server delete --wait "$name" >/dev/null 2>&1 || true
    since=$(date '+%F %T')
    start=$SECONDS
    id=$(os_user server create --flavor "$FLAVOR" --image "$IMAGE" --nic none \
        "$name" -f value -c id)
    # At once: a build on a fake host takes about 10 s.
    restart_start=$SECONDS
    restart_epoch=$(date +%s)
    sudo systemctl restart "$unit"
    # (A server already ACTIVE here was built before the restart took
    # effect: the report says so.)
    echo "restarted $unit ($(( SECONDS - restart_start )) s, $(( SECONDS - start )) s after the create; server $id then $(os_user server show "$id" -f value -c status)/$(os_admin server show "$id" -f value -c OS-EXT-STS:task_state))"
    # shellcheck disable=SC2317  # called through wait_until
    settled() {
        status=$(os_user server show "$id" -f value -c status 2>/dev/null || echo "?")
        [[ $status == ACTIVE || $status == ERROR ]]
    }
    if ! wait_until 300 settled; then
        task=$(os_admin server show "$id" -f value -c OS-EXT-STS:task_state 2>/dev/null || true)
        reverted=$(journalctl -u "devstack@n-gpu-fake-$PATH_UNDER_TEST" --since "@$restart_epoch" \
            --no-pager -o cat | grep -m1 "instance: $id\] Successfully reverted task state" || true)
        if [[ $unit == devstack@n-cond-cell1 && $task == None && -n $reverted ]]; then
            # Nova's own end, not the plugin's: the compute's call to the
            # conductor was lost in its restart; after rpc_response_timeout
            # the compute reverted the task state, and Nova leaves the
            # server in BUILD. What must hold (no allocation, no device
            # left) is checked below.
            echo "NOTE $unit: server $id stays BUILD with no task: Nova's end for a build whose call to the restarted conductor was lost (the compute: '${reverted:0:120}')"
        else
            fail "$unit: server $id still $status (task $task) 300 s after the restart"
        fi
    elif [[ $status == ACTIVE ]]; then
        pass "$unit: server $id ACTIVE $(( SECONDS - start )) s after its create, through the restart"
    elif [[ $unit == "devstack@n-gpu-fake-$PATH_UNDER_TEST" ]]; then
        pass "$unit: server $id ERROR (Nova's end for a build its compute dropped: $(os_admin server show "$id" -f value -c fault | cut -c1-120))"
    elif [[ $unit == rabbitmq-server ]] &&
            os_admin server show "$id" -f value -c fault | grep -q "Exceeded maximum number of retries"; then
        # Nova's own end: the build failed on its compute while the broker
        # was away, and the one host of this path leaves no alternate to
        # reschedule to (run 6). What must hold is checked below.
        echo "NOTE $unit: server $id ERROR: Nova's end for a build that failed on its compute while the broker restarted, with no alternate host left"
    else
        fail "$unit: server $id ERROR: $(os_admin server show "$id" -f value -c fault | cut -c1-200)"
    fi
    # No report lost: the agent's reports flow into the scheduler again.
    # shellcheck disable=SC2317  # called through wait_until
    fresh() { [[ $(ingested_since "@$restart_epoch") -gt 0 ]]; }
    if wait_until 120 fresh; then
        pass "$unit: reports of $HOST reach nova-gpu-scheduler after the restart ($(ingested_since "$since") since the create)"
    else
        fail "$unit: no report of $HOST ingested in 120 s after the restart"
    fi
    dropped=$(journalctl -u devstack@n-sch --since "$since" --no-pager -o cat |
        grep -c "Dropping GPU report" || true)
    if [[ $dropped == 0 ]]; then
        pass "$unit: nova-gpu-scheduler dropped no report"
    else
        fail "$unit: nova-gpu-scheduler dropped $dropped reports"
    fi
    os_user server delete --wait "$id" || fail "$unit: delete of $id failed"
    # nova-compute removes the allocation after the server is gone from
    # the API (a run saw it still there right after "delete --wait", gone
    # within a minute).
    # shellcheck disable=SC2317  # called through wait_until
    no_allocation() {
        left=$(os_admin resource provider allocation show "$id" -f value 2>/dev/null || true)
        [[ -z "$left" ]]
    }
    delete_end=$SECONDS
    if wait_until 120 no_allocation; then
        pass "$unit: no allocation of $id left ($(( SECONDS - delete_end )) s after the delete)"
    else
        fail "$unit: allocation of deleted $id left 120 s after the delete: $left"
    fi
    # shellcheck disable=SC2317  # called through wait_until
    unused() { in_use=$(gpu_usage); [[ -z "$in_use" ]]; }
    if wait_until 60 unused; then
        pass "$unit: every GPU provider of $HOST unused again"
    else
        fail "$unit: GPUs of $HOST still in use: $in_use"
    fi
    # shellcheck disable=SC2317  # called through wait_until
    released() { [[ $(held_by "$id") == 0 ]]; }
    if wait_until 60 released; then
        pass "$unit: the agent's report lists no device of $id"
    else
        fail "$unit: the agent's report still lists $(held_by "$id") devices of $id"
    fi
done

finish verify-restart
