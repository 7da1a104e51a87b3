#!/bin/bash
# shellcheck shell=bash
#
# devstack plugin of nova-gpu: installs the package into the Python
# environment Nova runs from, adds the GPU filter and weighers to
# nova-scheduler, runs nova-gpu-agent beside nova-compute and creates
# example GPU flavors; optionally installs the libvirt qemu hook and runs
# nova-gpu-exporter, nova-gpu-reclaimer and nova-gpu-defrag.
#
# devstack sources this file as "plugin.sh <mode> <phase>" after
# devstack/settings; its functions (iniset, run_process, ...) are defined.

# _nova_gpu_multi_add <file> <section> <option> <default> <item>...
# Same for a multi-valued option (one line per value).
function _nova_gpu_multi_add {
    local file=$1 section=$2 option=$3 default=$4
    shift 4
    local current item changed=""
    current=$(iniget_multiline "$file" "$section" "$option")
    current=${current:-$default}
    for item in "$@"; do
        case " $current " in
            *" $item "*) ;;
            *) current=${current:+$current }$item changed=1 ;;
        esac
    done
    [[ -n "$changed" ]] || return 0
    # Values are class paths or extra specs: never blanks, so word
    # splitting is what separates them.
    # shellcheck disable=SC2086
    iniset_multiline "$file" "$section" "$option" $current
}

# _nova_gpu_iniset_if_set <file> <section> <option> <value>: iniset where
# the value (a local.conf variable) is not empty.
function _nova_gpu_iniset_if_set {
    [[ -z "$4" ]] || iniset "$1" "$2" "$3" "$4"
}

function install_nova_gpu {
    local extras=""
    if is_service_enabled nova-gpu-agent; then
        extras=$NOVA_GPU_EXTRAS
        # libvirt's node-device API calls mdevctl to define mdevs.
        install_package mdevctl
    fi
    setup_develop "$NOVA_GPU_DIR" "$extras"
}

# _nova_gpu_apply_conf <file of etc/nova> <target>: put one of nova-gpu's
# documented nova.conf files into a service's file (devstack/conf_ops.py
# says how each kind of option is merged). The files are the one truth of
# what each service needs: doc/source includes them, the tests run with
# them.
function _nova_gpu_apply_conf {
    _nova_gpu_merge_conf "$NOVA_GPU_DIR/etc/nova/$1" "$2"
}

# _nova_gpu_merge_conf <source file> <target>: the same for any file (the
# fake-hardware mode's path files, written for each fake host).
function _nova_gpu_merge_conf {
    local source=$1 target=$2
    local -a fields
    [[ -f "$source" ]] || die $LINENO "nova-gpu: no $source"
    local edits
    edits=$("${NOVA_GPU_PYTHON:-python3}" "$NOVA_GPU_DIR/devstack/conf_ops.py" \
        "$source" "$target" "$NOVA_GPU_DIR/etc/nova") \
        || die $LINENO "nova-gpu: cannot merge $source into $target"
    while IFS=$'\t' read -r -a fields; do
        [[ ${#fields[@]} -ge 4 ]] || continue
        if [[ "${fields[0]}" == multi ]]; then
            # Not devstack's iniset_multiline: it splits the values at
            # blanks, and JSON values ([pci] alias) have blanks.
            "${NOVA_GPU_PYTHON:-python3}" "$NOVA_GPU_DIR/devstack/conf_ops.py" \
                --set-multi "$target" "${fields[1]}" "${fields[2]}" \
                "${fields[@]:3}" \
                || die $LINENO "nova-gpu: cannot write ${fields[2]} into $target"
        else
            iniset "$target" "${fields[1]}" "${fields[2]}" "${fields[3]}"
        fi
    done <<< "$edits"
}

# _nova_gpu_cell_conductor_confs: the cell conductors' files (devstack's
# nova_cell<N>.conf); the super conductor reads nova.conf.
function _nova_gpu_cell_conductor_confs {
    local conf
    for conf in "${NOVA_CONF_DIR:-/etc/nova}"/nova_cell*.conf; do
        [[ -f "$conf" ]] && echo "$conf"
    done
    return 0
}

function configure_nova_gpu_scheduler {
    # devstack's nova.conf is read by nova-api, nova-scheduler and the
    # super conductor; each gets its own file of etc/nova.
    local name conf
    for name in nova-api.conf nova-conductor.conf nova-scheduler.conf; do
        _nova_gpu_apply_conf "$name" "$NOVA_CONF"
    done
    if [[ "$NOVA_GPU_LARGE_CLOUD" == "True" ]]; then
        _nova_gpu_apply_conf nova-scheduler-large-cloud.conf "$NOVA_CONF"
    fi
    if [[ "$NOVA_GPU_DRIVER_FILTER" == "True" ]]; then
        _nova_gpu_apply_conf nova-scheduler-driver-filter.conf "$NOVA_CONF"
    fi
    for conf in $(_nova_gpu_cell_conductor_confs); do
        _nova_gpu_apply_conf nova-conductor.conf "$conf"
    done
    if [[ "$NOVA_GPU_PCI_IN_PLACEMENT" == "True" ]]; then
        # Whole GPUs and vendor-VFIO vGPUs: every Nova service, or nova-api
        # and nova-compute refuse to start on the aliases.
        _nova_gpu_apply_conf nova-gpu-pci.conf "$NOVA_CONF"
        for conf in $(_nova_gpu_cell_conductor_confs); do
            _nova_gpu_apply_conf nova-gpu-pci.conf "$conf"
        done
    fi
    # Only where local.conf asks for other weights than the files'.
    _nova_gpu_iniset_if_set "$NOVA_CONF" gpu_scheduler \
        fragmentation_weight_multiplier "$NOVA_GPU_FRAGMENTATION_WEIGHT"
    _nova_gpu_iniset_if_set "$NOVA_CONF" gpu_scheduler \
        topology_weight_multiplier "$NOVA_GPU_TOPOLOGY_WEIGHT"
    if [[ -n "$NOVA_GPU_MAX_ALLOCATION_CANDIDATES" && \
            -f "${PLACEMENT_CONF:-}" ]]; then
        # Breadth-first so that the capped set still covers every host.
        iniset "$PLACEMENT_CONF" placement max_allocation_candidates \
            "$NOVA_GPU_MAX_ALLOCATION_CANDIDATES"
        iniset "$PLACEMENT_CONF" placement \
            allocation_candidates_generation_strategy breadth-first
    fi
    if [[ -n "$NOVA_GPU_TYPICAL_REQUESTS" ]]; then
        # shellcheck disable=SC2086
        _nova_gpu_multi_add "$NOVA_CONF" gpu_scheduler typical_requests "" \
            $NOVA_GPU_TYPICAL_REQUESTS
    fi
}

function configure_nova_gpu_compute {
    local conf provider_dir
    provider_dir=${NOVA_CONF_DIR:-/etc/nova}/provider_config
    # nova-cpu.conf is copied from nova.conf when nova-compute starts;
    # write both so that either order works.
    for conf in "$NOVA_CONF" "${NOVA_CPU_CONF:-}"; do
        [[ -n "$conf" && -f "$conf" ]] || continue
        _nova_gpu_apply_conf nova-compute.conf "$conf"
        # devstack keeps its configuration under NOVA_CONF_DIR.
        iniset "$conf" compute provider_config_location "$provider_dir/"
        if [[ -n "$NOVA_GPU_MDEV_TYPES" ]]; then
            iniset "$conf" devices enabled_mdev_types "$NOVA_GPU_MDEV_TYPES"
        fi
        if [[ "$NOVA_GPU_PCI_IN_PLACEMENT" == "True" ]]; then
            _nova_gpu_apply_conf nova-gpu-pci.conf "$conf"
        fi
        if [[ -n "$NOVA_GPU_PCI_DEVICE_SPECS" ]]; then
            # shellcheck disable=SC2086
            _nova_gpu_multi_add "$conf" pci device_spec "" \
                $NOVA_GPU_PCI_DEVICE_SPECS
            iniset "$conf" pci report_in_placement True
        fi
    done

    sudo install -d -o "$STACK_USER" "$NOVA_GPU_CONF_DIR" \
        "$NOVA_GPU_STATE_DIR" "$NOVA_GPU_STATE_DIR/outbox"
    sudo install -d -o "$STACK_USER" "$provider_dir"
    iniset "$NOVA_GPU_AGENT_CONF" gpu_agent provider_config_file \
        "$provider_dir/nova-gpu.yaml"
    iniset "$NOVA_GPU_AGENT_CONF" gpu_agent outbox_dir \
        "$NOVA_GPU_STATE_DIR/outbox"
    # The journal and what the restore at boot makes again (VFs, VF types,
    # MIG mode, carved layouts) live here.
    iniset "$NOVA_GPU_AGENT_CONF" gpu_agent state_dir "$NOVA_GPU_STATE_DIR"
    iniset "$NOVA_GPU_AGENT_CONF" gpu_agent libvirt_uri \
        "${LIBVIRT_URI:-qemu:///system}"
    iniset "$NOVA_GPU_AGENT_CONF" gpu_agent quota_inventory \
        "$NOVA_GPU_QUOTA_INVENTORY"
    # Root helpers (MIG, VFIO vGPU) run through oslo.privsep; the helper
    # lives in Nova's virtual environment, outside sudo's secure_path.
    iniset "$NOVA_GPU_AGENT_CONF" nova_gpu_privsep helper_command \
        "sudo $(get_python_exec_prefix)/privsep-helper --config-file ${NOVA_CPU_CONF:-$NOVA_CONF} --config-file $NOVA_GPU_AGENT_CONF"
    # The agent publishes on the topic the scheduler listens to.
    local topic
    topic=$(iniget "$NOVA_CONF" gpu_scheduler report_topic)
    if [[ -n "$topic" ]]; then
        iniset "$NOVA_GPU_AGENT_CONF" gpu_agent report_topic "$topic"
    fi
}

# install_nova_gpu_qemu_hook: nova-gpu-qemu-hook as libvirt's qemu hook.
# libvirt runs every executable in hooks/qemu.d/ and looks for hooks only
# when it starts, hence the restart (before nova-compute runs guests).
function install_nova_gpu_qemu_hook {
    local hooks=$NOVA_GPU_LIBVIRT_HOOKS_DIR
    sudo mkdir -p "$hooks/qemu.d"
    sudo ln -sfn "$(get_python_exec_prefix)/nova-gpu-qemu-hook" \
        "$hooks/qemu.d/nova-gpu"
    # The hook reads [gpu_agent] from nova-gpu.conf (libvirt passes no
    # options): the same state directory as the agent, where it records
    # the VF types it sets for the restore at boot.
    sudo install -d -o "$STACK_USER" "$NOVA_GPU_CONF_DIR"
    iniset "$NOVA_GPU_CONF_DIR/nova-gpu.conf" gpu_agent state_dir \
        "$NOVA_GPU_STATE_DIR"
    # VFs are typed only while a guest holds them: the agent counts every
    # typed VF as a vGPU in use.
    iniset "$NOVA_GPU_AGENT_CONF" gpu_agent vf_types_on_demand True
    sudo systemctl restart "${LIBVIRT_DAEMON:-libvirtd}"
}

function remove_nova_gpu_qemu_hook {
    sudo rm -f "$NOVA_GPU_LIBVIRT_HOOKS_DIR/qemu.d/nova-gpu"
}

# configure_nova_gpu_services: the cloud-wide services' options, in the
# agent's file (the services read nova.conf and it).
function configure_nova_gpu_services {
    is_service_enabled nova-gpu-reclaimer nova-gpu-defrag || return 0
    sudo install -d -o "$STACK_USER" "$NOVA_GPU_CONF_DIR"
    if is_service_enabled nova-gpu-reclaimer; then
        iniset "$NOVA_GPU_AGENT_CONF" gpu_reclaimer cloud "$NOVA_GPU_CLOUD"
        # Only where local.conf asks for other than the defaults
        # (shelve_offload after 300 s).
        _nova_gpu_iniset_if_set "$NOVA_GPU_AGENT_CONF" gpu_reclaimer action \
            "$NOVA_GPU_RECLAIM_ACTION"
        _nova_gpu_iniset_if_set "$NOVA_GPU_AGENT_CONF" gpu_reclaimer \
            grace_period "$NOVA_GPU_RECLAIM_GRACE_PERIOD"
    fi
    if is_service_enabled nova-gpu-defrag; then
        iniset "$NOVA_GPU_AGENT_CONF" gpu_defrag cloud "$NOVA_GPU_CLOUD"
        iniset "$NOVA_GPU_AGENT_CONF" gpu_defrag interval \
            "$NOVA_GPU_DEFRAG_INTERVAL"
    fi
}

function start_nova_gpu_services {
    local service
    # The exporter first: nova-gpu-defrag reads its capacity
    # ([gpu_defrag] exporter_url, 127.0.0.1:9836 as [gpu_exporter] listen).
    for service in nova-gpu-exporter nova-gpu-reclaimer nova-gpu-defrag; do
        is_service_enabled "$service" || continue
        run_process "$service" "$(get_python_exec_prefix)/$service \
--config-file $NOVA_CONF --config-file $NOVA_GPU_AGENT_CONF"
    done
}

# start_nova_gpu_scheduler: devstack started n-sch as nova-scheduler;
# nova-gpu's scheduler service is the same service under
# nova-gpu-scheduler (Nova's own main with nova-gpu's manager, which starts
# the GPU report listener and sends the placement notifications). The
# unit keeps its name (devstack@n-sch), configuration and logs.
function start_nova_gpu_scheduler {
    is_service_enabled n-sch || return 0
    stop_process n-sch
    run_process n-sch "$(get_python_exec_prefix)/nova-gpu-scheduler \
--config-file $NOVA_CONF"
}

function stop_nova_gpu_services {
    local service
    for service in nova-gpu-exporter nova-gpu-reclaimer nova-gpu-defrag; do
        is_service_enabled "$service" && stop_process "$service"
    done
    return 0
}

# restore_nova_gpu_devices: VFs, VF types, MIG modes and carved layouts
# again (after a reboot: what systemd's nova-gpu-restore.service does in
# production). In post-config, before devstack starts nova-compute: Nova
# reads the host's PCI devices once, when nova-compute starts (VFs enabled
# later need a nova-compute restart). A failure is logged, not fatal.
function restore_nova_gpu_devices {
    "$(get_python_exec_prefix)/nova-gpu-restore" \
        --config-file "${NOVA_CPU_CONF:-$NOVA_CONF}" \
        --config-file "$NOVA_GPU_AGENT_CONF" || true
}

function start_nova_gpu_agent {
    # nova-cpu.conf first: the agent reads the message bus and Placement
    # credentials from it, its own options from the second file.
    run_process nova-gpu-agent "$(get_python_exec_prefix)/nova-gpu-agent \
--config-file ${NOVA_CPU_CONF:-$NOVA_CONF} --config-file $NOVA_GPU_AGENT_CONF"
    if is_service_enabled n-cpu; then
        _nova_gpu_provider_config_to_compute \
            "$(iniget "$NOVA_GPU_AGENT_CONF" gpu_agent provider_config_file)" n-cpu
    fi
}

# _nova_gpu_provider_config_to_compute <file> <service>: nova-compute reads
# provider configs only when it starts (ResourceTracker.__init__), and
# devstack started it before the agent wrote its file (GPU set traits, the
# quota inventory of NOVA_GPU_QUOTA_INVENTORY): wait for the agent's first
# file (NOVA_GPU_AGENT_READY_TIMEOUT) and restart that nova-compute once,
# as an operator does after the agent says the file changed. A file that
# names no provider (a host without GPUs) needs no restart.
function _nova_gpu_provider_config_to_compute {
    local file=$1 service=$2 deadline
    [[ -n "$file" ]] || return 0
    deadline=$(( SECONDS + NOVA_GPU_AGENT_READY_TIMEOUT ))
    until [[ -s "$file" ]]; do
        if (( SECONDS >= deadline )); then
            warn $LINENO "nova-gpu: no provider config $file from the agent after ${NOVA_GPU_AGENT_READY_TIMEOUT} s; $service keeps running without it"
            return 0
        fi
        sleep 2
    done
    if grep -q "identification:" "$file"; then
        echo "nova-gpu: $file written by the agent: restarting $service so that it reads it"
        sudo systemctl restart "devstack@$service.service"
    fi
}

# create_nova_gpu_flavors: one flavor per NOVA_GPU_FLAVORS entry,
# name|vcpus|ram_mb|disk_gb|key=value|...; existing flavors are kept.
function create_nova_gpu_flavors {
    local entry name vcpus ram disk spec
    local -a fields props
    for entry in $NOVA_GPU_FLAVORS; do
        IFS='|' read -r -a fields <<< "$entry"
        if [[ ${#fields[@]} -lt 4 ]]; then
            die $LINENO "NOVA_GPU_FLAVORS entry '$entry' needs at least name|vcpus|ram_mb|disk_gb"
        fi
        name=${fields[0]} vcpus=${fields[1]} ram=${fields[2]} disk=${fields[3]}
        props=()
        for spec in "${fields[@]:4}"; do
            if [[ "$spec" != *=* ]]; then
                die $LINENO "NOVA_GPU_FLAVORS entry '$entry': '$spec' is not key=value"
            fi
            props+=(--property "$spec")
        done
        if openstack --os-cloud devstack-admin flavor show "$name" \
                >/dev/null 2>&1; then
            continue
        fi
        openstack --os-cloud devstack-admin flavor create --vcpus "$vcpus" \
            --ram "$ram" --disk "$disk" "${props[@]}" "$name"
    done
}

function stop_nova_gpu_agent {
    stop_process nova-gpu-agent
}

# The fake-hardware mode (NOVA_GPU_FAKE_HARDWARE): for each path of
# NOVA_GPU_FAKE_PATHS a nova-compute on Nova's fake libvirt carrying GPUs
# of that path (devstack@n-gpu-fake-<path>) and a real nova-gpu-agent on
# the host's fake sysfs (devstack@nova-gpu-agent-fake-<path>), both
# reporting over devstack's RabbitMQ (nova_gpu.tests.harness.fake_compute).

# _nova_gpu_fake_launcher <args>: the launcher, in Nova's environment.
function _nova_gpu_fake_launcher {
    "$(get_python_exec_prefix)/python3" -m nova_gpu.tests.harness.fake_compute "$@"
}

# _nova_gpu_fake_host <path>: the fake host's name (nova-compute's host
# and hypervisor hostname, the agent's host and nodename).
function _nova_gpu_fake_host {
    echo "${NOVA_GPU_FAKE_HOST_PREFIX:-$(hostname -s)}-$1"
}

function install_nova_gpu_fake_hardware {
    # Nova's fake libvirt lives in nova.tests (shipped in Nova's sdist);
    # these test libraries it imports are not Nova's requirements.
    # shellcheck disable=SC2086
    pip_install $NOVA_GPU_FAKE_PIP_PACKAGES
}

# configure_nova_gpu_fake_host <path>: the two units' files. nova-compute's
# is nova-cpu.conf with the path's etc/nova file written for this fake host
# (its type ids and addresses), its own host name and state; the agent's is
# nova-gpu.conf with the fake host's sysfs tree and names.
function configure_nova_gpu_fake_host {
    local path=$1 host dir conf agent_conf option value
    host=$(_nova_gpu_fake_host "$path")
    dir=$NOVA_GPU_FAKE_DIR/$path
    conf=$NOVA_GPU_CONF_DIR/nova-compute-fake-$path.conf
    agent_conf=$NOVA_GPU_CONF_DIR/nova-gpu-fake-$path.conf
    sudo install -d -o "$STACK_USER" "$dir" "$dir/nova" "$dir/instances" \
        "$dir/provider_config" "$dir/outbox" "$dir/agent-state"
    cp "${NOVA_CPU_CONF:-$NOVA_CONF}" "$conf"
    _nova_gpu_fake_launcher path-conf "$path" "$host" \
        > "$dir/nova-compute-$path.conf" \
        || die $LINENO "nova-gpu: no path file for the fake $path host"
    _nova_gpu_merge_conf "$dir/nova-compute-$path.conf" "$conf"
    iniset "$conf" DEFAULT host "$host"
    iniset "$conf" DEFAULT state_path "$dir/nova"
    iniset "$conf" DEFAULT instances_path "$dir/instances"
    iniset "$conf" compute provider_config_location "$dir/provider_config/"
    cp "$NOVA_GPU_AGENT_CONF" "$agent_conf"
    iniset "$agent_conf" gpu_agent sysfs_root "$dir/sys"
    iniset "$agent_conf" gpu_agent use_nvml False
    # Nova's fake libvirt is inside the fake nova-compute: the agent
    # reports from sysfs and skips its libvirt reconcile.
    iniset "$agent_conf" gpu_agent libvirt_uri \
        "qemu+unix:///system?socket=$dir/no-libvirtd.sock"
    iniset "$agent_conf" gpu_agent libvirt_retries 0
    iniset "$agent_conf" gpu_agent remove_orphans False
    iniset "$agent_conf" gpu_agent reconcile_interval \
        "$NOVA_GPU_FAKE_AGENT_INTERVAL"
    iniset "$agent_conf" gpu_agent provider_config_file \
        "$dir/provider_config/nova-gpu.yaml"
    iniset "$agent_conf" gpu_agent outbox_dir "$dir/outbox"
    iniset "$agent_conf" gpu_agent state_dir "$dir/agent-state"
    iniset "$agent_conf" gpu_agent quota_inventory "$NOVA_GPU_QUOTA_INVENTORY"
    while IFS=$'\t' read -r option value; do
        [[ -n "$option" ]] && iniset "$agent_conf" gpu_agent "$option" "$value"
    done < <(_nova_gpu_fake_launcher agent-options "$path" "$host" --dir "$dir")
}

function start_nova_gpu_fake_host {
    local path=$1 dir
    dir=$NOVA_GPU_FAKE_DIR/$path
    run_process "n-gpu-fake-$path" "$(get_python_exec_prefix)/python3 \
-m nova_gpu.tests.harness.fake_compute run $path --sysfs $dir/sys --dir $dir \
-- --config-file $NOVA_GPU_CONF_DIR/nova-compute-fake-$path.conf"
    # nova-gpu-agent's own main; NVML faked at its boundary where the path
    # needs it (MIG mode is NVML's alone).
    run_process "nova-gpu-agent-fake-$path" "$(get_python_exec_prefix)/python3 \
-m nova_gpu.tests.harness.fake_compute agent $path $(_nova_gpu_fake_host "$path") \
--state $dir/agent-state \
-- --config-file $NOVA_GPU_CONF_DIR/nova-compute-fake-$path.conf \
--config-file $NOVA_GPU_CONF_DIR/nova-gpu-fake-$path.conf"
}

# wait_for_nova_gpu_fake_hosts: each fake nova-compute registered, before
# stack.sh maps the computes into the cell (tools/discover_hosts.sh).
function wait_for_nova_gpu_fake_hosts {
    local path host deadline
    deadline=$(( SECONDS + NOVA_GPU_FAKE_READY_TIMEOUT ))
    for path in $NOVA_GPU_FAKE_PATHS; do
        host=$(_nova_gpu_fake_host "$path")
        until openstack --os-cloud devstack-admin compute service list \
                --host "$host" --service nova-compute -f value -c ID | grep -q .; do
            if (( SECONDS > deadline )); then
                die $LINENO "nova-gpu: the fake $path host $host did not register (journalctl -u devstack@n-gpu-fake-$path)"
            fi
            sleep 2
        done
    done
    for path in $NOVA_GPU_FAKE_PATHS; do
        _nova_gpu_provider_config_to_compute \
            "$NOVA_GPU_FAKE_DIR/$path/provider_config/nova-gpu.yaml" \
            "n-gpu-fake-$path"
    done
}

function stop_nova_gpu_fake_hardware {
    local path
    for path in $NOVA_GPU_FAKE_PATHS; do
        stop_process "nova-gpu-agent-fake-$path"
        stop_process "n-gpu-fake-$path"
    done
    return 0
}

function cleanup_nova_gpu {
    sudo rm -rf "$NOVA_GPU_CONF_DIR" "$NOVA_GPU_STATE_DIR"
}

if [[ "$1" == "stack" && "$2" == "install" ]]; then
    echo_summary "Installing nova-gpu"
    install_nova_gpu
    if [[ "$NOVA_GPU_FAKE_HARDWARE" == "True" ]]; then
        install_nova_gpu_fake_hardware
    fi
elif [[ "$1" == "stack" && "$2" == "post-config" ]]; then
    echo_summary "Configuring nova-gpu"
    if [[ "$NOVA_GPU_ENABLE_SCHEDULER" == "True" ]]; then
        configure_nova_gpu_scheduler
    fi
    if is_service_enabled nova-gpu-agent; then
        configure_nova_gpu_compute
        if [[ "$NOVA_GPU_QEMU_HOOK" == "True" ]]; then
            install_nova_gpu_qemu_hook
        fi
        restore_nova_gpu_devices
    fi
    configure_nova_gpu_services
elif [[ "$1" == "stack" && "$2" == "extra" ]]; then
    if is_service_enabled nova-gpu-agent; then
        echo_summary "Starting nova-gpu-agent"
        start_nova_gpu_agent
    fi
    if [[ "$NOVA_GPU_ENABLE_SCHEDULER" == "True" ]]; then
        echo_summary "Running nova-scheduler as nova-gpu-scheduler"
        start_nova_gpu_scheduler
    fi
    start_nova_gpu_services
    if [[ "$NOVA_GPU_FAKE_HARDWARE" == "True" ]]; then
        echo_summary "Starting nova-gpu's fake GPU hosts"
        for path in $NOVA_GPU_FAKE_PATHS; do
            configure_nova_gpu_fake_host "$path"
            start_nova_gpu_fake_host "$path"
        done
        wait_for_nova_gpu_fake_hosts
    fi
    if is_service_enabled n-api; then
        create_nova_gpu_flavors
    fi
fi

if [[ "$1" == "unstack" ]]; then
    stop_nova_gpu_agent
    stop_nova_gpu_services
    if [[ "$NOVA_GPU_FAKE_HARDWARE" == "True" ]]; then
        stop_nova_gpu_fake_hardware
    fi
fi

if [[ "$1" == "clean" ]]; then
    if [[ "$NOVA_GPU_QEMU_HOOK" == "True" ]]; then
        remove_nova_gpu_qemu_hook
    fi
    cleanup_nova_gpu
fi
