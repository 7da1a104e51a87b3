# shellcheck shell=bash
# HGX checks of tools/devstack/verify-gpu.sh (issue 28, items 1 and 2),
# sourced by it: on the fake hgx host (an HGX H100 8-GPU server in Fabric
# Manager's Shared NVSwitch mode, Fabric Manager faked at its fmpm
# command; eight ConnectX-7 NICs whose VFs are PCI devices in Placement),
# as the demo user:
#   - two 2-GPU servers each get the GPUs of one NVSwitch partition,
#     which Fabric Manager has active while they run (the qemu hook
#     activated it), and together fill one 4-GPU half: the other half
#     stays free, and a 4-GPU server then gets it;
#   - a server of 3 GPUs (no partition has 3) is refused, with the
#     plugin's reason in devstack@n-sch's journal;
#   - a gpu:rdma server gets a NIC VF from a NIC below its GPU's PCIe
#     switch (its Placement allocation), and its partition too;
#   - once deleted, no partition is left active.

echo "--- HGX: NVSwitch partitions and GPUDirect RDMA pairs"
HGX_HOST=$PREFIX-hgx
HGX=$(describe hgx || true)
FM_STATE=$FAKE_DIR/hgx/fabric-manager.json

# partition_of "GPU ..." : the ID of the supported partition of exactly
# these GPUs of the hgx host (empty if none).
partition_of() {
    json "
want = sorted(int(g) for g in '$1'.split())
print(''.join(k for k, p in d['partitions'].items()
              if p['gpus'] == want and p['supported']))" <<< "$HGX"
}

# fm_active: the partitions Fabric Manager has active, blank-separated.
fm_active() {
    json "print(' '.join(str(i) for i in d['active']))" < "$FM_STATE"
}

# hgx_boot NAME FLAVOR WHAT: boot on the hgx host, check its GPUs form an
# active partition; sets HGX_ID, HGX_GPUS, HGX_PART.
hgx_boot() {
    local name=$1 flavor=$2 what=$3 host
    HGX_ID="" HGX_GPUS="" HGX_PART=""
    os_user server delete --wait "$name" >/dev/null 2>&1 || true
    if ! HGX_ID=$(boot "$name" "$flavor"); then
        fail "$what: $name did not boot: $(os_admin server show "$name" -f value -c fault 2>/dev/null)"
        return 1
    fi
    HGX_SERVERS+=("$HGX_ID")
    host=$(os_admin server show "$HGX_ID" -f value -c OS-EXT-SRV-ATTR:host)
    HGX_GPUS=$(gpu_of "$HGX_ID" || true)
    HGX_PART=$(partition_of "$HGX_GPUS")
    if [[ $host == "$HGX_HOST" && -n "$HGX_PART" ]]; then
        pass "$what: $name ACTIVE on $host, GPUs $HGX_GPUS = NVSwitch partition $HGX_PART"
    else
        fail "$what: $name on '$host' got GPUs '$HGX_GPUS', no supported partition of $HGX_HOST"
        return 1
    fi
    if [[ " $(fm_active) " == *" $HGX_PART "* ]]; then
        pass "$what: Fabric Manager has partition $HGX_PART active (the qemu hook activated it; active: $(fm_active))"
    else
        fail "$what: partition $HGX_PART not active in Fabric Manager (active: '$(fm_active)')"
    fi
}

HGX_SERVERS=()
if [[ -z "$HGX" || ! -f "$FM_STATE" ]]; then
    fail "the hgx host: no description or no Fabric Manager state ($FM_STATE)"
else
    gpu_flavor devstack-check-hgx-x2 gpu:kind=whole gpu:model=H100-80GB gpu:count=2
    gpu_flavor devstack-check-hgx-x4 gpu:kind=whole gpu:model=H100-80GB gpu:count=4
    gpu_flavor devstack-check-hgx-x3 gpu:kind=whole gpu:model=H100-80GB gpu:count=3
    gpu_flavor devstack-check-hgx-rdma gpu:kind=whole gpu:model=H100-80GB gpu:rdma=true
    pairs=()
    for n in 1 2; do
        if hgx_boot "devstack-check-hgx-pair-$n" devstack-check-hgx-x2 "2 GPUs ($n)"; then
            pairs+=("$HGX_GPUS")
        fi
    done
    if [[ ${#pairs[@]} == 2 ]]; then
        both=$(partition_of "${pairs[0]} ${pairs[1]}")
        if [[ -n "$both" && $(wc -w <<< "${pairs[0]} ${pairs[1]}") == 4 ]]; then
            pass "the second pair took the 4-GPU half the first broke (partition $both): the other half stays free"
        else
            fail "the pairs ${pairs[0]} and ${pairs[1]} do not fill one 4-GPU partition: a larger partition was broken"
        fi
        if hgx_boot devstack-check-hgx-quad devstack-check-hgx-x4 "4 GPUs"; then
            rest=$(json "
used = set('${pairs[0]} ${pairs[1]}'.split())
print(' '.join(g for g in '$HGX_GPUS'.split() if g in used))" <<< '{}')
            if [[ -z "$rest" ]]; then
                pass "the 4-GPU server got the half the pairs left free ($HGX_GPUS)"
            else
                fail "the 4-GPU server shares GPUs $rest with the pairs"
            fi
        fi
    fi
    for s in "${HGX_SERVERS[@]}"; do
        os_user server delete --wait "$s" >/dev/null 2>&1 || fail "delete of $s failed"
    done
    HGX_SERVERS=()
    if [[ -z "$(fm_active)" ]]; then
        pass "no NVSwitch partition left active once the servers were deleted"
    else
        fail "partitions still active after the deletes: $(fm_active)"
    fi
    # With every GPU free again (Placement has candidates of 3 GPUs),
    # GpuFilter refuses: no partition has 3 GPUs.
    since=$(date '+%F %T')
    os_user server delete --wait devstack-check-hgx-three >/dev/null 2>&1 || true
    if boot devstack-check-hgx-three devstack-check-hgx-x3 >/dev/null 2>&1; then
        fail "a 3-GPU server booted: no NVSwitch partition has 3 GPUs"
    else
        refused_with devstack-check-hgx-three "a 3-GPU server" \
            "no NVSwitch partition of 3 GPUs" "$since"
        os_user server delete --wait devstack-check-hgx-three >/dev/null 2>&1 || true
    fi

    # GPUDirect RDMA: the NIC VF's PF (its Placement provider,
    # <host>_<PF ADDRESS>) is below the GPU's switch.
    if hgx_boot devstack-check-hgx-rdma devstack-check-hgx-rdma "gpu:rdma"; then
        os_admin resource provider allocation show "$HGX_ID" -f json >/tmp/alloc.json
        nic_rp=$(json "
print(''.join(a['resource_provider'] for a in d
              if 'CUSTOM_RDMA_NIC_VF' in a['resources']))" </tmp/alloc.json)
        nic_name=$(os_admin resource provider show "$nic_rp" -f value -c name 2>/dev/null || true)
        verdict=$(json "
nic = '$nic_name'.rsplit('_', 1)[-1].lower()
gpu = int('$HGX_GPUS')
s = d['nic_switches'].get(nic)
print('%s %s %s' % (nic or '-', d['gpu_switches'][gpu], s))" <<< "$HGX" || true)
        read -r nic gpu_switch nic_switch <<< "$verdict"
        if [[ -n "$nic_name" && "$gpu_switch" == "$nic_switch" ]]; then
            pass "gpu:rdma: GPU $HGX_GPUS (PCIe switch $gpu_switch) got a VF of NIC $nic on the same switch (Placement: $nic_name)"
        else
            fail "gpu:rdma: GPU $HGX_GPUS under switch ${gpu_switch:-?}, its VF from '${nic_name:-no NIC provider}' under switch ${nic_switch:-?}"
        fi
        os_user server delete --wait "$HGX_ID" >/dev/null 2>&1 || true
    fi
fi
