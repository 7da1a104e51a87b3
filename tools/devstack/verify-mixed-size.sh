# shellcheck shell=bash
# Mixed-size vGPU checks of tools/devstack/verify-gpu.sh (issue 28, item
# 3), sourced by it: on the fake mixed-size host (one L40S that NVML,
# faked at its boundary, shows in NVIDIA's mixed-size vGPU mode; its
# vendor-VFIO VFs typed by the qemu hook when a guest starts), as the
# demo user:
#   - an L40S-24C and an L40S-8C server share the GPU, each VF typed with
#     its flavor's size (the fake sysfs, as NVIDIA's driver shows it);
#   - a second L40S-24C is refused (no free 4-slot placement) with the
#     plugin's reason in devstack@n-sch's journal; another L40S-8C fits;
#   - once deleted, no VF holds a type.

echo "--- mixed-size vGPUs on one L40S"
MIXED_HOST=$PREFIX-mixed-size
MIXED_SYSFS=$FAKE_DIR/mixed-size/sys

# vf_types: "VF=type" of each typed VF of the mixed-size host (sysfs).
vf_types() {
    python3 - "$MIXED_SYSFS" <<'PY'
import glob, os, re, sys
out = []
for d in sorted(glob.glob(os.path.join(sys.argv[1], 'bus/pci/devices/*'))):
    cur = os.path.join(d, 'nvidia', 'current_vgpu_type')
    if not os.path.exists(cur):
        continue
    tid = int(open(cur).read().strip() or 0)
    if not tid:
        continue
    names = dict(re.findall(r'^\s*(\d+)\s*:\s*NVIDIA (\S+)', open(
        os.path.join(d, 'nvidia', 'creatable_vgpu_types')).read(), re.M))
    out.append('%s=%s' % (os.path.basename(d), names.get(str(tid), tid)))
print(' '.join(out))
PY
}

# mixed_boot NAME FLAVOR: boot on the mixed-size host; prints the id.
# (Called in $(...): the servers are deleted by name, MIXED_NAMES.)
MIXED_NAMES=(devstack-check-mixed-large devstack-check-mixed-small
             devstack-check-mixed-large-2 devstack-check-mixed-small-2)
mixed_boot() {
    local id host
    os_user server delete --wait "$1" >/dev/null 2>&1 || true
    id=$(boot "$1" "$2") || return 1
    host=$(os_admin server show "$id" -f value -c OS-EXT-SRV-ATTR:host)
    [[ $host == "$MIXED_HOST" ]] || { echo "on $host" >&2; return 1; }
    echo "$id"
}

gpu_flavor devstack-check-l40s-24c gpu:profile=L40S-24C gpu:backend=vfio
gpu_flavor devstack-check-l40s-8c gpu:profile=L40S-8C gpu:backend=vfio
if large=$(mixed_boot devstack-check-mixed-large devstack-check-l40s-24c) &&
        small=$(mixed_boot devstack-check-mixed-small devstack-check-l40s-8c); then
    types=$(vf_types)
    gpus="$(gpu_of "$large") $(gpu_of "$small")"
    if [[ $types == *L40S-24C* && $types == *L40S-8C* && $(wc -w <<< "$types") == 2 && $gpus == "0 0" ]]; then
        pass "an L40S-24C and an L40S-8C share GPU 0 of $MIXED_HOST, their VFs typed by the qemu hook: $types"
    else
        fail "mixed sizes: GPUs '$gpus', VF types '$types' (wanted one L40S-24C and one L40S-8C on GPU 0)"
    fi
    # The agent's next report holds both (the scheduler also counts its
    # own placements).
    sleep $(( ${NOVA_GPU_FAKE_AGENT_INTERVAL:-10} + 5 ))
    since=$(date '+%F %T')
    if id=$(mixed_boot devstack-check-mixed-large-2 devstack-check-l40s-24c 2>/dev/null); then
        fail "a second L40S-24C booted ($id): 6 of 8 slots were taken"
    else
        refused_with devstack-check-mixed-large-2 "a second L40S-24C" \
            "mixed-size L40S has no free 4-slot placement" "$since"
    fi
    if mixed_boot devstack-check-mixed-small-2 devstack-check-l40s-8c >/dev/null; then
        pass "another L40S-8C still fits the 2 slots left: $(vf_types)"
    else
        fail "another L40S-8C did not boot on $MIXED_HOST"
    fi
else
    fail "the L40S-24C or L40S-8C server did not boot on $MIXED_HOST"
fi
for s in "${MIXED_NAMES[@]}"; do
    os_user server delete --wait "$s" >/dev/null 2>&1 || true
done
if [[ -z "$(vf_types)" ]]; then
    pass "no VF of $MIXED_HOST holds a type once the servers were deleted"
else
    fail "VFs still typed after the deletes: $(vf_types)"
fi
