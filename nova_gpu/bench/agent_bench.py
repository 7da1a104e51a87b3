"""Agent benchmark: discovery + reconcile on an 8-GPU host with 32 mdevs.

Runs a real libvirtd (and mdevctl) on a fake sysfs tree, as the functional
tests do (``nova_gpu/tests/functional/agent/fakehost.py``; needs root,
libvirtd,
mdevctl, gcc). Target: discovery plus reconcile under one second.

Run with ``tox -e bench`` or ``python -m nova_gpu.bench.agent_bench``.
"""

import argparse
import statistics
import sys
import time

from nova_gpu import tables

GPUS = 8
MDEVS_PER_GPU = 4
TARGET_S = 1.0
REPEAT = 5


def _median_time(fn, repeat=REPEAT):
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def run():
    try:
        from nova_gpu.tests.functional.agent import fakehost
    except ImportError as e:
        print('SKIPPED: run from the source tree (%s)' % e)
        return None
    from nova_gpu.agent import devices
    from nova_gpu.agent import discovery
    from nova_gpu.agent import libvirt_host
    from nova_gpu.agent import reconcile
    from nova_gpu.agent import sysfs

    host = fakehost.FakeHost(lambda fs: fakehost.t4_host(fs, gpus=GPUS))
    host.setUp()
    try:
        lv = libvirt_host.LibvirtHost(host.uri)
        sfs = sysfs.Sysfs(host.fs.root)
        manager = devices.DeviceManager(sfs, lv)
        start = time.perf_counter()
        uuids = []
        for i in range(GPUS):
            parent = '0000:%02x:00.0' % (0x3b + i * 0x10)
            for _ in range(MDEVS_PER_GPU):
                uuids.append(manager.create_mdev(parent, 'nvidia-222'))
        create_s = time.perf_counter() - start
        conn = lv._connect()
        # 24 mdevs in use by 8 guests, 8 spare (within the grace period)
        for g in range(GPUS):
            conn.defineXML(host.domain_xml(
                'guest%d' % g, mdevs=uuids[g * 4:g * 4 + 3]))
        rec = reconcile.Reconciler(manager, grace_period=3600)

        def discover():
            return discovery.Discovery(sfs, None, host='bench',
                                       libvirt=lv).discover()

        inv = discover()
        mdevs = sum(len(g.mdevs) for g in inv.gpus)
        discover_s = _median_time(discover)
        reconcile_s = _median_time(rec.run)
        host.reboot()
        start = time.perf_counter()
        after = reconcile.Reconciler(manager, remove_orphans=False).run()
        reboot_s = time.perf_counter() - start
        version = lv.call('version', lambda c: c.getLibVersion())
        total = discover_s + reconcile_s
        rows = [
            ('GPUs / mdevs discovered', '%d / %d' % (len(inv.gpus), mdevs)),
            ('create 32 mdevs (define+start+autostart)', '%.3f s' % create_s),
            ('discovery (sysfs + libvirt), median of %d' % REPEAT,
             '%.3f s' % discover_s),
            ('reconcile, steady state, median of %d' % REPEAT,
             '%.3f s' % reconcile_s),
            ('discovery + reconcile', '%.3f s (target < %.1f s: %s)' % (
                total, TARGET_S, 'met' if total < TARGET_S else 'MISSED')),
            ('reconcile after reboot (restarts %d mdevs)'
             % len(after.started), '%.3f s' % reboot_s),
        ]
        print(tables.text(
            ('figure', 'value'), rows,
            'Agent on a fake 8-GPU host, real libvirtd %s + mdevctl'
            % '.'.join(str(version // 10 ** k % 1000) for k in (6, 3, 0))))
        lv.close()
        return total < TARGET_S and len(after.started) == len(uuids)
    finally:
        host.cleanUp()


def main(argv=None):
    argparse.ArgumentParser(
        prog='python -m nova_gpu.bench.agent_bench',
        description=__doc__.splitlines()[0]).parse_args(argv)
    return 0 if run() is not False else 1


if __name__ == '__main__':
    sys.exit(main())
