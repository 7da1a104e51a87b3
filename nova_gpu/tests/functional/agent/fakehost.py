"""A real libvirtd (and mdevctl) on a fake GPU host, for functional tests.

libvirtd runs in a private mount namespace where the test's fake sysfs
tree is bind-mounted over /sys and /run, mdevctl's /etc/mdevctl.d and
libvirt's state directories are private. An LD_PRELOAD shim makes libudev
accept the tree as sysfs. The test talks to libvirtd over a UNIX socket in
its temporary directory, and reads/writes the same tree at its own path.

Because nothing in the kernel reacts to writes in a plain directory,
``fakesys.FakeKernel`` makes mdevs appear when mdevctl writes their UUID to
``create`` (and go on ``remove``) and ``fakesys.UdevAnnouncer`` tells
libvirtd, as udevd would, over a netlink group of the host's own
(``UdevGroup``; the shim moves libvirtd's udev monitor there).

Missing prerequisites make the fixture fail with a message naming them:
these tests must run for real (as root, as CI does), never be skipped.
"""

import errno
import fcntl
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time

import fixtures

from nova_gpu.tests.unit.agent import fakesys

HERE = os.path.dirname(os.path.abspath(__file__))
REQUIRED = ('libvirtd', 'mdevctl', 'unshare', 'gcc', 'mount')

LIBVIRTD_CONF = """\
unix_sock_dir = "{sock}"
unix_sock_group = "root"
unix_sock_rw_perms = "0700"
auth_unix_rw = "none"
auth_unix_ro = "none"
log_outputs = "3:file:{log}"
"""


def check_prerequisites():
    missing = [c for c in REQUIRED if shutil.which(c) is None
               and not os.path.exists('/usr/sbin/' + c)]
    problems = []
    if missing:
        problems.append('missing commands: %s (install the packages in '
                        'bindep.txt: libvirt-daemon-system mdevctl gcc '
                        'util-linux)' % ', '.join(missing))
    if os.geteuid() != 0:
        problems.append('must run as root (private mount namespace, '
                        'libvirtd)')
    try:
        import libvirt  # noqa: F401
    except ImportError:
        problems.append('libvirt-python is not installed (pip install '
                        '.[compute]; needs libvirt-dev, pkg-config, gcc)')
    if problems:
        raise RuntimeError('functional agent tests cannot run: '
                           + '; '.join(problems))


class UdevGroup(fixtures.Fixture):
    """A netlink group no other fake host on this machine uses.

    Netlink groups are machine-wide: with udevd's group shared, every
    libvirtd of the tests running at once took every other host's mdev
    events for its own, and spent a second on each (its udev thread waits
    for the mdev's sysfs files), enough to time out the waits of the
    agent. A lock file per group keeps it ours (bit 0 is the kernel's,
    bit 1 udevd's).
    """

    def _setUp(self):
        for bit in range(2, 32):
            path = os.path.join(tempfile.gettempdir(),
                                'nova-gpu-test-udev-group-%d.lock' % bit)
            lock = open(path, 'w')
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                lock.close()
                if e.errno in (errno.EAGAIN, errno.EACCES):
                    continue
                raise
            self.addCleanup(lock.close)
            self.mask = 1 << bit
            return
        raise RuntimeError('more than 30 fake hosts at once: no netlink '
                           'group left for their udev events')


class FakeHost(fixtures.Fixture):
    """``build(fs)`` fills the fake sysfs tree before libvirtd starts."""

    def __init__(self, build, hide_mdevctl=False):
        super().__init__()
        self.build = build
        self.hide_mdevctl = hide_mdevctl
        self.proc = None

    def _setUp(self):
        check_prerequisites()
        self.dir = tempfile.mkdtemp(prefix='ngpu-')
        self.addCleanup(shutil.rmtree, self.dir, ignore_errors=True)
        self.fs = fakesys.FakeSysfs(os.path.join(self.dir, 'sys'))
        self.build(self.fs)
        self.state = os.path.join(self.dir, 'state')
        self.sock = os.path.join(self.dir, 'sock')
        os.makedirs(self.state)
        os.makedirs(self.sock)
        self.shim = os.path.join(self.dir, 'fake_sysfs_statfs.so')
        subprocess.run(['gcc', '-shared', '-fPIC', '-O2', '-o', self.shim,
                        os.path.join(HERE, 'fake_sysfs_statfs.c'), '-ldl'],
                       check=True, capture_output=True)
        self.conf = os.path.join(self.dir, 'libvirtd.conf')
        self.log = os.path.join(self.dir, 'libvirtd.log')
        with open(self.conf, 'w') as f:
            f.write(LIBVIRTD_CONF.format(sock=self.sock, log=self.log))
        self.uri = 'qemu+unix:///system?socket=%s/libvirt-sock' % self.sock
        self.udev_group = self.useFixture(UdevGroup()).mask
        self.announcer = fakesys.UdevAnnouncer(self.fs, self.udev_group)
        self.addCleanup(self.announcer.close)
        self.kernel = fakesys.FakeKernel(self.fs, self.announcer).start()
        self.addCleanup(self.kernel.stop)
        self.start_libvirtd()
        self.addCleanup(self.stop_libvirtd)

    def start_libvirtd(self, timeout=30):
        env = dict(os.environ, LD_PRELOAD=self.shim,
                   NOVA_GPU_TEST_UDEV_GROUPS=str(self.udev_group))
        if self.hide_mdevctl:
            env['NOVA_GPU_TEST_HIDE_MDEVCTL'] = '1'
        sock = os.path.join(self.sock, 'libvirt-sock')
        if os.path.exists(sock):
            os.unlink(sock)
        self.proc = subprocess.Popen(
            ['unshare', '-m', '--propagation', 'private',
             os.path.join(HERE, 'libvirtd_in_ns.sh'),
             self.fs.root, self.state, self.conf],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        import libvirt
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError('libvirtd exited (%s): %s' % (
                    self.proc.returncode, self.proc.stdout.read().decode()))
            if os.path.exists(sock):
                try:
                    conn = libvirt.open(self.uri)
                    try:
                        if self._definitions_loaded(conn):
                            return
                    finally:
                        conn.close()
                except libvirt.libvirtError:
                    pass
            if time.monotonic() > deadline:
                self.stop_libvirtd()
                raise RuntimeError('libvirtd did not answer on %s, or not '
                                   'list the defined mdevs, within %ds; its '
                                   'log ends:\n%s'
                                   % (sock, timeout, self.log_tail()))
            time.sleep(0.05)

    def _definitions_loaded(self, conn):
        """Whether libvirtd lists every mdev mdevctl has a definition of.

        libvirtd answers before its node-device driver has asked mdevctl
        for the defined mdevs (``nodeStateInitializeEnumerate`` runs in a
        thread): a host that just booted is only up once they are known,
        as systemd orders the agent after libvirtd.
        """
        import libvirt
        defined = {name for _d, _s, names in os.walk(
            os.path.join(self.state, 'mdevctl.d')) for name in names
            if len(name) == 36 and name.count('-') == 4}
        listed = set()
        for dev in conn.listAllDevices(
                libvirt.VIR_CONNECT_LIST_NODE_DEVICES_CAP_MDEV):
            found = re.search(r'<uuid>([0-9a-f-]{36})</uuid>',
                              dev.XMLDesc(0))
            if found:
                listed.add(found.group(1))
        return defined <= listed

    def log_tail(self, lines=40):
        """The end of libvirtd's log, for failure messages."""
        try:
            with open(self.log) as f:
                return ''.join(f.readlines()[-lines:])
        except OSError:
            return ''

    def stop_libvirtd(self):
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        self.proc.stdout.close()

    def reboot(self):
        """Power cycle: libvirtd stops, every active mdev is gone (kernel
        state), definitions in /etc/mdevctl.d stay; libvirtd starts again.
        """
        self.stop_libvirtd()
        for uuid in self.fs.mdevs():
            self.fs.remove_mdev(uuid)
        self.start_libvirtd()

    def domain_xml(self, name, mdevs=(), pci=()):
        from lxml import etree

        from nova_gpu.agent import xmlbuild
        dom = etree.Element('domain', type='qemu')
        etree.SubElement(dom, 'name').text = name
        etree.SubElement(dom, 'memory', unit='MiB').text = '64'
        os_el = etree.SubElement(dom, 'os')
        etree.SubElement(os_el, 'type', arch='x86_64').text = 'hvm'
        devices = etree.SubElement(dom, 'devices')
        for uuid in mdevs:
            devices.append(etree.fromstring(xmlbuild.mdev_hostdev(uuid)))
        for addr in pci:
            devices.append(etree.fromstring(xmlbuild.pci_hostdev(addr)))
        return etree.tostring(dom, encoding='unicode')


def t4_host(fs, gpus=1):
    """GPUs with mdev parents (Turing-style): T4 with two GRID types."""
    for i in range(gpus):
        addr = '0000:%02x:00.0' % (0x3b + i * 0x10)
        fs.add_pci(addr, '0x1eb8', numa_node=i % 2)
        fs.add_mdev_type(addr, 'nvidia-222', 'GRID T4-1Q', 16)
        fs.add_mdev_type(addr, 'nvidia-223', 'GRID T4-2Q', 8)
