"""A fake Linux sysfs tree of GPU hosts, for tests.

It stands in for the kernel and the NVIDIA driver only: PCI functions with
NUMA nodes, IOMMU groups and drivers, mdev parents with their supported
types, SR-IOV virtual functions with NVIDIA's vendor VFIO files, and mdev
devices. Every symlink is relative, so the same tree reads the same whether
it is seen at its own path or bind-mounted over ``/sys``.
"""

import os
import select
import socket
import struct
import threading
import time

PCI_CONFIG = bytes(64)  # header only; no capabilities list


def acs_config(control):
    """A 4 KiB config space whose one extended capability is ACS (ID
    0x000d, version 1) with Control register ``control``.
    """
    config = bytearray(4096)
    struct.pack_into('<IHH', config, 0x100, 0x000d | 1 << 16, 0x5f,
                     control)
    return bytes(config)


def _write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, 'w') as f:
        f.write(text)


def _link(target_rel_to_root, link_path, root):
    os.makedirs(os.path.dirname(link_path), exist_ok=True)
    target = os.path.relpath(os.path.join(root, target_rel_to_root),
                             os.path.dirname(link_path))
    if os.path.lexists(link_path):
        os.unlink(link_path)
    os.symlink(target, link_path)


class FakeSysfs:
    """Builds and mutates the tree under ``root`` (a ``.../sys`` dir)."""

    def __init__(self, root):
        self.root = root
        self._groups = 0
        self.mdev_types = {}  # (parent addr, type id) -> max instances
        for sub in ('bus/pci/drivers/nvidia', 'bus/pci/drivers/vfio-pci',
                    'bus/mdev/devices', 'bus/mdev/drivers/vfio_mdev',
                    'class/mdev_bus', 'kernel/iommu_groups',
                    'devices/system', 'fs/cgroup', 'devices/virtual'):
            os.makedirs(os.path.join(root, sub), exist_ok=True)

    def path(self, *parts):
        return os.path.join(self.root, *parts)

    # -- PCI --------------------------------------------------------------

    def dev_rel(self, addr):
        return self._devs[addr]

    _devs = None

    def add_pci(self, addr, device_id, vendor='0x10de', numa_node=0,
                bridges=None, driver='nvidia', pci_class='0x030200',
                iommu_group=None, parent_rel=None, config=None):
        """Add a PCI function below ``bridges`` (root port first).

        ``config``: its config space (bytes; default the 64-byte header
        an unprivileged reader gets).
        """
        if self._devs is None:
            self._devs = {}
        if parent_rel is None:
            if bridges is None:
                bridges = ('%s%02x:01.0' % (addr[:5], int(addr[5:7], 16) - 1),)
            parent_rel = 'devices/pci%s' % bridges[0][:7]
            for bridge in bridges:
                parent_rel += '/' + bridge
                if not os.path.exists(self.path(parent_rel, 'uevent')):
                    _write(self.path(parent_rel, 'uevent'),
                           'PCI_SLOT_NAME=%s\n' % bridge)
        rel = '%s/%s' % (parent_rel, addr)
        self._devs[addr] = rel
        d = self.path(rel)
        os.makedirs(d, exist_ok=True)
        dev = device_id.lower().removeprefix('0x')
        ven = vendor.lower().removeprefix('0x')
        _write(os.path.join(d, 'uevent'),
               'DRIVER=%s\nPCI_CLASS=%X\nPCI_ID=%s:%s\n'
               'PCI_SUBSYS_ID=%s:1234\nPCI_SLOT_NAME=%s\n'
               'MODALIAS=pci:v0000%sd0000%ssv0000%ssd00001234bc03sc02i00\n'
               % (driver, int(pci_class, 16), ven.upper(), dev.upper(),
                  ven.upper(), addr, ven.upper(), dev.upper(), ven.upper()))
        for name, value in (('vendor', '0x' + ven), ('device', '0x' + dev),
                            ('class', pci_class), ('numa_node',
                                                   str(numa_node)),
                            ('subsystem_vendor', '0x' + ven),
                            ('subsystem_device', '0x1234'),
                            ('enable', '1'), ('local_cpulist', '0-7')):
            _write(os.path.join(d, name), value + '\n')
        with open(os.path.join(d, 'config'), 'wb') as f:
            f.write(bytes.fromhex(ven)[::-1] + bytes.fromhex(dev)[::-1]
                    + (config or PCI_CONFIG)[4:])
        _link('bus/pci', os.path.join(d, 'subsystem'), self.root)
        _link(rel, self.path('bus/pci/devices', addr), self.root)
        if iommu_group is None:
            iommu_group = self._groups
            self._groups += 1
        self._groups = max(self._groups, iommu_group + 1)
        group = 'kernel/iommu_groups/%d' % iommu_group
        os.makedirs(self.path(group, 'devices'), exist_ok=True)
        _link(group, os.path.join(d, 'iommu_group'), self.root)
        _link(rel, self.path(group, 'devices', addr), self.root)
        if driver:
            self.bind_driver(addr, driver)
        return d

    def _free_group(self):
        used = {int(n) for n in os.listdir(self.path('kernel/iommu_groups'))}
        group = max(used | {self._groups - 1}) + 1
        self._groups = group + 1
        return group

    def bind_driver(self, addr, driver):
        d = self.path(self._devs[addr])
        link = os.path.join(d, 'driver')
        if os.path.lexists(link):
            os.unlink(link)
        if driver:
            os.makedirs(self.path('bus/pci/drivers', driver), exist_ok=True)
            _link('bus/pci/drivers/' + driver, link, self.root)

    # -- mdev parents -----------------------------------------------------

    def add_mdev_type(self, addr, type_id, name, instances,
                      description='', device_api='vfio-pci'):
        d = self.path(self._devs[addr], 'mdev_supported_types', type_id)
        _write(os.path.join(d, 'name'), name + '\n')
        _write(os.path.join(d, 'description'), description + '\n')
        _write(os.path.join(d, 'device_api'), device_api + '\n')
        _write(os.path.join(d, 'available_instances'), '%d\n' % instances)
        # A FIFO, so that every write (one UUID each) reaches the fake
        # kernel on its own, as writes to the real attribute do.
        if not os.path.exists(os.path.join(d, 'create')):
            os.mkfifo(os.path.join(d, 'create'))
        os.makedirs(os.path.join(d, 'devices'), exist_ok=True)
        _link(self._devs[addr], self.path('class/mdev_bus', addr), self.root)
        self.mdev_types[(addr, type_id)] = instances

    def available(self, addr, type_id):
        with open(self.path(self._devs[addr], 'mdev_supported_types',
                            type_id, 'available_instances')) as f:
            return int(f.read())

    def _set_available(self, addr, type_id, value):
        # Replace atomically: a reader must never see an empty file.
        path = self.path(self._devs[addr], 'mdev_supported_types', type_id,
                         'available_instances')
        _write(path + '.new', '%d\n' % value)
        os.rename(path + '.new', path)

    # -- NVIDIA vendor VFIO on SR-IOV VFs --------------------------------

    def add_vfs(self, addr, count, creatable, first_fn=4):
        """Add ``count`` NVIDIA vendor VFIO VFs of ``addr`` (vGPU 17+).

        Each VF has ``nvidia/creatable_vgpu_types`` (``creatable`` maps
        id -> name) and ``nvidia/current_vgpu_type`` (0: no type yet).
        """
        vfs = self._add_sriov_vfs(addr, count, first_fn)
        for vf in vfs:
            nv = self.path(self._devs[vf], 'nvidia')
            _write(os.path.join(nv, 'creatable_vgpu_types'),
                   'ID    : vGPU Name\n' + ''.join(
                       '%-5s : %s\n' % (k, v)
                       for k, v in sorted(creatable.items())))
            _write(os.path.join(nv, 'current_vgpu_type'), '0\n')
        return vfs

    def add_mdev_vfs(self, addr, count, types, first_fn=4):
        """Add ``count`` VFs of ``addr`` that are mdev parents (SR-IOV +
        mdev, NVIDIA vGPU 16 and older); ``types`` maps type id ->
        (name, instances), usually 1 instance per VF.
        """
        vfs = self._add_sriov_vfs(addr, count, first_fn)
        for vf in vfs:
            for type_id, (name, instances) in sorted(types.items()):
                self.add_mdev_type(vf, type_id, name, instances)
        return vfs

    def set_vgpu_type(self, vf, type_id):
        """What writing ``nvidia/current_vgpu_type`` of a VF leaves."""
        _write(self.path(self._devs[vf], 'nvidia', 'current_vgpu_type'),
               '%d\n' % type_id)

    # -- PCIe switches and RDMA NICs (GPUDirect RDMA, agent.pcie) ---------

    def add_pcie_switch(self, root_port, upstream, downstream, device,
                        vendor='0x1000', acs_control=None, numa_node=0):
        """Add a root port and a PCIe switch below it: its upstream port
        and ``downstream`` ports, PCI-to-PCI bridges (class 0x0604).

        ``acs_control``: the ACS Control register of every downstream
        port, in a 4 KiB config space as root reads it (None: the 64-byte
        header an unprivileged reader gets, ACS unreadable). Devices go
        below with ``bridges=(root_port, upstream, downstream[k])``.
        """
        rel = 'devices/pci%s' % root_port[:7]
        for addr, config in ((root_port, None), (upstream, None)):
            self.add_pci(addr, device if addr == upstream else '0x1bb2',
                         vendor=vendor if addr == upstream else '0x8086',
                         numa_node=numa_node, driver='pcieport',
                         pci_class='0x060400', parent_rel=rel,
                         config=config)
            rel = self._devs[addr]
        for port in downstream:
            self.add_pci(port, device, vendor=vendor, numa_node=numa_node,
                         driver='pcieport', pci_class='0x060400',
                         parent_rel=rel, config=None if acs_control is None
                         else acs_config(acs_control))

    def add_nic(self, addr, bridges, vfs, device_id='0x1021',
                vf_device='0x101e', numa_node=0, pci_class='0x020700'):
        """Add an RDMA NIC PF (ConnectX-7 by default, InfiniBand class)
        with ``vfs`` SR-IOV VFs bound to ``mlx5_core``; returns the VFs.
        """
        self.add_pci(addr, device_id, vendor='0x15b3', numa_node=numa_node,
                     bridges=bridges, driver='mlx5_core',
                     pci_class=pci_class)
        return self._add_sriov_vfs(addr, vfs, 1, vendor='0x15b3',
                                   device_id=vf_device, driver='mlx5_core',
                                   pci_class=pci_class)

    def _add_sriov_vfs(self, addr, count, first_fn, vendor='0x10de',
                       device_id=None, driver='nvidia',
                       pci_class='0x030200'):
        vfs = []
        parent_rel = os.path.dirname(self._devs[addr])
        with open(self.path(self._devs[addr], 'device')) as f:
            dev = device_id or f.read().strip()
        with open(self.path(self._devs[addr], 'numa_node')) as f:
            numa = int(f.read())
        _write(self.path(self._devs[addr], 'sriov_totalvfs'), '%d\n' % count)
        _write(self.path(self._devs[addr], 'sriov_numvfs'), '%d\n' % count)
        for i in range(count):
            fn = first_fn + i
            vf = '%s%02x.%d' % (addr[:8], fn // 8, fn % 8)
            self.add_pci(vf, dev, vendor=vendor, numa_node=numa,
                         driver=driver, pci_class=pci_class,
                         parent_rel=parent_rel)
            _link(self._devs[addr], self.path(self._devs[vf], 'physfn'),
                  self.root)
            _link(self._devs[vf], self.path(self._devs[addr],
                                            'virtfn%d' % i), self.root)
            vfs.append(vf)
        return vfs

    # -- what the kernel does on writes -----------------------------------

    def materialise_mdev(self, addr, type_id, uuid):
        rel = '%s/%s' % (self._devs[addr], uuid)
        d = self.path(rel)
        os.makedirs(d)
        group = self._free_group()
        grel = 'kernel/iommu_groups/%d' % group
        os.makedirs(self.path(grel, 'devices'))
        _link(rel, self.path(grel, 'devices', uuid), self.root)
        _link(grel, os.path.join(d, 'iommu_group'), self.root)
        _link('%s/mdev_supported_types/%s' % (self._devs[addr], type_id),
              os.path.join(d, 'mdev_type'), self.root)
        _link('bus/mdev', os.path.join(d, 'subsystem'), self.root)
        _link('bus/mdev/drivers/vfio_mdev', os.path.join(d, 'driver'),
              self.root)
        _write(os.path.join(d, 'uevent'),
               'DRIVER=vfio_mdev\nMDEV_TYPE=%s\n' % type_id)
        _write(os.path.join(d, 'remove'), '')
        _link(rel, self.path('bus/mdev/devices', uuid), self.root)
        _link(rel, self.path(self._devs[addr], 'mdev_supported_types',
                             type_id, 'devices', uuid), self.root)
        self._set_available(addr, type_id,
                            self.available(addr, type_id) - 1)
        return rel

    def remove_mdev(self, uuid):
        link = self.path('bus/mdev/devices', uuid)
        d = os.path.realpath(link)
        rel = os.path.relpath(d, self.root)
        type_dir = os.path.realpath(os.path.join(d, 'mdev_type'))
        group = os.path.realpath(os.path.join(d, 'iommu_group'))
        addr = os.path.basename(os.path.dirname(d))
        type_id = os.path.basename(type_dir)
        os.unlink(link)
        os.unlink(os.path.join(type_dir, 'devices', uuid))
        for name in os.listdir(group + '/devices'):
            os.unlink(os.path.join(group, 'devices', name))
        os.rmdir(group + '/devices')
        os.rmdir(group)
        for name in os.listdir(d):
            os.unlink(os.path.join(d, name))
        os.rmdir(d)
        self._set_available(addr, type_id,
                            self.available(addr, type_id) + 1)
        return rel

    def mdevs(self):
        return sorted(os.listdir(self.path('bus/mdev/devices')))


class FakeKernel:
    """Reacts to writes into the tree the way the kernel would.

    mdevctl (run by libvirtd) writes a UUID into ``.../<type>/create`` or
    ``1`` into ``.../<uuid>/remove``; nothing in a plain directory reacts,
    so this thread polls those files and makes the device appear or go,
    then announces it with ``notify(action, rel_path)``.
    """

    def __init__(self, sysfs, notify=None, interval=0.005):
        self.sysfs = sysfs
        self.notify = notify
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.errors = []

    def start(self):
        self._thread.start()
        return self

    def stop(self):
        self._stop.set()
        self._thread.join(5)

    def _run(self):
        fds = {}
        try:
            while not self._stop.is_set():
                try:
                    self.poll(fds)
                except Exception as e:  # keep serving; the test reports it
                    self.errors.append(e)
        finally:
            for fd in fds:
                os.close(fd)

    def poll(self, fds=None):
        fs = self.sysfs
        fds = {} if fds is None else fds
        if len(fds) != len(fs.mdev_types):
            opened = set(fds.values())
            for key in fs.mdev_types:
                if key not in opened:
                    path = fs.path(fs.dev_rel(key[0]), 'mdev_supported_types',
                                   key[1], 'create')
                    # O_RDWR: never blocks, never sees end-of-file
                    fds[os.open(path, os.O_RDWR | os.O_NONBLOCK)] = key
        ready = select.select(list(fds), [], [], self.interval)[0] \
            if fds else time.sleep(self.interval) or []
        for fd in ready:
            addr, type_id = fds[fd]
            text = os.read(fd, 4096).decode()
            for uuid in text.split():
                if fs.available(addr, type_id) > 0 and not \
                        os.path.lexists(fs.path('bus/mdev/devices', uuid)):
                    rel = fs.materialise_mdev(addr, type_id, uuid)
                    if self.notify:
                        self.notify('add', rel)
        for uuid in fs.mdevs():
            remove = fs.path('bus/mdev/devices', uuid, 'remove')
            try:
                with open(remove) as f:
                    text = f.read().strip()
            except FileNotFoundError:
                continue
            if text == '1':
                rel = fs.remove_mdev(uuid)
                if self.notify:
                    self.notify('remove', rel)


UDEV_GROUP = 2


class UdevAnnouncer:
    """Sends udev events the way udevd does, so libvirtd's monitor sees
    devices come and go in the fake tree (netlink group 2, libudev header).
    """

    NETLINK_KOBJECT_UEVENT = 15
    MAGIC = 0xfeedcafe

    def __init__(self, sysfs, groups=UDEV_GROUP):
        """``groups``: the netlink group mask to send to (the fake
        host's own group; see ``fakehost.UdevGroup``).
        """
        self.sysfs = sysfs
        self.groups = groups
        self.seqnum = 1000
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW,
                                  self.NETLINK_KOBJECT_UEVENT)
        self.sock.bind((0, 0))

    def close(self):
        self.sock.close()

    def __call__(self, action, rel):
        self.seqnum += 1
        subsystem = os.path.basename(os.readlink(
            os.path.join(self.sysfs.root, rel, 'subsystem'))) \
            if action != 'remove' else 'mdev'
        props = {'ACTION': action, 'DEVPATH': '/' + rel,
                 'SUBSYSTEM': subsystem, 'SEQNUM': str(self.seqnum)}
        uevent = os.path.join(self.sysfs.root, rel, 'uevent')
        if os.path.exists(uevent):
            with open(uevent) as f:
                for line in f:
                    key, _, value = line.strip().partition('=')
                    if key:
                        props.setdefault(key, value)
        body = b''.join(('%s=%s' % kv).encode() + b'\0'
                        for kv in props.items())
        header = (b'libudev\0' + struct.pack('>I', self.MAGIC)
                  + struct.pack('=7I', 40, 40, len(body), 0, 0, 0, 0))
        self.sock.sendto(header + body, (0, self.groups))
