#!/bin/bash
# The checks of tools/devstack-check.sh, run in the container as devstack's
# user after stack.sh: the services are the systemd units devstack and the
# plugin made, and a plain server boots through the real openstack CLI
# with the credentials devstack wrote (/etc/openstack/clouds.yaml).
# Prints one PASS/FAIL line per check; exits 1 if any failed.
set -euo pipefail

NAME=devstack-check-plain
# shellcheck source=tools/devstack/verify-lib.sh
source "$(dirname "$0")/verify-lib.sh"

echo "--- units"
for unit in devstack@keystone devstack@g-api devstack@placement-api \
        devstack@n-api devstack@n-super-cond devstack@n-cond-cell1 \
        devstack@n-sch devstack@n-cpu devstack@neutron-api \
        devstack@neutron-rpc-server devstack@neutron-periodic-workers \
        devstack@nova-gpu-agent devstack@nova-gpu-exporter \
        devstack@nova-gpu-reclaimer devstack@nova-gpu-defrag \
        rabbitmq-server; do
    state=$(systemctl is-active "$unit" || true)
    if [[ $state == active ]]; then
        pass "$unit active (since $(systemctl show -p ActiveEnterTimestamp --value "$unit"))"
    else
        fail "$unit is '$state'"
        journalctl -u "$unit" --no-pager -n 15 || true
    fi
done
# Debian's MySQL is MariaDB; devstack starts it as mariadb (alias mysql).
if systemctl is-active --quiet mariadb || systemctl is-active --quiet mysql; then
    pass "MySQL (MariaDB) active"
else
    fail "MySQL (MariaDB) not active"
fi
exec_start=$(systemctl show -p ExecStart --value devstack@n-api)
if [[ $exec_start == *uwsgi* ]]; then
    pass "nova-api runs under uwsgi"
else
    fail "nova-api is not uwsgi: $exec_start"
fi
# Nova 34's default native threading. Its "Service is starting with
# native threading." comes before logging is set up and is lost; what the
# journal shows is oslo.service's threading backend at work
# (oslo_service.backend._threading), and no "Eventlet based service
# backend" line. nova-api under uwsgi logs neither: only the latter is
# checked there.
for unit in devstack@n-sch devstack@n-super-cond devstack@n-cond-cell1 \
        devstack@n-cpu devstack@n-api; do
    journal=$(journalctl -u "$unit" --no-pager -o cat \
        --since "$(systemctl show -p ActiveEnterTimestamp --value "$unit")")
    threading=$(grep -c 'backend._threading' <<< "$journal" || true)
    eventlet=$(grep -c 'Eventlet based service backend' <<< "$journal" || true)
    if [[ $eventlet != 0 ]]; then
        fail "$unit: started with eventlet"
    elif [[ $threading != 0 ]]; then
        pass "$unit: native threading ($threading lines of oslo.service's threading backend)"
    elif [[ $unit == devstack@n-api ]]; then
        pass "$unit: no eventlet backend line (uwsgi; nova-api logs no backend line)"
    else
        fail "$unit: no line of either backend in its journal"
    fi
done

# The plugin runs devstack's n-sch as nova-gpu-scheduler (Nova's scheduler
# main with nova-gpu's manager), which starts the GPU report listener.
if systemctl cat devstack@n-sch 2>/dev/null | grep -q '^ExecStart.*nova-gpu-scheduler '; then
    pass "devstack@n-sch runs nova-gpu-scheduler"
else
    fail "devstack@n-sch does not run nova-gpu-scheduler"
fi
# (The journal read whole: grep -q closing the pipe early fails it under
# pipefail, as it did once the fake hosts' reports filled the journal.)
sched_journal=$(journalctl -u devstack@n-sch --no-pager -o cat)
if grep -q 'Listening for GPU reports' <<< "$sched_journal"; then
    pass "nova-gpu-scheduler listens for GPU reports"
else
    fail "nova-gpu-scheduler's journal has no 'Listening for GPU reports'"
fi

echo "--- configuration the plugin wrote"
nova_conf=/etc/nova/nova.conf
filters=$(crudini --get "$nova_conf" filter_scheduler enabled_filters 2>/dev/null ||
    sed -n 's/^enabled_filters *= *//p' "$nova_conf")
weighers=$(sed -n 's/^weight_classes *= *//p' "$nova_conf")
check "GpuFilter enabled ($filters)" grep -q GpuFilter <<< "$filters"
check "GPU weighers enabled ($weighers)" grep -q GpuFragmentationWeigher <<< "$weighers"

echo "--- a plain server through the openstack CLI"
ensure_image
# On the real libvirt/QEMU compute, this host: with the fake-hardware
# hosts in the cloud the scheduler may pick any of them for m1.tiny, so
# the admin names the host (compute API 2.74); the server is the admin's.
os_plain() { os_admin --os-compute-api-version 2.74 "$@"; }
os_plain server delete --wait "$NAME" >/dev/null 2>&1 || true
# nova-compute disables itself for a few seconds when libvirtd restarts
# (COMPUTE_STATUS_DISABLED on its provider): wait until Placement offers
# the flavor's resources on an enabled host, as the scheduler will ask.
ready=0
for _ in $(seq 1 60); do
    if os_admin --os-placement-api-version 1.39 allocation candidate list \
            --resource VCPU=1 --resource MEMORY_MB=512 --resource DISK_GB=1 \
            --forbidden COMPUTE_STATUS_DISABLED -f value -c "resource provider" \
            2>/dev/null | grep -q .; then
        ready=1
        break
    fi
    sleep 2
done
[[ $ready == 1 ]] || fail "Placement offers no enabled host for m1.tiny after 120 s"
start=$(date +%s)
if os_plain server create --host "$(hostname)" --flavor m1.tiny --image "$IMAGE" --nic none \
        --wait "$NAME" -f value -c id >/tmp/$NAME.id; then
    status=$(os_plain server show "$NAME" -f value -c status || true)
    elapsed=$(( $(date +%s) - start ))
    if [[ $status == ACTIVE ]]; then
        pass "server $NAME ACTIVE in ${elapsed} s"
    else
        fail "server $NAME is $status after ${elapsed} s"
    fi
else
    fail "openstack server create failed"
    os_plain server show "$NAME" -f yaml -c status -c fault || true
fi
server_id=$(cat /tmp/$NAME.id 2>/dev/null || true)
if [[ -n "$server_id" ]]; then
    # By id: the admin's project is not the demo user's.
    host=$(os_admin server show "$server_id" -f value -c OS-EXT-SRV-ATTR:hypervisor_hostname || true)
    domain=$(os_admin server show "$server_id" -f value -c OS-EXT-SRV-ATTR:instance_name || true)
    echo "server $server_id on $host, libvirt domain $domain"
    # Asked again for a while: on a loaded machine virsh can time out
    # (run 5: "not running" for a domain nova-compute had just started).
    # shellcheck disable=SC2317  # called through wait_until
    domain_running() {
        # shellcheck disable=SC2024  # the stack user's file
        sudo virsh -c qemu:///system domstate "$domain" >/tmp/domstate.out 2>&1 &&
            grep -q running /tmp/domstate.out
    }
    if [[ -n "$domain" ]] && wait_until 30 domain_running; then
        pass "libvirt domain $domain running ($(sudo virsh -c qemu:///system dumpxml "$domain" | grep -o -m1 "<domain type='[a-z]*'"))"
    else
        fail "libvirt domain '$domain' not running (virsh domstate: $(cat /tmp/domstate.out 2>/dev/null))"
    fi
    if os_admin resource provider allocation show "$server_id" -f value >/tmp/$NAME.alloc 2>&1; then
        pass "Placement allocation: $(tr '\n' ' ' < /tmp/$NAME.alloc)"
    else
        fail "no Placement allocation for $server_id: $(cat /tmp/$NAME.alloc)"
    fi
    # The filter and the weighing ran for this request (devstack logs at
    # debug). Nova's "Weighed [...]" line names no weigher; the GPU
    # weighers are in weight_classes, and nova-scheduler does not start
    # with a class it cannot load.
    since=$(date -d "@$start" '+%F %T')
    sched=$(journalctl -u devstack@n-sch --since "$since" --no-pager -o cat)
    if grep -q "Filter GpuFilter returned 1 host(s)" <<< "$sched"; then
        pass "nova-scheduler: 'Filter GpuFilter returned 1 host(s)' for this boot"
    else
        fail "nova-scheduler log has no GpuFilter line for this boot"
    fi
    if grep -q "Weighed \[WeighedHost" <<< "$sched"; then
        pass "nova-scheduler weighed the host for this boot ($(grep -o -m1 'weight: [0-9.]*' <<< "$sched"))"
    else
        fail "nova-scheduler log has no Weighed line for this boot"
    fi
fi

echo "--- the plugin's commands and services"
# The agent reports every [gpu_agent] reconcile_interval (60 s) over
# devstack's RabbitMQ; the exporter lists a host once a report arrived.
listed=0
for _ in $(seq 1 45); do
    if os_admin gpu host list -f value -c Host 2>/dev/null | grep -qx "$(hostname)"; then
        listed=1
        break
    fi
    sleep 4
done
if os_admin gpu host list >/tmp/gpu-host-list.out 2>&1; then
    pass "openstack gpu host list answers"
else
    fail "openstack gpu host list failed"
fi
cat /tmp/gpu-host-list.out
if [[ $listed == 1 ]]; then
    pass "the agent's report of $(hostname) reached the exporter (gpu host list)"
else
    fail "no report of $(hostname) in openstack gpu host list after 180 s"
fi
if os_admin gpu capacity >/tmp/gpu-capacity.out 2>&1; then
    pass "openstack gpu capacity answers"
else
    fail "openstack gpu capacity failed"
fi
cat /tmp/gpu-capacity.out
if curl -sf http://127.0.0.1:9836/metrics >/tmp/exporter.metrics; then
    pass "nova-gpu-exporter serves /metrics ($(grep -c '^nova_gpu' /tmp/exporter.metrics) nova_gpu samples)"
else
    fail "nova-gpu-exporter /metrics does not answer"
fi

if [[ -n "$server_id" ]]; then
    start=$(date +%s)
    if os_plain server delete --wait "$NAME"; then
        pass "server deleted in $(( $(date +%s) - start )) s"
    else
        fail "server delete failed"
    fi
fi

finish verify
