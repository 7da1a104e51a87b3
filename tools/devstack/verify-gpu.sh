#!/bin/bash
# The GPU checks of tools/devstack-check.sh (issue 24, item 4), run in the
# container as devstack's user after verify.sh, on the plugin's
# fake-hardware hosts (NOVA_GPU_FAKE_HARDWARE): with devstack's
# credentials and the real openstack CLI,
#   - each fake host's units run and its agent's report reached the cloud;
#   - a flavor of each path boots ACTIVE as the demo user, on its host,
#     its Placement allocation on a GPU provider, and that GPU (openstack
#     gpu server show) is the one nova-gpu-scheduler ranked first (its
#     gpu.placement.decided notification, recorded by placements.py);
#   - a bad gpu: spec is refused with 400 naming the key;
#   - GPU quotas: with Keystone's unified limits a whole-H200 flavor asking
#     its quota class boots once within a limit of 1, is refused by Nova
#     (403 naming the class) the second time, and boots with the demo
#     project's limit raised to 2;
#   - openstack gpu capacity says how many spot servers fit, and exactly
#     that many boot; one more (on-demand) gets NoValidHost with the
#     plugin's reason in devstack@n-sch's journal; nova-gpu-reclaimer
#     evicts a spot server for it and it boots;
#   - HGX (the hgx host: Fabric Manager faked at its fmpm command): 2-GPU
#     servers get one NVSwitch partition each, activated while they run,
#     the second in the 4-GPU half the first broke; a 4-GPU server gets
#     the half kept free; a size no partition has is refused with the
#     reason; a gpu:rdma server's NIC VF hangs below its GPU's PCIe switch;
#   - mixed-size vGPUs (the mixed-size host, an L40S NVML shows in
#     mixed-size mode): an L40S-24C and an L40S-8C on one GPU, their VFs
#     typed by the qemu hook; a second L40S-24C refused with the reason;
#     another L40S-8C fits;
#   - Prometheus (Debian's) scrapes nova-gpu-exporter with the shipped
#     rules (etc/prometheus), which promtool checks and tests.
# Prints one PASS/FAIL line per check; exits 1 if any failed.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tools/devstack/verify-lib.sh
source "$HERE/verify-lib.sh"

PLUGIN_DIR=/opt/stack/nova-gpu
PREFIX=$(hostname -s)
RECORD=/tmp/devstack-check-placements.jsonl
# The gpu: keys of each path's flavor: the hosts of
# nova_gpu.tests.harness.fake_compute (T4, A100, A100 in MIG mode, H100
# vendor-VFIO, H200 whole).
declare -A SPECS=(
    [pf-mdev]="gpu:profile=T4-8C"
    [vf-mdev]="gpu:profile=A100-10C"
    [mig-vgpu]="gpu:profile=A100-2-10C"
    [vendor-vfio]="gpu:profile=H100-20C gpu:backend=vfio"
    [whole-gpu]="gpu:kind=whole gpu:model=H200-141GB"
    [hgx]="gpu:kind=whole gpu:model=H100-80GB gpu:rdma=true"
    [mixed-size]="gpu:profile=L40S-24C gpu:backend=vfio"
)
FAKE_DIR=/opt/stack/data/nova-gpu/fake
mapfile -t PATHS < <(systemctl list-units --all --no-legend --plain \
    'devstack@n-gpu-fake-*' | awk '{print $1}' |
    sed -n 's/^devstack@n-gpu-fake-\(.*\)\.service$/\1/p')

# describe PATH: the fake host of PATH, as its launcher describes it (JSON).
describe() {
    "$VENV_BIN/python3" -m nova_gpu.tests.harness.fake_compute describe \
        "$1" "$PREFIX-$1" --dir "$FAKE_DIR/$1" 2>/dev/null
}

# gpu_of SERVER: the GPU indices of the server's devices (openstack gpu
# server show, from its Placement allocation and the exporter).
gpu_of() {
    os_admin gpu server show "$1" -f json |
        json "print(' '.join(sorted({str(d['gpu']) for d in d['GPU Devices'] if d.get('gpu') is not None})))"
}

# ranked_of SERVER: the GPUs nova-gpu-scheduler ranked first for it.
ranked_of() {
    python3 - "$1" "$RECORD" <<'PY'
import json, sys
server, path = sys.argv[1:]
found = ''
for line in open(path):
    event = json.loads(line)
    if (event['event_type'] == 'gpu.placement.decided'
            and event.get('instance_uuid') == server):
        found = ' '.join(sorted(str(g) for g in event['gpus'])) + \
            ' on ' + event['host']
print(found)
PY
}

# gpu_allocation SERVER: "RC=N on PROVIDER" of its GPU allocation.
gpu_allocation() {
    local rp rc
    os_admin resource provider allocation show "$1" -f json >/tmp/alloc.json
    read -r rp rc < <(json "
for a in d:
    for rc, n in a['resources'].items():
        if rc == 'VGPU' or rc.startswith('CUSTOM_NVIDIA'):
            print(a['resource_provider'], '%s=%s' % (rc, n))" </tmp/alloc.json) || true
    [[ -n "${rp:-}" ]] || return 1
    echo "$rc on $(os_admin resource provider show "$rp" -f value -c name)"
}

echo "--- the fake GPU hosts (${PATHS[*]:-none})"
[[ ${#PATHS[@]} -gt 0 ]] || fail "no devstack@n-gpu-fake-* unit: NOVA_GPU_FAKE_HARDWARE is off"
for path in "${PATHS[@]}"; do
    for unit in "devstack@n-gpu-fake-$path" "devstack@nova-gpu-agent-fake-$path"; do
        state=$(systemctl is-active "$unit" || true)
        if [[ $state == active ]]; then
            pass "$unit active"
        else
            fail "$unit is '$state'"
            journalctl -u "$unit" --no-pager -n 20 || true
        fi
    done
done
for path in "${PATHS[@]}"; do
    host=$PREFIX-$path
    count=$(describe "$path" | json "print(len(d['gpus']))" || echo "?")
    if wait_until 180 bash -c "openstack --os-cloud $ADMIN_CLOUD gpu host list -f value -c Host -c GPUs | grep -qx '$host $count'"; then
        pass "$host: its agent's report ($count GPUs) reached the exporter over RabbitMQ"
    else
        fail "$host: no report with $count GPUs in openstack gpu host list after 180 s"
    fi
    if os_admin hypervisor list -f value -c "Hypervisor Hostname" | grep -qx "$host"; then
        pass "$host: nova-compute registered and mapped (hypervisor list)"
    else
        fail "$host: not in openstack hypervisor list"
    fi
done
# (Read whole: grep -q closing the pipe early fails it under pipefail.)
ingested=$(journalctl -u devstack@n-sch --no-pager -o cat |
    grep -c "GPU report .* of $PREFIX-.* ingested (2 GPUs)" || true)
if [[ $ingested -gt 0 ]]; then
    pass "nova-gpu-scheduler ingested the fake hosts' reports ($ingested lines 'GPU report ... of $PREFIX-... ingested (2 GPUs)')"
else
    fail "devstack@n-sch's journal has no 'GPU report ... ingested (2 GPUs)' of the fake hosts"
fi

# The scheduler's decisions, as they are sent.
: > "$RECORD"
"$VENV_BIN/python3" "$HERE/placements.py" /etc/nova/nova.conf "$RECORD" \
    >/tmp/placements.log 2>&1 &
RECORDER=$!
trap 'kill $RECORDER 2>/dev/null || true' EXIT
wait_until 30 grep -q recording /tmp/placements.log ||
    fail "placements.py did not start: $(tail -3 /tmp/placements.log)"

ensure_image
echo "--- capacity, NoValidHost, the reclaimer"
gpu_flavor devstack-check-spot gpu:profile=T4-8C gpu:preemptible=true
gpu_flavor devstack-check-pf-mdev gpu:profile=T4-8C
os_user gpu host list || fail "openstack gpu host list (demo user) failed"
# First, on the T4 host as it started: its agent cannot see the fake
# libvirt's guests (inside the fake nova-compute), so an mdev a deleted
# server left (Nova keeps them for the next guest) would count as used.
capacity=$(os_user gpu capacity --flavor devstack-check-spot -f value -c Servers | head -1)
os_user gpu capacity --flavor devstack-check-spot || true
spot=()
for n in $(seq 1 "${capacity:-0}"); do
    if id=$(boot "devstack-check-spot-$n" devstack-check-spot); then
        spot+=("$id")
    else
        fail "spot server $n of $capacity did not boot"
    fi
done
if [[ ${capacity:-0} -gt 0 && ${#spot[@]} == "$capacity" ]]; then
    pass "openstack gpu capacity --flavor devstack-check-spot: $capacity servers; $capacity booted ACTIVE"
else
    fail "capacity said ${capacity:-nothing}, ${#spot[@]} booted"
fi
since=$(date '+%F %T')
start=$SECONDS
if id=$(boot devstack-check-ondemand devstack-check-pf-mdev 2>/tmp/ondemand.err); then
    fail "the on-demand server booted although the capacity was used up (${capacity:-?} spot servers)"
else
    fault=$(os_user server show devstack-check-ondemand -f value -c fault 2>/dev/null || true)
    id=$(os_user server show devstack-check-ondemand -f value -c id)
    if grep -q "No valid host" <<< "$fault"; then
        pass "on-demand server $id: NoValidHost ($(cut -c1-80 <<< "$fault"))"
    else
        fail "on-demand server $id failed without NoValidHost: $fault $(cat /tmp/ondemand.err)"
    fi
    reason=$(journalctl -u devstack@n-sch --since "$since" --no-pager -o cat |
        grep -m1 "GpuFilter: no host can serve the GPU request of instance $id" || true)
    if [[ -n "$reason" ]]; then
        pass "devstack@n-sch: ${reason:0:300}"
    else
        fail "devstack@n-sch's journal has no GpuFilter reason for $id"
    fi
fi
# nova-gpu-reclaimer saw the refusal (Nova's versioned notification) and
# evicts (deletes, NOVA_GPU_RECLAIM_ACTION) a spot server.
evicted=""
# shellcheck disable=SC2317  # called through wait_until
left() {
    local s
    for s in "${spot[@]}"; do
        os_admin server show "$s" >/dev/null 2>&1 || { evicted=$s; return 0; }
    done
    return 1
}
if wait_until 240 left; then
    pass "nova-gpu-reclaimer evicted spot server $evicted $(( SECONDS - start )) s after the refusal"
    journalctl -u devstack@nova-gpu-reclaimer --since "$since" --no-pager -o cat |
        grep -i -m5 "evict\|reclaim\|room" || true
    # The owner boots again when told there is room (gpu.reclaim.room,
    # sent once the host's agent reported the eviction).
    # shellcheck disable=SC2317  # called through wait_until
    room_told() {
        journalctl -u devstack@nova-gpu-reclaimer --since "$since" --no-pager -o cat |
            grep -q "Room made on .* for instance $id"
    }
    if wait_until 120 room_told; then
        pass "nova-gpu-reclaimer told the owner of $id there is room ($(( SECONDS - start )) s after the refusal)"
    else
        fail "nova-gpu-reclaimer did not tell the owner of $id there is room"
    fi
    os_user server delete --wait devstack-check-ondemand >/dev/null 2>&1 || true
    start=$SECONDS
    if id=$(boot devstack-check-ondemand devstack-check-pf-mdev); then
        pass "the on-demand server booted ACTIVE in the room made ($(( SECONDS - start )) s)"
    else
        fail "the on-demand server did not boot after the eviction"
    fi
else
    fail "no spot server evicted 240 s after the refusal"
    journalctl -u devstack@nova-gpu-reclaimer --since "$since" --no-pager -n 30 -o cat || true
fi
for s in "${spot[@]}" devstack-check-ondemand; do
    os_user server delete --wait "$s" >/dev/null 2>&1 || true
done

echo "--- a flavor of each path, booted by the demo user"
declare -A SERVERS=()
for path in "${PATHS[@]}"; do
    flavor=devstack-check-$path
    # shellcheck disable=SC2086  # the spec's keys, separated by blanks
    gpu_flavor "$flavor" ${SPECS[$path]}
    name=devstack-check-$path
    os_user server delete --wait "$name" >/dev/null 2>&1 || true
    start=$SECONDS
    if ! id=$(boot "$name" "$flavor"); then
        fail "$path: openstack server create --flavor $flavor failed"
        os_admin server show "$name" -f value -c fault 2>/dev/null || true
        continue
    fi
    SERVERS[$path]=$id
    status=$(os_user server show "$id" -f value -c status)
    host=$(os_admin server show "$id" -f value -c OS-EXT-SRV-ATTR:host)
    if [[ $status == ACTIVE && $host == "$PREFIX-$path" ]]; then
        pass "$path: $name ($flavor: ${SPECS[$path]}) ACTIVE on $host in $(( SECONDS - start )) s"
    else
        fail "$path: $name is $status on '$host' (wanted ACTIVE on $PREFIX-$path)"
    fi
    if allocation=$(gpu_allocation "$id"); then
        pass "$path: Placement allocation $allocation"
    else
        fail "$path: no GPU in the Placement allocation of $id ($(cat /tmp/alloc.json))"
    fi
    gpus=$(gpu_of "$id" || true)
    ranked=""
    wait_until 30 bash -c "[[ -n \"\$(grep -s '$id' '$RECORD')\" ]]" || true
    ranked=$(ranked_of "$id")
    if [[ -n "$gpus" && "$gpus on $host" == "$ranked" ]]; then
        pass "$path: its device is on GPU $gpus of $host (openstack gpu server show), the GPU nova-gpu-scheduler ranked first (gpu.placement.decided: $ranked)"
    else
        fail "$path: device on GPU '$gpus' of $host, the plugin ranked '$ranked' first"
    fi
done
if os_admin gpu server show "${SERVERS[vf-mdev]:-none}" >/tmp/gpu-server-show.out 2>&1; then
    pass "openstack gpu server show answers"
    cat /tmp/gpu-server-show.out
else
    fail "openstack gpu server show failed: $(cat /tmp/gpu-server-show.out)"
fi
for path in "${!SERVERS[@]}"; do
    os_user server delete --wait "${SERVERS[$path]}" || fail "$path: delete failed"
done

if [[ " ${PATHS[*]} " == *" hgx "* ]]; then
    # shellcheck source=tools/devstack/verify-hgx.sh
    source "$HERE/verify-hgx.sh"
fi
if [[ " ${PATHS[*]} " == *" mixed-size "* ]]; then
    # shellcheck source=tools/devstack/verify-mixed-size.sh
    source "$HERE/verify-mixed-size.sh"
fi

echo "--- a bad gpu: spec"
# Nova validates extra specs from compute API microversion 2.86 on (the
# openstack CLI's default, 2.1, stores anything), and "flavor create
# --property" did not report the refusal: the flavor is created, then
# "flavor set --property" at 2.86 (the first runs of this check found
# every bad spec accepted).
os_admin flavor show devstack-check-bad >/dev/null 2>&1 ||
    os_admin flavor create --vcpus 1 --ram 512 --disk 1 devstack-check-bad \
        -f value -c id >/dev/null
for spec in gpu:profile=NO-SUCH-8C gpu:profle=T4-8C gpu:count=many; do
    key=${spec%%=*}
    if out=$(os_admin --os-compute-api-version 2.86 flavor set \
            --property "$spec" devstack-check-bad 2>&1) &&
            ! grep -q "Failed" <<< "$out"; then
        fail "$spec accepted"
    elif grep -q "400" <<< "$out" && grep -qF "$key" <<< "$out"; then
        pass "$spec refused: $(grep -o 'BadRequest.*' <<< "$out" | sed 's/for url: [^ ]* //' | cut -c1-220)"
    else
        fail "$spec refused, but not with 400 naming $key: $out"
    fi
done
stored=$(os_admin flavor show devstack-check-bad -f value -c properties)
if [[ $stored == *gpu:* ]]; then
    fail "a bad spec was stored: $stored"
else
    pass "no bad spec stored on devstack-check-bad ($stored)"
fi
os_admin flavor delete devstack-check-bad >/dev/null 2>&1 || true

echo "--- GPU quotas: Nova's unified limits on Keystone's registered limits"
# devstack's NOVA_USE_UNIFIED_LIMITS (Nova's UnifiedLimitsDriver, limits in
# Keystone) and the plugin's NOVA_GPU_QUOTA_INVENTORY (the agents offer the
# quota classes): a whole-H200 flavor asking its class, a registered limit
# of 1 whole H200 per project, then a project limit of 2 for the demo
# project (doc/source/quotas.rst, as an operator does it).
os_system() { openstack --os-cloud devstack-system-admin "$@"; }
QUOTA_CLASS=CUSTOM_GPU_QUOTA_H200_141GB_WHOLE
QUOTA_HOST=$PREFIX-whole-gpu
region=$(os_admin region list -f value -c Region | head -1)
quota_rp=$(os_admin resource provider list --name "$QUOTA_HOST" -f value -c uuid || true)
if ! os_system registered limit list -f value -c "Resource Name" 2>/dev/null | grep -qx servers; then
    fail "no registered limit for servers in Keystone: NOVA_USE_UNIFIED_LIMITS is off, quotas not checked"
elif [[ -z "$quota_rp" ]]; then
    fail "no resource provider $QUOTA_HOST (the fake whole-gpu host)"
elif ! total=$(os_admin resource provider inventory show "$quota_rp" "$QUOTA_CLASS" -f value -c total 2>/dev/null); then
    fail "$QUOTA_HOST offers no $QUOTA_CLASS (NOVA_GPU_QUOTA_INVENTORY off?): $(os_admin resource provider inventory list "$quota_rp" -f value -c resource_class | tr '\n' ' ')"
else
    pass "$QUOTA_HOST offers $QUOTA_CLASS=$total on its root provider (nova-gpu-agent's provider config)"
    # The commands openstack gpu quota limits prints, run as the system admin.
    mapfile -t cmds < <(os_admin gpu quota limits --model H200-141GB --kind whole \
        --default-limit 1 --region "$region" -c Command -f value | grep "class:$QUOTA_CLASS\$")
    for cmd in "${cmds[@]}"; do
        # shellcheck disable=SC2086  # the printed command's words
        os_system ${cmd#openstack } -f value -c id >/dev/null ||
            os_system registered limit list --resource-name "class:$QUOTA_CLASS" -f value -c id | grep -q . ||
            fail "$cmd failed"
    done
    gpu_flavor devstack-check-quota-h200 --quota gpu:kind=whole gpu:model=H200-141GB
    quota_keys=$(os_admin flavor show devstack-check-quota-h200 -f json -c properties |
        json "print(' '.join(k for k in d['properties'] if 'GPU_QUOTA' in k))")
    if [[ $quota_keys == *"$QUOTA_CLASS"* ]]; then
        pass "flavor devstack-check-quota-h200 asks $quota_keys"
    else
        fail "flavor devstack-check-quota-h200 asks no $QUOTA_CLASS ($quota_keys)"
    fi
    delete_quota_servers() {
        local name
        for name in devstack-check-quota-1 devstack-check-quota-2; do
            os_user server delete --wait "$name" >/dev/null 2>&1 || true
        done
    }
    delete_quota_servers
    if id=$(boot devstack-check-quota-1 devstack-check-quota-h200); then
        pass "one whole H200 within the limit of 1: $id ACTIVE"
    else
        fail "the first whole-H200 server did not boot within its limit"
    fi
    if out=$(os_user server create --flavor devstack-check-quota-h200 --image "$IMAGE" \
            --nic none devstack-check-quota-2 2>&1); then
        fail "a second whole H200 was accepted over the limit of 1"
        os_user server delete --wait devstack-check-quota-2 >/dev/null 2>&1 || true
    elif grep -q "403" <<< "$out" && grep -qF "$QUOTA_CLASS" <<< "$out"; then
        pass "over the limit, Nova refused with its own quota error: $(cut -c1-250 <<< "$out")"
    else
        fail "the second whole H200 was refused, but not with 403 naming $QUOTA_CLASS: $out"
    fi
    demo_project=$(os_user token issue -f value -c project_id)
    os_system limit create --service nova --project "$demo_project" --region "$region" \
        --resource-limit 2 "class:$QUOTA_CLASS" -f value -c id >/tmp/quota-limit.id 2>/tmp/quota-limit.err ||
        fail "openstack limit create (the demo project's limit of 2) failed: $(cat /tmp/quota-limit.err)"
    if id=$(boot devstack-check-quota-2 devstack-check-quota-h200); then
        pass "with the demo project's limit raised to 2, the second whole H200 boots: $id ACTIVE"
    else
        fail "the second whole H200 did not boot with the project's limit of 2"
    fi
    delete_quota_servers
    # Leave no GPU limit for the checks after this one.
    if [[ -s /tmp/quota-limit.id ]]; then
        os_system limit delete "$(cat /tmp/quota-limit.id)" || true
    fi
    for lid in $(os_system registered limit list --resource-name "class:$QUOTA_CLASS" -f value -c id); do
        os_system registered limit delete "$lid" || true
    done
fi

echo "--- Prometheus with the shipped rules"
rules=$PLUGIN_DIR/etc/prometheus/nova-gpu-rules.yaml
if ! command -v prometheus >/dev/null; then
    # The log is the stack user's.
    # shellcheck disable=SC2024
    sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
        prometheus >/tmp/apt-prometheus.log 2>&1 || fail "apt-get install prometheus failed"
fi
sudo tee /etc/prometheus/prometheus.yml >/dev/null <<EOF
# tools/devstack/verify-gpu.sh
global:
  scrape_interval: 5s
  evaluation_interval: 5s
rule_files:
  - $rules
scrape_configs:
  - job_name: nova-gpu
    static_configs:
      - targets: ['127.0.0.1:9836']
EOF
check "promtool check config (the rules included)" promtool check config /etc/prometheus/prometheus.yml
if [[ -f $PLUGIN_DIR/etc/prometheus/nova-gpu-rules.test.yaml ]]; then
    check "promtool test rules etc/prometheus/nova-gpu-rules.test.yaml" \
        bash -c "cd $PLUGIN_DIR/etc/prometheus && promtool test rules nova-gpu-rules.test.yaml"
fi
sudo systemctl restart prometheus
prom() { curl -sf "http://127.0.0.1:9090/api/v1/$1"; }
# shellcheck disable=SC2317  # called through wait_until
target_up() {
    # Quiet until Prometheus answers (its first polls find it starting).
    prom 'query?query=up%7Bjob%3D%22nova-gpu%22%7D' 2>/dev/null | json 2>/dev/null "
import sys; r = d['data']['result']; sys.exit(0 if r and r[0]['value'][1] == '1' else 1)"
}
if wait_until 90 target_up; then
    pass "Prometheus scrapes nova-gpu-exporter (up{job=\"nova-gpu\"} = 1)"
else
    fail "Prometheus does not scrape nova-gpu-exporter: $(prom targets | cut -c1-300)"
fi
groups=$(prom rules | json "print(len(d['data']['groups']), sum(len(g['rules']) for g in d['data']['groups']))" || true)
if [[ -n "$groups" && ${groups%% *} -gt 0 ]]; then
    pass "Prometheus loaded the shipped rules: ${groups% *} groups, ${groups#* } rules"
else
    fail "Prometheus loaded no rule group"
fi
# The recording rules fed by the exporter's series have samples (those of
# the agents' NVML series cannot: no NVML on fake hardware).
with_samples=()
sleep 15
while read -r record; do
    if prom "query?query=$record" | grep -q '"result":\[{'; then
        with_samples+=("$record")
    fi
done < <(sed -n 's/^ *- record: *//p' "$rules")
if [[ ${#with_samples[@]} -gt 0 ]]; then
    pass "recording rules with samples: ${with_samples[*]}"
else
    fail "no recording rule of $rules has samples"
fi
samples=$(prom 'query?query=count(%7B__name__%3D~%22nova_gpu_.*%22%7D)' | json "print(d['data']['result'][0]['value'][1])" || echo 0)
pass "Prometheus holds $samples nova_gpu series"

finish verify-gpu
