"""The PCIe layout of an HGX H100 8-GPU server, for the fake sysfs.

Layout modelled after NVIDIA's DGX H100 user guide topology (the system
diagram and ``nvidia-smi topo -m`` of DGX H100: each GPU shares a PCIe
switch with the ConnectX-7 NIC of its compute network port, ``PIX``):
four PCIe switches, each holding two H100 SXM5 GPUs and two ConnectX-7
NICs, two switches per CPU socket. Not copied from a real machine: the
bus numbers are made up, the switches' root ports are simplified to two
per root complex (one host bridge per socket), and the switch ports use
the Broadcom PEX89000 (Atlas 2) ID. The device IDs are the real ones:

* H100 SXM5 80GB: 10de:2330 (the catalog's ``H100-80GB``)
* ConnectX-7 PF: 15b3:1021, its SR-IOV VFs: 15b3:101e
* Broadcom PEX89000 switch ports: 1000:c030
"""

import dataclasses

GPU_VENDOR = '0x10de'
H100_SXM5 = '0x2330'
CX7 = '0x1021'
CX7_VF = '0x101e'
SWITCH_VENDOR = '0x1000'
PEX89000 = '0xc030'


@dataclasses.dataclass(frozen=True)
class SwitchLayout:
    """One PCIe switch: its root port, its ports, what hangs below."""

    root_port: str
    upstream: str
    downstream: tuple
    gpus: tuple
    nics: tuple
    numa_node: int

    @property
    def root(self):
        """The root complex (host bridge) sysfs names it by."""
        return 'pci' + self.root_port[:7]


SWITCHES = (
    SwitchLayout('0000:10:01.0', '0000:11:00.0',
                 ('0000:12:00.0', '0000:12:01.0', '0000:12:02.0',
                  '0000:12:03.0'),
                 ('0000:13:00.0', '0000:14:00.0'),
                 ('0000:15:00.0', '0000:16:00.0'), 0),
    SwitchLayout('0000:10:02.0', '0000:21:00.0',
                 ('0000:22:00.0', '0000:22:01.0', '0000:22:02.0',
                  '0000:22:03.0'),
                 ('0000:23:00.0', '0000:24:00.0'),
                 ('0000:25:00.0', '0000:26:00.0'), 0),
    SwitchLayout('0000:90:01.0', '0000:91:00.0',
                 ('0000:92:00.0', '0000:92:01.0', '0000:92:02.0',
                  '0000:92:03.0'),
                 ('0000:93:00.0', '0000:94:00.0'),
                 ('0000:95:00.0', '0000:96:00.0'), 1),
    SwitchLayout('0000:90:02.0', '0000:a1:00.0',
                 ('0000:a2:00.0', '0000:a2:01.0', '0000:a2:02.0',
                  '0000:a2:03.0'),
                 ('0000:a3:00.0', '0000:a4:00.0'),
                 ('0000:a5:00.0', '0000:a6:00.0'), 1),
)

GPUS = tuple(g for sw in SWITCHES for g in sw.gpus)
NICS = tuple(n for sw in SWITCHES for n in sw.nics)


def switch_of(address):
    """The SwitchLayout a GPU or NIC sits below."""
    return next(sw for sw in SWITCHES
                if address in sw.gpus or address in sw.nics)


def build(fs, vfs=8, acs_control=None, gpu_driver='vfio-pci',
          without_nics=False):
    """Add the layout to ``fs`` (a ``fakesys.FakeSysfs``): switches,
    GPUs, NICs with ``vfs`` VFs each. Returns {NIC address: [VFs]}.

    ``acs_control``: every downstream port's ACS Control register (None:
    unreadable, as an unprivileged reader sees it). ``without_nics``: the
    same board with its NICs removed (a host that pairs nothing).
    """
    nic_vfs = {}
    for sw in SWITCHES:
        fs.add_pcie_switch(sw.root_port, sw.upstream, sw.downstream,
                           PEX89000, vendor=SWITCH_VENDOR,
                           acs_control=acs_control, numa_node=sw.numa_node)
        ports = iter(sw.downstream)
        for gpu in sw.gpus:
            fs.add_pci(gpu, H100_SXM5, vendor=GPU_VENDOR,
                       numa_node=sw.numa_node, driver=gpu_driver,
                       bridges=(sw.root_port, sw.upstream, next(ports)))
        for nic in sw.nics:
            port = next(ports)
            if without_nics:
                continue
            nic_vfs[nic] = fs.add_nic(
                nic, (sw.root_port, sw.upstream, port), vfs,
                device_id=CX7, vf_device=CX7_VF, numa_node=sw.numa_node)
    return nic_vfs


def tree(nodename='hgx', vfs=8, used=None, acs_redirect=None,
         without_nics=False):
    """The layout as the agent reports it (``core.rdma.PcieTree``), for
    tests without a sysfs: ``used`` maps NIC index (0..7) to VFs held.
    """
    from nova_gpu.core import rdma
    from nova_gpu.core import report
    used = used or {}
    nics = [] if without_nics else [
        rdma.Nic(nic, sw.upstream, sw.root, vfs, used.get(NICS.index(nic), 0),
                 report.pci_provider_name(nodename, nic),
                 '%s:%s' % ('15b3', CX7[2:]))
        for sw in SWITCHES for nic in sw.nics]
    return rdma.PcieTree(
        [(switch_of(g).upstream, switch_of(g).root) for g in GPUS], nics,
        [rdma.Switch(sw.upstream, sw.root, acs_redirect,
                     '%s:%s' % (SWITCH_VENDOR[2:], PEX89000[2:]))
         for sw in SWITCHES])
