"""GPUDirect RDMA: each GPU with a NIC function behind the same PCIe switch.

GPUDirect RDMA moves data between a GPU and an RDMA NIC (ConnectX, over
InfiniBand or RoCE) without the host's memory. It is fastest when both sit
below one PCIe switch: the transfers stay in the switch. Across the root
complex they cross the CPU's PCIe fabric, and across sockets the
inter-socket link. On an HGX H100 board each of four PCIe switches holds
two GPUs and two ConnectX-7 NICs, so a guest given GPU 0 should be given a
VF of the NIC beside it, not of one on the other socket.

A flavor asks for it with ``gpu:rdma=true`` (``core.flavor``): each of its
GPUs gets one NIC function (an SR-IOV VF) in the same *locality domain*:
the PCIe switch (``pcie-switch``) or the root complex (``root-complex``),
as ``[gpu_scheduler] rdma_locality`` says. The host's agent reads the PCIe
tree from sysfs (``nova_gpu.agent.pcie``) and reports it (``pcie`` in the
report, ``core.report``): each GPU's switch and root complex, each NIC PF
with its switch, root complex, VFs and the VFs guests hold, and each
switch's ACS state. A switch whose downstream ports redirect peer-to-peer
requests upstream (ACS P2P Request Redirect on, without Direct Translated
P2P) sends GPU-NIC traffic through the root complex anyway: it pairs
nothing at ``pcie-switch`` scope.

This module is the one rule, for the engine (which GPU sets can be paired,
what a choice costs in pairs), the scheduler (which NIC providers
Placement offered pair with which GPUs) and the docs' examples: no
OpenStack here.
"""

import collections
import typing

from nova_gpu.core import exceptions

PCIE_SWITCH = 'pcie-switch'
ROOT_COMPLEX = 'root-complex'
SCOPES = (PCIE_SWITCH, ROOT_COMPLEX)
DEFAULT_SCOPE = PCIE_SWITCH

# Bounds of a reported tree (a report is untrusted input): an HGX board
# has 4 to 8 switches and 8 to 10 RDMA NICs; a PF has at most 256 VFs.
# At most one switch per GPU and per NIC.
MAX_NICS = 64
MAX_SWITCHES = 64 + MAX_NICS
MAX_VFS = 256

# Topology penalty per free GPU-NIC pair a choice breaks beyond the pairs
# the request itself takes: as much as spanning one more NUMA node
# (topology.penalty), the same price as a lost NVSwitch partition.
LOST_PAIR = 0.1


class Nic(typing.NamedTuple):
    """One RDMA NIC physical function and its VFs.

    ``provider``: the name of the Placement provider Nova makes for the
    PF's VFs (``<hypervisor hostname>_<PF address>``, Nova's PCI in
    Placement), or None when they are not in Placement.
    """

    address: str
    switch: str = None
    root: str = None
    vfs: int = 0
    vfs_used: int = 0
    provider: str = None
    device: str = None  # vendor:device, e.g. 15b3:1021

    @property
    def vfs_free(self):
        return max(self.vfs - self.vfs_used, 0)


class Switch(typing.NamedTuple):
    """A PCIe switch, named by its upstream port's address.

    ``acs_redirect``: its downstream ports redirect peer-to-peer requests
    to the root complex (True), do not (False), or the agent could not
    read their ACS capability (None: treated as not redirecting).
    """

    id: str
    root: str = None
    acs_redirect: bool = None
    device: str = None


class PcieTree:
    """A host's PCIe tree as far as RDMA pairing needs it: immutable.

    ``gpus[i]`` is ``(switch, root)`` of host GPU ``i`` (either None when
    unknown or absent).
    """

    __slots__ = ('gpus', 'nics', 'switches', '_by_provider', '_key')

    def __init__(self, gpus, nics=(), switches=(), gpu_count=None):
        self.gpus = tuple((s or None, r or None) for s, r in gpus)
        self.nics = tuple(sorted(nics, key=lambda n: n.address))
        self.switches = tuple(sorted(switches, key=lambda s: s.id))
        validate(self, gpu_count)
        self._by_provider = {n.provider: n for n in self.nics
                             if n.provider}
        self._key = (self.gpus, self.nics, self.switches)

    def __eq__(self, other):
        return isinstance(other, PcieTree) and self._key == other._key

    def __hash__(self):
        return hash(self._key)

    def __repr__(self):
        return 'PcieTree(%r, %r, %r)' % self._key

    def state(self):
        """Hashable: what pairing depends on, without the provider names
        (which name the host): hosts of one server type in the same state
        share it.
        """
        return (self.gpus, tuple(n._replace(provider=None)
                                 for n in self.nics), self.switches)

    def nic_of_provider(self, name):
        """The Nic whose VFs provider ``name`` stands for, or None."""
        return self._by_provider.get(name)

    def redirecting(self):
        """IDs of the switches that send peer-to-peer traffic upstream."""
        return frozenset(s.id for s in self.switches if s.acs_redirect)

    def gpu_domain(self, index, scope):
        """Locality domain of GPU ``index`` at ``scope``, or None when it
        can pair with nothing there (no switch, or one that redirects).
        """
        if not 0 <= index < len(self.gpus):
            return None
        switch, root = self.gpus[index]
        return _domain(switch, root, scope, self.redirecting())

    def nic_domain(self, nic, scope):
        return _domain(nic.switch, nic.root, scope, self.redirecting())

    def free_vfs(self, scope, used=None):
        """Counter: domain -> free VFs in it (``used``: more VFs taken,
        by NIC address, e.g. a candidate's).
        """
        free = collections.Counter()
        for nic in self.nics:
            domain = self.nic_domain(nic, scope)
            if domain is not None:
                left = nic.vfs_free - (used or {}).get(nic.address, 0)
                if left > 0:
                    free[domain] += left
        return free


def _domain(switch, root, scope, redirecting):
    if scope == ROOT_COMPLEX:
        return root
    if switch is None or switch in redirecting:
        return None
    return switch


def validate(tree, gpu_count=None):
    """Raise InvalidRequest naming what is wrong with ``tree``."""
    if gpu_count is not None and len(tree.gpus) != gpu_count:
        raise exceptions.InvalidRequest(
            'the PCIe tree lists %d GPUs, the host has %d'
            % (len(tree.gpus), gpu_count))
    if len(tree.nics) > MAX_NICS:
        raise exceptions.InvalidRequest('more than %d NICs' % MAX_NICS)
    if len(tree.switches) > MAX_SWITCHES:
        raise exceptions.InvalidRequest('more than %d PCIe switches'
                                        % MAX_SWITCHES)
    seen = set()
    for sw in tree.switches:
        if sw.id in seen:
            raise exceptions.InvalidRequest('PCIe switch %s listed twice'
                                            % sw.id)
        seen.add(sw.id)
    addresses, providers = set(), set()
    for nic in tree.nics:
        if nic.address in addresses:
            raise exceptions.InvalidRequest('NIC %s listed twice'
                                            % nic.address)
        addresses.add(nic.address)
        if nic.provider and nic.provider in providers:
            raise exceptions.InvalidRequest(
                'NIC %s: provider %s is another NIC\'s'
                % (nic.address, nic.provider))
        providers.add(nic.provider)
        if not 0 <= nic.vfs_used <= nic.vfs <= MAX_VFS:
            raise exceptions.InvalidRequest(
                'NIC %s: %d of %d VFs used (0 <= used <= VFs <= %d)'
                % (nic.address, nic.vfs_used, nic.vfs, MAX_VFS))
        if nic.switch is not None and nic.switch not in seen:
            raise exceptions.InvalidRequest(
                'NIC %s: switch %s is not among the switches'
                % (nic.address, nic.switch))
    for i, (switch, _root) in enumerate(tree.gpus):
        if switch is not None and switch not in seen:
            raise exceptions.InvalidRequest(
                'GPU %d: switch %s is not among the switches' % (i, switch))


def applies(host, req):
    """``req`` asks a NIC function per GPU (``gpu:rdma``)."""
    return req.rdma is not None


def pairable(host, gpu_indices, scope, used=None):
    """Every GPU of ``gpu_indices`` can have a free NIC VF in its domain
    (VFs counted together: two GPUs under one switch need two VFs there).
    ``used``: VFs taken already, by NIC address.
    """
    tree = host.pcie
    if tree is None:
        return False
    need = collections.Counter()
    for i in gpu_indices:
        domain = tree.gpu_domain(i, scope)
        if domain is None:
            return False
        need[domain] += 1
    free = tree.free_vfs(scope, used)
    return all(free[d] >= n for d, n in need.items())


def free_pairs(tree, scope, free_gpus, taken_vfs=None):
    """How many GPU-NIC pairs can still be made: per domain, the fewer of
    its free GPUs (indices in ``free_gpus``) and its free VFs
    (``taken_vfs``: domain -> VFs taken besides those reported).
    """
    gpus = collections.Counter()
    for i in free_gpus:
        domain = tree.gpu_domain(i, scope)
        if domain is not None:
            gpus[domain] += 1
    vfs = tree.free_vfs(scope)
    taken = taken_vfs or {}
    return sum(min(n, max(vfs[d] - taken.get(d, 0), 0))
               for d, n in gpus.items())


def lost_pairs(host, scope, free_gpus, gpu_indices, rdma):
    """Pairs a choice of ``gpu_indices`` breaks beyond those it takes
    itself (``rdma``: the request takes a VF per GPU in its domain).

    A plain GPU request on a GPU beside a free NIC VF breaks a pair that
    an RDMA request needed; taking a GPU without a NIC beside it breaks
    none. The best choice keeps the most pairs free.
    """
    tree = host.pcie
    if tree is None or not tree.nics:
        return 0
    before = free_pairs(tree, scope, free_gpus)
    chosen = set(gpu_indices)
    taken = collections.Counter()
    if rdma:
        for i in chosen:
            domain = tree.gpu_domain(i, scope)
            if domain is not None:
                taken[domain] += 1
    after = free_pairs(tree, scope, [i for i in free_gpus
                                     if i not in chosen], taken)
    own = len(chosen) if rdma else 0
    return max(before - after - own, 0)


def match(tree, gpu_indices, nic_vfs, scope):
    """Pair each GPU with a VF of ``nic_vfs`` (NIC address -> VFs, what a
    Placement candidate allocates) in its domain: ``(pairs, unpaired)``,
    pairs as ``(GPU index, NIC address)``, unpaired GPU indices.
    """
    left = collections.Counter(nic_vfs)
    by_domain = collections.defaultdict(list)
    for nic in tree.nics:
        domain = tree.nic_domain(nic, scope)
        if domain is not None and left[nic.address]:
            by_domain[domain].append(nic.address)
    pairs, unpaired = [], []
    for i in sorted(gpu_indices):
        domain = tree.gpu_domain(i, scope)
        for address in by_domain.get(domain, ()):
            if left[address]:
                left[address] -= 1
                pairs.append((i, address))
                break
        else:
            unpaired.append(i)
    return pairs, unpaired


def why_not(host, count, scope, allowed=None):
    """A sentence for an RDMA request of ``count`` GPUs no GPU set of
    ``host`` can take (``allowed``: the GPU indices that could take a
    device; default all).
    """
    tree = host.pcie
    word = 'PCIe switch' if scope == PCIE_SWITCH else 'root complex'
    if tree is None:
        return ('no PCIe tree reported (gpu:rdma needs the agent\'s '
                '[gpu_agent] report_pcie_tree)')
    if not tree.nics:
        return 'no RDMA NIC reported: no GPU can be paired with a NIC VF'
    allowed = range(len(tree.gpus)) if allowed is None else allowed
    free = tree.free_vfs(scope)
    counts = collections.Counter()
    unpaired = []
    for i in allowed:
        domain = tree.gpu_domain(i, scope)
        if domain is None or not free[domain]:
            unpaired.append(i)
        else:
            counts[domain] += 1
    pairs = sum(min(n, free[d]) for d, n in counts.items())
    redirect = tree.redirecting()
    return ('%d GPU(s) can be paired with a free NIC VF under the same %s, '
            '%d needed; unpaired GPUs: %s%s'
            % (pairs, word, count,
               ', '.join(map(str, unpaired)) or 'none',
               '; ACS redirects peer-to-peer on switch(es) %s'
               % ', '.join(sorted(redirect))
               if redirect and scope == PCIE_SWITCH else ''))


def candidate_gpus(host, gpus, count, scope):
    """``gpus`` (ordered best first) that can have a free NIC VF in their
    domain, and one set of ``count`` of them that fits the domains' free
    VFs taken in that order (or None): what the engine scores for an
    RDMA request.
    """
    tree = host.pcie
    if tree is None:
        return [], None
    free = tree.free_vfs(scope)
    usable = [g for g in gpus if free[tree.gpu_domain(g.index, scope)]]
    left = collections.Counter(free)
    greedy = []
    for g in usable:
        domain = tree.gpu_domain(g.index, scope)
        if left[domain] and len(greedy) < count:
            left[domain] -= 1
            greedy.append(g)
    return usable, (tuple(greedy) if len(greedy) == count else None)
