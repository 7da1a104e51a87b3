"""NVIDIA Fabric Manager: the host's NVSwitch partitions (Shared NVSwitch).

On an HGX host in Fabric Manager's Shared NVSwitch virtualization model
the agent learns the partitions Fabric Manager predefines (and which are
unsupported because NVLinks failed), reports them, and activates the
partition of a guest's GPUs before the guest starts and deactivates it
when the guest has gone (NVIDIA Fabric Manager User Guide, "Shared
NVSwitch Virtualization Model"; its API: ``fmGetSupportedFabricPartitions``,
``fmActivateFabricPartition``, ``fmDeactivateFabricPartition``,
``fmSetActivatedFabricPartitions``, ``fmGetUnsupportedFabricPartitions``).

The agent talks to Fabric Manager through ``FabricManager``, a small
interface; ``FmpmClient`` is the real one, NVIDIA's ``fmpm`` tool
(github.com/NVIDIA/Fabric-Manager-Client), which prints JSON and exits
with the API's return code. Tests fake this interface only, raising the
API's errors.
"""

import abc
import json
import subprocess
import time

from oslo_log import log as logging

from nova_gpu.agent import jsonstore
from nova_gpu.core import exceptions
from nova_gpu.core import partitions as partitions_mod

LOG = logging.getLogger(__name__)

# fmReturn_t (nv_fm_types.h).
FM_ST_SUCCESS = 0
FM_ST_BADPARAM = -1
FM_ST_GENERIC_ERROR = -2
FM_ST_NOT_SUPPORTED = -3
FM_ST_UNINITIALIZED = -4
FM_ST_TIMEOUT = -5
FM_ST_VERSION_MISMATCH = -6
FM_ST_IN_USE = -7
FM_ST_NOT_CONFIGURED = -8
FM_ST_CONNECTION_NOT_VALID = -9
FM_ST_NVLINK_ERROR = -10

CODE_NAMES = {
    FM_ST_BADPARAM: 'FM_ST_BADPARAM',
    FM_ST_GENERIC_ERROR: 'FM_ST_GENERIC_ERROR',
    FM_ST_NOT_SUPPORTED: 'FM_ST_NOT_SUPPORTED',
    FM_ST_UNINITIALIZED: 'FM_ST_UNINITIALIZED',
    FM_ST_TIMEOUT: 'FM_ST_TIMEOUT',
    FM_ST_VERSION_MISMATCH: 'FM_ST_VERSION_MISMATCH',
    FM_ST_IN_USE: 'FM_ST_IN_USE',
    FM_ST_NOT_CONFIGURED: 'FM_ST_NOT_CONFIGURED',
    FM_ST_CONNECTION_NOT_VALID: 'FM_ST_CONNECTION_NOT_VALID',
    FM_ST_NVLINK_ERROR: 'FM_ST_NVLINK_ERROR',
}


class FabricManagerError(Exception):
    """A Fabric Manager call failed; ``code`` is its fmReturn_t."""

    def __init__(self, operation, code, detail=''):
        self.operation = operation
        self.code = code
        self.name = CODE_NAMES.get(code, 'fmReturn %s' % code)
        super().__init__('Fabric Manager %s failed: %s%s'
                         % (operation, self.name,
                            ': ' + detail if detail else ''))


class FmPartition:
    """A partition as Fabric Manager lists it: GPUs by PCI bus ID."""

    __slots__ = ('id', 'active', 'pci_bus_ids', 'physical_ids')

    def __init__(self, id, active, pci_bus_ids, physical_ids=()):
        self.id = id
        self.active = active
        self.pci_bus_ids = tuple(pci_bus_ids)
        self.physical_ids = tuple(physical_ids)


class FabricManager(abc.ABC):
    """What the agent asks of Fabric Manager (one method per API call)."""

    @abc.abstractmethod
    def supported_partitions(self):
        """``fmGetSupportedFabricPartitions``: a list of FmPartition."""

    @abc.abstractmethod
    def unsupported_partitions(self):
        """``fmGetUnsupportedFabricPartitions``: partition IDs."""

    @abc.abstractmethod
    def activate(self, partition_id):
        """``fmActivateFabricPartition``."""

    @abc.abstractmethod
    def deactivate(self, partition_id):
        """``fmDeactivateFabricPartition``."""

    @abc.abstractmethod
    def set_activated(self, partition_ids):
        """``fmSetActivatedFabricPartitions`` (after an FM restart)."""


def normal_bus_id(bus_id):
    """``00000000:18:00.0`` (NVML, Fabric Manager) as ``0000:18:00.0``."""
    text = str(bus_id).strip().lower()
    domain, sep, rest = text.partition(':')
    if sep and len(domain) > 4:
        domain = domain[-4:]
    return domain + sep + rest


def parse_partition_list(doc):
    """FmPartition list from ``fmpm -l``'s JSON (its ``partitionInfo``)."""
    if not isinstance(doc, dict) or not isinstance(
            doc.get('partitionInfo'), list):
        raise FabricManagerError('list', FM_ST_GENERIC_ERROR,
                                 'no partitionInfo list in its answer')
    out = []
    for n, entry in enumerate(doc['partitionInfo']):
        try:
            gpus = entry.get('gpuInfo') or []
            out.append(FmPartition(
                int(entry['partitionId']), bool(entry.get('isActive')),
                [normal_bus_id(g['pciBusId']) for g in gpus],
                [int(g.get('physicalId', 0)) for g in gpus]))
        except (AttributeError, KeyError, TypeError, ValueError) as e:
            raise FabricManagerError(
                'list', FM_ST_GENERIC_ERROR,
                'partitionInfo[%d] is malformed (%s)' % (n, e)) from None
    return out


class FmpmClient(FabricManager):
    """Fabric Manager through NVIDIA's ``fmpm`` tool."""

    def __init__(self, path='fmpm', unix_socket=None, address=None,
                 timeout=30, run=subprocess.run):
        self.path = path
        self.connect = (['--unix-domain-socket', unix_socket] if unix_socket
                        else ['--hostname', address] if address else [])
        self.timeout = timeout
        self._run = run

    def _call(self, operation, *args):
        cmd = [self.path, *args, *self.connect]
        try:
            done = self._run(cmd, capture_output=True, text=True,
                             timeout=self.timeout, check=False)
        except subprocess.TimeoutExpired:
            raise FabricManagerError(operation, FM_ST_TIMEOUT,
                                     '%s took over %s s'
                                     % (self.path, self.timeout)) from None
        except OSError as e:
            raise FabricManagerError(operation, FM_ST_GENERIC_ERROR,
                                     'cannot run %s: %s'
                                     % (self.path, e)) from None
        if done.returncode:
            # fmpm exits with the (negative) fmReturn_t, seen mod 256.
            code = done.returncode
            code = code - 256 if code > 127 else code
            raise FabricManagerError(operation, code,
                                     (done.stdout + done.stderr).strip())
        return done.stdout

    def _json(self, operation, *args):
        text = self._call(operation, *args)
        try:
            return json.loads(text)
        except ValueError:
            raise FabricManagerError(operation, FM_ST_GENERIC_ERROR,
                                     'not JSON: %r' % text[:200]) from None

    def supported_partitions(self):
        return parse_partition_list(self._json('list', '-l'))

    def unsupported_partitions(self):
        doc = self._json('list unsupported', '--list-unsupported-partitions')
        try:
            return [int(p['partitionId']) for p in doc['partitionInfo']]
        except (KeyError, TypeError, ValueError) as e:
            raise FabricManagerError('list unsupported', FM_ST_GENERIC_ERROR,
                                     'malformed answer (%s)' % e) from None

    def activate(self, partition_id):
        self._call('activate %d' % partition_id, '-a', str(partition_id))

    def deactivate(self, partition_id):
        self._call('deactivate %d' % partition_id, '-d', str(partition_id))

    def set_activated(self, partition_ids):
        ids = ','.join(str(i) for i in sorted(partition_ids))
        self._call('set activated list', '--set-activated-list', ids)


def read_table(fm, gpus):
    """The host's ``PartitionTable`` from Fabric Manager.

    ``gpus`` are the host's GPUs (``host.Gpu``); a partition naming a GPU
    the host does not list now (lost, left out of the report) is left out:
    it cannot be given to a guest. Fabric Manager unreachable or not
    ready: an empty table (no whole GPU is given until it answers), with
    a warning; a guest never starts on GPUs whose partition cannot be
    activated.
    """
    index = {normal_bus_id(g.address): g.index for g in gpus}
    try:
        listed = fm.supported_partitions()
        unsupported = set(fm.unsupported_partitions())
    except FabricManagerError as e:
        LOG.warning('NVSwitch partitions unknown, no whole GPU offered '
                    'until Fabric Manager answers: %s', e)
        return partitions_mod.PartitionTable((), len(gpus))
    parts = []
    for p in listed:
        buses = [normal_bus_id(b) for b in p.pci_bus_ids]
        members = [index.get(b) for b in buses]
        if not members or None in members:
            LOG.warning('NVSwitch partition %d names GPUs %s not on this '
                        'host now: left out', p.id, ', '.join(
                            b for b in buses if b not in index))
            continue
        parts.append(partitions_mod.Partition(
            p.id, frozenset(members), p.id not in unsupported, p.active))
    try:
        return partitions_mod.PartitionTable(parts, len(gpus))
    except exceptions.InvalidRequest as e:
        LOG.warning('Fabric Manager listed partitions that cannot be: %s; '
                    'no whole GPU offered', e)
        return partitions_mod.PartitionTable((), len(gpus))


class PartitionError(Exception):
    """A guest's GPUs cannot have their partition activated."""


ACTIVATING = 'activating'
ACTIVE = 'active'


class PartitionKeeper:
    """Activates a guest's partition before it starts, deactivates it
    after, and keeps which domain holds which partition in the agent's
    state directory (``partitions.json``, an ``agent.jsonstore``), so
    that a crash at any step is recovered and the held partitions can be
    set again after a Fabric Manager restart.

    The record is written before Fabric Manager is asked (``activating``,
    the intent) and marked ``active`` after; a crash between the two, or
    between activation and the guest's start, leaves a record that
    ``recover`` settles: the guest runs (kept) or not (deactivated).
    """

    def __init__(self, fm, store, clock=time.time):
        self.fm = fm
        self.store = store
        self.clock = clock

    def _partition_of(self, addresses):
        wanted = {normal_bus_id(a) for a in addresses}
        listed = self.fm.supported_partitions()
        for p in listed:
            if {normal_bus_id(b) for b in p.pci_bus_ids} == wanted:
                return p
        raise PartitionError(
            'GPUs %s form no NVSwitch partition of Fabric Manager (its '
            'partitions: %s)' % (', '.join(sorted(wanted)), '; '.join(
                '%d: %s' % (p.id, ','.join(p.pci_bus_ids))
                for p in listed) or 'none'))

    def prepare(self, domain, addresses):
        """Activate the partition of exactly ``addresses`` for ``domain``.

        Raises PartitionError (the guest must not start) naming why.
        """
        try:
            part = self._partition_of(addresses)
        except FabricManagerError as e:
            raise PartitionError(str(e)) from None
        with self.store.change() as held:
            for other, rec in held.items():
                if other != domain and rec['partition'] == part.id:
                    raise PartitionError(
                        'NVSwitch partition %d is held by domain %s'
                        % (part.id, other))
            held[domain] = {'partition': part.id, 'state': ACTIVATING,
                            'gpus': sorted(addresses), 'time': self.clock()}
        try:
            self.fm.activate(part.id)
        except FabricManagerError as e:
            if not (e.code == FM_ST_IN_USE and part.active):
                # Not activated: the record goes, the guest does not start.
                self._drop(domain)
                raise PartitionError(
                    'cannot activate NVSwitch partition %d for %s: %s'
                    % (part.id, domain, e)) from None
            # Active already and held by no other domain: ours from a run
            # cut short after the activation.
        with self.store.change() as held:
            held[domain]['state'] = ACTIVE
        return part.id

    def release(self, domain):
        """Deactivate ``domain``'s partition (the guest has gone)."""
        rec = self.store.load().get(domain)
        if rec is None:
            return None
        self._deactivate(rec['partition'])
        self._drop(domain)
        return rec['partition']

    def _deactivate(self, pid):
        try:
            self.fm.deactivate(pid)
        except FabricManagerError as e:
            if e.code != FM_ST_UNINITIALIZED:   # not active: nothing to do
                raise

    def _drop(self, domain):
        with self.store.change() as held:
            held.pop(domain, None)

    def held(self):
        """Domain -> partition ID of every record."""
        return {d: r['partition'] for d, r in self.store.load().items()}

    def recover(self, running, grace=300):
        """Settle records left by a crash: a partition whose domain is
        not ``running`` (and whose record is older than ``grace`` s: a
        guest between activation and start) is deactivated. Returns the
        partitions deactivated.
        """
        done = []
        now = self.clock()
        for domain, rec in sorted(self.store.load().items()):
            if domain in running or now - rec.get('time', 0) < grace:
                continue
            try:
                self._deactivate(rec['partition'])
            except FabricManagerError as e:
                LOG.warning('cannot deactivate NVSwitch partition %d of '
                            'gone domain %s (kept for the next try): %s',
                            rec['partition'], domain, e)
                continue
            self._drop(domain)
            done.append(rec['partition'])
        return done

    def restore(self):
        """After a Fabric Manager restart: give it the partitions held
        (``fmSetActivatedFabricPartitions``) when it lists one of them
        inactive. Returns the IDs set, or None when nothing was to do.
        """
        ids = {r['partition'] for r in self.store.load().values()
               if r['state'] == ACTIVE}
        if not ids:
            return None
        active = {p.id for p in self.fm.supported_partitions() if p.active}
        if ids <= active:
            return None
        self.fm.set_activated(sorted(ids | active))
        return sorted(ids | active)


# -- from the agent's configuration ------------------------------------------

STORE_NAME = 'partitions.json'
SHARED = 'shared'


def from_conf(conf):
    """The host's ``FmpmClient`` (``[gpu_agent] nvswitch_mode = shared``),
    or None (no NVSwitch partitions on this host).
    """
    opts = conf.gpu_agent
    if opts.nvswitch_mode != SHARED:
        return None
    return FmpmClient(opts.fmpm_path,
                      unix_socket=opts.fabric_manager_socket or None,
                      address=opts.fabric_manager_address or None,
                      timeout=opts.fabric_manager_timeout)


def keeper_from_conf(conf, fm=None):
    """The ``PartitionKeeper`` of the agent's state directory, or None
    when the host is not in Shared NVSwitch mode.
    """
    fm = fm if fm is not None else from_conf(conf)
    if fm is None:
        return None
    return PartitionKeeper(fm, jsonstore.JsonStore(
        conf.gpu_agent.state_dir, STORE_NAME, 'held'))


def running_domains(libvirt):
    """Names of the domains libvirt runs now (``agent.libvirt_host``)."""
    def scan(conn):
        return {d.name() for d in conn.listAllDomains(0) if d.isActive()}
    return libvirt.call('listing running domains', scan)


def keep(keeper, libvirt, grace):
    """One agent cycle's care of the held partitions; never raises.

    First the activated list is set again if Fabric Manager restarted
    (``restore``), then partitions of domains that no longer run are
    deactivated (``recover``: a guest that stopped while the hook could
    not release, or a start cut short after the activation). Without
    libvirt nothing is deactivated: no domain is known to be gone.
    Returns ``{'restored': [...] or None, 'deactivated': [...]}``, or
    None when the host is not in Shared NVSwitch mode.
    """
    if keeper is None:
        return None
    out = {'restored': None, 'deactivated': []}
    try:
        out['restored'] = keeper.restore()
        if out['restored'] is not None:
            LOG.warning('Fabric Manager had forgotten activated NVSwitch '
                        'partitions (restarted?): set again %s',
                        out['restored'])
    except FabricManagerError as e:
        LOG.warning('cannot restore the activated NVSwitch partitions '
                    '(retried next cycle): %s', e)
    if libvirt is None:
        return out
    try:
        running = running_domains(libvirt)
    except Exception as e:  # libvirtd restarting: next cycle
        LOG.warning('NVSwitch partitions of gone guests not settled: '
                    'cannot list the running domains: %s', e)
        return out
    out['deactivated'] = keeper.recover(running, grace=grace)
    if out['deactivated']:
        LOG.info('NVSwitch partitions of gone guests deactivated: %s',
                 out['deactivated'])
    return out
