#!/bin/sh
# Run libvirtd in a private mount namespace where the fake sysfs tree $1 is
# /sys, /run and libvirt's state are private tmpfs, and mdevctl keeps its
# definitions in $2/mdevctl.d. Usage (inside `unshare -m --propagation
# private`): libvirtd_in_ns.sh FAKE_SYS STATE_DIR LIBVIRTD_CONF
set -eu
fake_sys=$1
state=$2
conf=$3
# Keep the real cgroup and CPU topology: libvirtd's QEMU driver reads them.
mount --rbind /sys/fs/cgroup "$fake_sys/fs/cgroup"
mount --bind /sys/devices/system "$fake_sys/devices/system"
mount --bind "$fake_sys" /sys
mount -t tmpfs nova-gpu-test-run /run
mkdir -p /run/udev /run/libvirt "$state/mdevctl.d/scripts.d/callouts" \
    "$state/mdevctl.d/scripts.d/notifiers" "$state/lib" \
    "$state/etc-qemu" "$state/cache" "$state/log"
# libudev only listens to udev events when udevd appears to run.
touch /run/udev/control
mount --bind "$state/mdevctl.d" /etc/mdevctl.d
mount --bind "$state/lib" /var/lib/libvirt
mount --bind "$state/etc-qemu" /etc/libvirt/qemu
mount --bind "$state/cache" /var/cache/libvirt
mkdir -p /var/log/libvirt
mount --bind "$state/log" /var/log/libvirt
if [ -n "${NOVA_GPU_TEST_HIDE_MDEVCTL:-}" ]; then
    # Simulate a host without mdevctl: libvirtd cannot find it any more.
    mount --bind /dev/null "$(command -v mdevctl)"
fi
exec libvirtd --config "$conf" --pid-file "$state/libvirtd.pid"
