#!/bin/bash
# A real devstack with the nova-gpu plugin (issue 24): devstack's own
# stack.sh, unmodified, in a Debian bookworm container booted with
# systemd-nspawn, then checks of what it made, then unstack.sh and
# clean.sh. A benchmark-style job, not part of CI: it needs root, about
# 20 GB of disk and the package registries (PyPI, Debian).
#
# Phases (each timed; times go to WORKDIR/logs/timings.tsv):
#   prereqs  what the machine must provide, installed with apt if missing
#   rootfs   debootstrap of bookworm into WORKDIR/root (kept and reused)
#   mirrors  git mirrors for devstack's GIT_BASE (tools/devstack/build-mirrors.sh)
#   plugin   a git copy of this checkout, as it is now, for enable_plugin
#   boot     systemd-nspawn -b of the root, its own network namespace
#            reaching out through slirp4netns
#   stack    stack.sh as user "stack"
#   verify   tools/devstack/verify.sh in the container: the units, a plain
#            server on real libvirt/QEMU (items 1-3)
#   gpu      tools/devstack/verify-gpu.sh: the fake-hardware GPU hosts, a
#            flavor of each path, a bad spec, capacity, NoValidHost, the
#            reclaimer, Prometheus (item 4)
#   restart  tools/devstack/verify-restart.sh: units restarted while
#            servers boot (item 5)
#   unstack  unstack.sh, clean.sh, container stopped (not with --keep)
# A failed check phase (verify, gpu, restart) does not stop the others;
# the check exits 1 after unstack if any failed.
#
# Options:
#   --workdir DIR       where the root, mirrors and logs live
#                       (NOVA_GPU_DEVSTACK_WORKDIR, /var/tmp/nova-gpu-devstack)
#   --keep              leave the stack and the container running
#   --reuse             the container of an earlier --keep is running:
#                       no mirrors, plugin or stack phase, verify again
#   --stop              unstack, clean and stop a kept container
#   --libvirt-type T    kvm or qemu (TCG); default kvm if /dev/kvm opens
#                       and the CPU shows vmx/svm, else qemu
#   --rebuild-root      debootstrap again
#   --checks LIST       the check phases to run, comma-separated
#                       (default verify,gpu,restart)
#   --no-fake-hardware  NOVA_GPU_FAKE_HARDWARE=False (no GPU hosts: the
#                       gpu and restart phases then fail)
#   --plugin-ref REF    the plugin from this commit of the checkout
#                       (git archive) instead of the working tree as it is
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
# The checkout (NOVA_GPU_DEVSTACK_REPO: where a copy of tools/ runs, so
# that editing the script does not change a run under way).
REPO=${NOVA_GPU_DEVSTACK_REPO:-$(cd "$HERE/.." && pwd)}
WORKDIR=${NOVA_GPU_DEVSTACK_WORKDIR:-/var/tmp/nova-gpu-devstack}
KEEP=0 REUSE=0 STOP=0 REBUILD=0 LIBVIRT_TYPE=${NOVA_GPU_DEVSTACK_LIBVIRT_TYPE:-}
CHECKS=verify,gpu,restart FAKE_HARDWARE=True PLUGIN_REF="" CHECK_FAILED=0
SUITE=bookworm
DEBIAN_MIRROR=${NOVA_GPU_DEVSTACK_DEBIAN_MIRROR:-http://deb.debian.org/debian}
# slirp4netns's fixed addresses: the container is 10.0.2.100 on tap0.
CT_IP=10.0.2.100
MIN_DISK_GB=20
# The releases of series 2026.2 (Nova 34), as devstack's master installs
# them: mirror name=PyPI name==version.
SERVICES=(nova=nova==34.0.0 keystone=keystone==30.0.0 glance=glance==33.0.0
          placement=openstack-placement==16.0.0 neutron=neutron==29.0.0)

die() { echo "devstack-check: $*" >&2; exit 1; }

while [[ $# -gt 0 ]]; do
    case $1 in
        --workdir) WORKDIR=$2; shift ;;
        --keep) KEEP=1 ;;
        --reuse) REUSE=1 ;;
        --stop) STOP=1 ;;
        --libvirt-type) LIBVIRT_TYPE=$2; shift ;;
        --rebuild-root) REBUILD=1 ;;
        --checks) CHECKS=$2; shift ;;
        --no-fake-hardware) FAKE_HARDWARE=False ;;
        --plugin-ref) PLUGIN_REF=$2; shift ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown option $1 (see --help)" ;;
    esac
    shift
done

ROOT=$WORKDIR/root
LOGS=$WORKDIR/logs
TIMINGS=$LOGS/timings.tsv
NSPAWN_PID_FILE=$WORKDIR/nspawn.pid
SLIRP_PID_FILE=$WORKDIR/slirp4netns.pid
# In the container: the mirrors (GIT_BASE) and the plugin's copy.
CT_MIRRORS=/opt/git-mirrors
CT_STACK_HOME=/opt/stack

mkdir -p "$LOGS"

# timed NAME FUNCTION: runs it, appends "name seconds status" to TIMINGS;
# returns its status.
timed() {
    local name=$1 start rc=0
    shift
    start=$(date +%s)
    echo "=== $(date -u +%H:%M:%S) phase $name"
    # A subshell with errexit, not "cmd || rc=$?": bash ignores set -e
    # in anything run as the left side of ||.
    set +e
    (set -e; "$@")
    rc=$?
    set -e
    printf '%s\t%s\t%s\n' "$name" "$(( $(date +%s) - start ))" \
        "$([[ $rc == 0 ]] && echo ok || echo "failed rc=$rc")" >> "$TIMINGS"
    echo "=== phase $name: $(( $(date +%s) - start )) s, rc=$rc"
    return "$rc"
}

# phase NAME FUNCTION: a timed phase the run stops at when it fails.
phase() {
    timed "$@" || {
        summary
        die "phase $1 failed (logs: $LOGS)"
    }
}

# phase_check NAME FUNCTION: a check phase (one of --checks): a failure
# is noted (CHECK_FAILED) and the run goes on.
phase_check() {
    if [[ ",$CHECKS," != *",$1,"* ]]; then
        echo "=== phase $1: skipped (--checks $CHECKS)"
        return 0
    fi
    timed "$@" || CHECK_FAILED=1
}

summary() {
    echo "--- timings (s) of this run, $TIMINGS"
    sed -n "$RUN_LINE,\$p" "$TIMINGS" | column -t
}

# ---------------------------------------------------------------- prereqs
prereqs() {
    [[ $EUID == 0 ]] || die "needs root (debootstrap, systemd-nspawn)"
    local missing=()
    command -v systemd-nspawn >/dev/null || missing+=(systemd-container)
    command -v debootstrap >/dev/null || missing+=(debootstrap)
    command -v slirp4netns >/dev/null || missing+=(slirp4netns)
    command -v nsenter >/dev/null || missing+=(util-linux)
    command -v git >/dev/null || missing+=(git)
    command -v rsync >/dev/null || missing+=(rsync)
    command -v pip >/dev/null || missing+=(python3-pip)
    if [[ ${#missing[@]} -gt 0 ]]; then
        echo "installing ${missing[*]}"
        apt-get install -y "${missing[@]}" >"$LOGS/apt-host.log" 2>&1 || {
            apt-get update >>"$LOGS/apt-host.log" 2>&1 &&
            apt-get install -y "${missing[@]}" >>"$LOGS/apt-host.log" 2>&1
        } || die "cannot install ${missing[*]} (see $LOGS/apt-host.log)"
    fi
    [[ -c /dev/net/tun ]] || die "no /dev/net/tun: slirp4netns needs it for the container's network"
    local free_gb
    free_gb=$(( $(df --output=avail -k "$WORKDIR" | tail -1) / 1024 / 1024 ))
    if [[ ! -d "$ROOT/opt/stack/data" && $free_gb -lt $MIN_DISK_GB ]]; then
        die "needs ${MIN_DISK_GB} GB free in $WORKDIR, has ${free_gb} GB"
    fi
    echo "free disk: ${free_gb} GB; cores: $(nproc)"
}

# kvm where /dev/kvm opens and answers, else TCG.
libvirt_type() {
    if [[ -z "$LIBVIRT_TYPE" ]]; then
        # Readable and writable, the ioctl answers, and the CPU says it
        # has VMX/SVM: without the flag (a nested guest whose /dev/kvm
        # answers all the same) libvirt reports "the accel 'kvm' is not
        # supported" and nova-compute stops on its CPU model check.
        if [[ -c /dev/kvm ]] && grep -q -w -E 'vmx|svm' /proc/cpuinfo &&
                python3 -c "
import fcntl, os
fd = os.open('/dev/kvm', os.O_RDWR)
assert fcntl.ioctl(fd, 0xAE00) == 12  # KVM_GET_API_VERSION
" 2>/dev/null; then
            LIBVIRT_TYPE=kvm
        else
            echo "/dev/kvm missing or not usable, or no vmx/svm CPU flag: TCG (LIBVIRT_TYPE=qemu)"
            LIBVIRT_TYPE=qemu
        fi
    fi
    [[ $LIBVIRT_TYPE == kvm || $LIBVIRT_TYPE == qemu ]] ||
        die "--libvirt-type must be kvm or qemu"
    echo "libvirt type: $LIBVIRT_TYPE"
}

# ---------------------------------------------------------------- rootfs
# in_root CMD...: a command in the root before it boots (chroot).
in_root() { chroot "$ROOT" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 "$@"; }

rootfs() {
    if [[ $REBUILD == 1 ]]; then
        rm -rf "$ROOT"
    fi
    if [[ ! -d "$ROOT" ]]; then
        rm -rf "$ROOT.tmp"
        # minbase plus what devstack expects before it installs its own
        # packages (git, sudo, lsb-release) and what boots (systemd, dbus).
        nice -n 15 debootstrap --variant=minbase \
            --include=systemd,systemd-sysv,dbus,sudo,git,ca-certificates,python3,lsb-release,iproute2,procps,curl,gnupg,locales,less,psmisc \
            "$SUITE" "$ROOT.tmp" "$DEBIAN_MIRROR" >"$LOGS/debootstrap.log" 2>&1 ||
            die "debootstrap failed (see $LOGS/debootstrap.log)"
        mv "$ROOT.tmp" "$ROOT"
    fi
    echo devstack > "$ROOT/etc/hostname"
    printf '127.0.0.1 localhost\n%s devstack\n' "$CT_IP" > "$ROOT/etc/hosts"
    # slirp4netns's DNS forwarder.
    echo "nameserver 10.0.2.3" > "$ROOT/etc/resolv.conf"
    # The container reaches the registries through the host's network
    # path: it must trust what the host trusts (a TLS-inspecting egress
    # proxy's CA, where there is one). pip uses its own bundle unless told.
    if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
        cp /usr/local/share/ca-certificates/*.crt "$ROOT/usr/local/share/ca-certificates/"
        in_root update-ca-certificates >/dev/null
    fi
    printf '[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n' > "$ROOT/etc/pip.conf"
    # QEMU opens the bound /dev/kvm as group kvm: the host's group id.
    if [[ -c /dev/kvm ]] && ! in_root getent group kvm >/dev/null; then
        in_root groupadd -r -g "$(stat -c %g /dev/kvm)" kvm
    fi
    if ! in_root id stack >/dev/null 2>&1; then
        in_root useradd -m -d "$CT_STACK_HOME" -s /bin/bash stack
    fi
    chmod 755 "$ROOT$CT_STACK_HOME"
    echo "stack ALL=(ALL) NOPASSWD: ALL" > "$ROOT/etc/sudoers.d/stack"
    chmod 440 "$ROOT/etc/sudoers.d/stack"
    # lib/nova (re)starts iscsid for Cinder's iSCSI targets; in a container
    # iscsid exits at once (the kernel's iSCSI netlink is not there) and
    # stack.sh dies with it. Nothing here uses iSCSI (no Cinder): the unit
    # succeeds without running the daemon. (CINDER_TARGET_HELPER=nvmet,
    # devstack's other path, modprobes nvme-fabrics, also absent.)
    mkdir -p "$ROOT/etc/systemd/system/iscsid.service.d"
    printf '%s\n' '# tools/devstack-check.sh: no iSCSI in this container' \
        '[Service]' 'Type=oneshot' 'RemainAfterExit=yes' 'ExecStart=' \
        'ExecStart=/bin/true' 'PIDFile=' \
        > "$ROOT/etc/systemd/system/iscsid.service.d/devstack-check.conf"
    # libvirt puts each guest into cgroups of its own, and the container's
    # cgroup (v1) hierarchy is read-only: "Failed to create v1 controller
    # cpu for group: Read-only file system". Guests without cgroup
    # controllers. Written before libvirt is installed, the file is kept
    # (devstack's apt-get runs with --force-confold) and devstack adds its
    # own settings to it.
    mkdir -p "$ROOT/etc/libvirt"
    if ! grep -q '^cgroup_controllers' "$ROOT/etc/libvirt/qemu.conf" 2>/dev/null; then
        printf '%s\n' '# tools/devstack-check.sh: the container cannot create cgroups' \
            'cgroup_controllers = [ ]' >> "$ROOT/etc/libvirt/qemu.conf"
    fi
    # Nothing in a container to set up for these; they only fail.
    in_root systemctl mask systemd-networkd-wait-online.service \
        systemd-timesyncd.service >/dev/null 2>&1 || true
}

# ---------------------------------------------------------------- mirrors
mirrors() {
    local requirements devstack specs=()
    # Snapshots of the public repositories: NOVA_GPU_DEVSTACK_REQUIREMENTS_GIT
    # and NOVA_GPU_DEVSTACK_DEVSTACK_GIT (git URLs or directories).
    requirements=${NOVA_GPU_DEVSTACK_REQUIREMENTS_GIT:-/work/.mirror/openstack+requirements/repo}
    devstack=${NOVA_GPU_DEVSTACK_DEVSTACK_GIT:-/work/.mirror/openstack+devstack/repo}
    git ls-remote "$requirements" master >/dev/null 2>&1 ||
        die "no openstack/requirements at $requirements (set NOVA_GPU_DEVSTACK_REQUIREMENTS_GIT)"
    git ls-remote "$devstack" master >/dev/null 2>&1 ||
        die "no openstack/devstack at $devstack (set NOVA_GPU_DEVSTACK_DEVSTACK_GIT)"
    specs=("${SERVICES[@]}")
    EXTRA_REQUIREMENTS=$REPO/requirements.txt \
        nice -n 15 "$HERE/devstack/build-mirrors.sh" "$ROOT$CT_MIRRORS" \
        "$WORKDIR/sdists" "$requirements" "${specs[@]}"
    if [[ ! -d "$ROOT$CT_STACK_HOME/devstack/.git" ]]; then
        git clone -q "$devstack" "$ROOT$CT_STACK_HOME/devstack"
    fi
    echo "devstack: $(git -c safe.directory="*" -C "$ROOT$CT_STACK_HOME/devstack" log -1 --format='%h %cd %s')"
    # stack.sh clones them as "stack": git refuses a repository another
    # user owns.
    chown -R --reference="$ROOT$CT_STACK_HOME" "$ROOT$CT_STACK_HOME/devstack" \
        "$ROOT$CT_MIRRORS"
}

# ---------------------------------------------------------------- plugin
# The checkout as it is now, uncommitted edits included, as one commit of
# a repository of its own: devstack's enable_plugin clones a git URL.
plugin() {
    local copy=$WORKDIR/nova-gpu-src
    rm -rf "$copy" "$ROOT$CT_MIRRORS/nova-gpu.git"
    mkdir -p "$copy"
    if [[ -n "$PLUGIN_REF" ]]; then
        git -C "$REPO" archive "$PLUGIN_REF" | tar -x -C "$copy"
    else
        rsync -a --exclude .git --exclude .tox --exclude '__pycache__' \
            --exclude '*.egg-info' --exclude .stestr --exclude build \
            --exclude '*.pyc' "$REPO/" "$copy/"
    fi
    git -C "$copy" init -q -b master
    git -C "$copy" add -A
    git -C "$copy" -c user.name=devstack-check -c user.email=devstack-check@localhost \
        commit -q -m "nova-gpu working tree for devstack-check"
    git clone -q --bare "$copy" "$ROOT$CT_MIRRORS/nova-gpu.git"
    chown -R --reference="$ROOT$CT_STACK_HOME" "$ROOT$CT_MIRRORS/nova-gpu.git"
    echo "plugin: $(git -C "$copy" ls-files | wc -l) files from $REPO ${PLUGIN_REF:-(working tree)}"
}

# ---------------------------------------------------------------- boot
leader_pid() {
    # The container's PID 1: the descendant of systemd-nspawn whose pid in
    # its own namespace is 1.
    local nspawn p
    nspawn=$(cat "$NSPAWN_PID_FILE" 2>/dev/null) || return 1
    kill -0 "$nspawn" 2>/dev/null || return 1
    for p in $(pgrep -P "$nspawn"); do
        if [[ $(awk '/^NSpid/ {print $NF}' "/proc/$p/status") == 1 ]]; then
            echo "$p"
            return 0
        fi
    done
    return 1
}

# ct CMD...: a command in the container (all its namespaces, its root).
ct() {
    [[ -n "${LEADER:-}" ]] || LEADER=$(leader_pid) || die "the container is not running"
    nsenter --target "$LEADER" --mount --uts --ipc --net --pid --cgroup \
        --root --wd -- /usr/bin/env -i \
        PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        LANG=C.UTF-8 TERM=dumb "$@"
}

# ct_stack CMD...: as devstack's user, in its home.
ct_stack() {
    ct /usr/sbin/runuser -u stack -- /usr/bin/env HOME=$CT_STACK_HOME \
        USER=stack LOGNAME=stack bash -c 'cd ~ && exec "$@"' ct_stack "$@"
}

boot() {
    if LEADER=$(leader_pid); then
        echo "container already running (PID 1 is $LEADER)"
    else
        local binds=()
        [[ -c /dev/kvm ]] && binds+=(--bind=/dev/kvm)
        # Everything in the container runs at nice 15 (the machine is
        # shared): systemd's children inherit PID 1's niceness.
        setsid nice -n 15 systemd-nspawn -D "$ROOT" --register=no --keep-unit \
            -b --private-network --resolv-conf=off --console=read-only \
            --machine=nova-gpu-devstack "${binds[@]}" \
            </dev/null >"$LOGS/container.log" 2>&1 &
        echo $! > "$NSPAWN_PID_FILE"
        local _
        for _ in $(seq 1 60); do
            LEADER=$(leader_pid) && break
            sleep 1
        done
        [[ -n "${LEADER:-}" ]] || die "the container did not start (see $LOGS/container.log)"
    fi
    if ! ct ip -4 addr show tap0 2>/dev/null | grep -q "$CT_IP"; then
        slirp4netns --configure --mtu=65520 --disable-host-loopback \
            "$LEADER" tap0 >"$LOGS/slirp4netns.log" 2>&1 &
        echo $! > "$SLIRP_PID_FILE"
        local _
        for _ in $(seq 1 30); do
            ct ip -4 addr show tap0 2>/dev/null | grep -q "$CT_IP" && break
            sleep 1
        done
    fi
    ct ip -4 addr show tap0 | grep -q "$CT_IP" ||
        die "no network in the container (see $LOGS/slirp4netns.log)"
    local state="" deadline=$(( SECONDS + 300 ))
    # --wait also waits for systemd's bus, which the commands below need;
    # but right after the boot starts there is no bus yet and systemctl
    # answers at once with nothing (a fresh root's first boot): ask again.
    while [[ -z "$state" || $state == offline ]] && (( SECONDS < deadline )); do
        state=$(timeout 300 nsenter --target "$LEADER" --mount --pid -- \
            systemctl is-system-running --wait 2>/dev/null) || true
        [[ -z "$state" || $state == offline ]] && sleep 2
    done
    echo "container systemd: ${state:-unknown}"
    case $state in
        running) ;;
        degraded) ct systemctl --failed --no-legend || true ;;
        *) die "the container's systemd is '${state:-unknown}', not running (see $LOGS/container.log)" ;;
    esac
    # Unit files and qemu.conf the rootfs phase changed while a kept
    # container ran.
    ct systemctl daemon-reload
    if ct systemctl is-active --quiet libvirtd; then
        ct systemctl restart libvirtd
    fi
    ct curl -sS -o /dev/null --max-time 30 https://pypi.org/simple/pip/ ||
        die "the container cannot reach PyPI"
}

# ---------------------------------------------------------------- stack
stack() {
    sed -e "s|@HOST_IP@|$CT_IP|" -e "s|@GIT_BASE@|file://$CT_MIRRORS|" \
        -e "s|@PLUGIN_URL@|file://$CT_MIRRORS/nova-gpu.git|" \
        -e "s|@LIBVIRT_TYPE@|$LIBVIRT_TYPE|" \
        -e "s|@FAKE_HARDWARE@|$FAKE_HARDWARE|" \
        -e "s|@LIBVIRT_CPU_MODE@|$([[ $LIBVIRT_TYPE == kvm ]] && echo host-passthrough || echo none)|" \
        "$HERE/devstack/local.conf.in" > "$ROOT$CT_STACK_HOME/devstack/local.conf"
    chown --reference="$ROOT$CT_STACK_HOME" "$ROOT$CT_STACK_HOME/devstack/local.conf"
    # A stack of an earlier run (--keep, or one that failed): stack.sh
    # starts units with "systemctl start", which leaves a running one as it
    # is, on its old configuration. unstack.sh first, as an operator would.
    if [[ -f "$ROOT$CT_STACK_HOME/devstack/.stackenv" ]]; then
        echo "earlier stack found: unstack.sh first ($LOGS/unstack-before.log)"
        ct_stack bash -c 'cd devstack && ./unstack.sh' \
            >"$LOGS/unstack-before.log" 2>&1 || true
    fi
    echo "stack.sh log: $LOGS/stack.log (and $ROOT$CT_STACK_HOME/logs/)"
    ct_stack bash -c 'cd devstack && ./stack.sh' >"$LOGS/stack.log" 2>&1 || {
        tail -n 30 "$LOGS/stack.log"
        return 1
    }
    tail -n 20 "$LOGS/stack.log"
}

# ---------------------------------------------------------------- verify
# in_ct_check SCRIPT: one of this checkout's check scripts (not the
# plugin's copy: they can change between a --keep run and a --reuse one),
# with what it sources, run in the container as devstack's user.
CT_CHECKS=$CT_STACK_HOME/devstack-check
in_ct_check() {
    local script=$1 log=$LOGS/${1%.sh}.log
    install -d -m 755 "$ROOT$CT_CHECKS"
    install -m 644 "$HERE"/devstack/verify*.sh "$HERE/devstack/placements.py" \
        "$ROOT$CT_CHECKS/"
    ct_stack bash "$CT_CHECKS/$script" 2>&1 | tee "$log"
    return "${PIPESTATUS[0]}"
}
verify() { in_ct_check verify.sh; }
verify_gpu() { in_ct_check verify-gpu.sh; }
verify_restart() { in_ct_check verify-restart.sh; }

# ---------------------------------------------------------------- unstack
unstack() {
    ct_stack bash -c 'cd devstack && ./unstack.sh' >"$LOGS/unstack.log" 2>&1 || {
        tail -n 20 "$LOGS/unstack.log"; return 1; }
    ct_stack bash -c 'cd devstack && ./clean.sh' >"$LOGS/clean.log" 2>&1 || {
        tail -n 20 "$LOGS/clean.log"; return 1; }
    # What clean.sh leaves behind of devstack's units: none may still run.
    local left
    left=$(ct systemctl list-units --no-legend --state=active 'devstack@*' || true)
    [[ -z "$left" ]] || { echo "still active after clean.sh: $left"; return 1; }
    echo "unstack.sh and clean.sh done; no devstack@ unit left"
}

stop_container() {
    if LEADER=$(leader_pid); then
        ct systemctl poweroff >/dev/null 2>&1 || true
        local nspawn
        nspawn=$(cat "$NSPAWN_PID_FILE")
        for _ in $(seq 1 60); do
            kill -0 "$nspawn" 2>/dev/null || break
            sleep 1
        done
        kill -0 "$nspawn" 2>/dev/null && kill "$nspawn"
    fi
    if [[ -f "$SLIRP_PID_FILE" ]]; then
        kill "$(cat "$SLIRP_PID_FILE")" 2>/dev/null || true
        rm -f "$SLIRP_PID_FILE"
    fi
    rm -f "$NSPAWN_PID_FILE"
    echo "container stopped"
}

touch "$TIMINGS"
RUN_LINE=$(( $(wc -l < "$TIMINGS") + 1 ))
printf '# run %s libvirt=%s keep=%s reuse=%s stop=%s\n' "$(date -u +%FT%TZ)" \
    "${LIBVIRT_TYPE:-auto}" "$KEEP" "$REUSE" "$STOP" >> "$TIMINGS"
RUN_LINE=$(( RUN_LINE + 1 ))

phase prereqs prereqs
libvirt_type
if [[ $STOP == 1 ]]; then
    LEADER=$(leader_pid) || die "no container running ($NSPAWN_PID_FILE)"
    phase unstack unstack
    phase stop stop_container
    summary
    exit 0
fi
if [[ $REUSE == 1 ]]; then
    # The stack as it is; the root's settings (rootfs) again, applied by
    # boot to the running container.
    LEADER=$(leader_pid) || die "--reuse: no container running ($NSPAWN_PID_FILE)"
    phase rootfs rootfs
    phase boot boot
else
    phase rootfs rootfs
    phase mirrors mirrors
    phase plugin plugin
    phase boot boot
    phase stack stack
fi
phase_check verify verify
phase_check gpu verify_gpu
phase_check restart verify_restart
if [[ $KEEP == 1 ]]; then
    echo "kept: enter with  nsenter -t $(leader_pid) -m -u -i -n -p -C -r -w su - stack"
    echo "stop with         $0 --workdir $WORKDIR --stop"
else
    phase unstack unstack
    phase stop stop_container
fi
summary
[[ $CHECK_FAILED == 0 ]] || die "some checks failed (logs: $LOGS)"
