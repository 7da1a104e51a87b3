"""Prometheus metrics of one GPU host, served by nova-gpu-agent (opt-in).

With ``[gpu_agent] metrics_listen = ADDRESS:PORT`` the agent serves the
Prometheus text format on ``http://ADDRESS:PORT/metrics``
(``prometheus_client``); unset, nothing listens. What it exports, every
series labelled with the compute ``host``:

* per physical GPU (``gpu`` index, PCI ``address``, catalog ``model``):
  ``nova_gpu_gpu_info`` (its ``mode``: vgpu, mig, passthrough or none; the
  vGPU types and the MIG layout), ``nova_gpu_gpu_free_ratio`` (free
  capacity as the scheduler counts it, 0..1 of the GPU), and, read from
  NVML at scrape time, ``nova_gpu_gpu_utilization_ratio``,
  ``nova_gpu_gpu_memory_used_bytes``, ``nova_gpu_gpu_memory_total_bytes``,
  ``nova_gpu_gpu_power_watts``, ``nova_gpu_gpu_temperature_celsius``
  (absent when NVML is, or cannot read that value: an absent series is
  not a zero);
* per device (vGPU mdev or VF, MIG instance, passthrough GPU):
  ``nova_gpu_device_info`` with the Nova ``instance_uuid`` and libvirt
  ``domain`` it is attached to (libvirt domains: Nova names a domain's
  UUID after its instance), ``nova_gpu_device_attached`` (0 for a device
  no domain references: leaked or orphaned), and, where NVML's vGPU APIs
  give them, ``nova_gpu_vgpu_utilization_ratio`` and
  ``nova_gpu_vgpu_memory_used_bytes`` labelled with the guest's VM UUID;
* the agent's health: ``nova_gpu_agent_last_cycle_timestamp_seconds``,
  ``nova_gpu_agent_last_reconcile_timestamp_seconds``,
  ``nova_gpu_agent_cycles_total``, ``nova_gpu_agent_cycle_failures_total``,
  ``nova_gpu_agent_reconcile_errors_total``,
  ``nova_gpu_agent_device_rollbacks_total`` (device changes cut short and
  undone: carve failures), ``nova_gpu_agent_orphans_removed_total``,
  ``nova_gpu_agent_orphan_devices`` (unused devices in their grace
  period), ``nova_gpu_agent_journal_intents`` (journal backlog),
  ``nova_gpu_agent_unsent_reports`` (outbox backlog),
  ``nova_gpu_agent_nvml_available``, ``nova_gpu_agent_gpus_unreadable``
  (GPUs NVML lists but cannot read, left out of the report) with one
  ``nova_gpu_gpu_unreadable_info`` each (its address and NVML's reason).

Names follow the Prometheus conventions (base units in the name, ratios
0..1, ``_total`` counters) as node_exporter and dcgm-exporter do. The
collector keeps what the last agent cycle learnt and builds the series on
each scrape; it never raises into the HTTP server: a value it cannot read
is left out and logged at DEBUG.
"""

import threading
import time

from oslo_log import log as logging
import prometheus_client
from prometheus_client import core as prom_core

from nova_gpu.agent import nvml as nvml_mod
from nova_gpu.agent import xmlbuild
from nova_gpu.core import catalog as catalog_mod
from nova_gpu.core import exceptions
from nova_gpu.core import host as host_mod
from nova_gpu.core import report as report_mod
from nova_gpu import wsgi_server

LOG = logging.getLogger(__name__)

PREFIX = 'nova_gpu_'
GPU_LABELS = ('host', 'gpu', 'address', 'model')
DEVICE_LABELS = ('host', 'gpu', 'kind', 'device', 'profile',
                 'instance_uuid', 'domain')
# NVML itself is thread-safe; this keeps two concurrent scrapes from
# interleaving their reads of the vGPU sample buffers.
nvml_lock = threading.Lock()
MIB = 2 ** 20
# Device kinds as the metrics name them.
VGPU, MIG, PASSTHROUGH = 'vgpu', 'mig', 'passthrough'


def parse_listen(value):
    """``'ADDRESS:PORT'`` -> (address, port); ``[::1]:9400`` for IPv6."""
    text = (value or '').strip()
    host, sep, port = text.rpartition(':')
    if not sep or not host or not port.isdigit() or \
            not 0 <= int(port) < 65536:
        raise ValueError('[gpu_agent] metrics_listen must be ADDRESS:PORT '
                         '(e.g. 0.0.0.0:9835), got %r' % (value,))
    return host.strip('[]'), int(port)


def domain_instances(domains):
    """{mdev UUID or PCI address: (domain name, instance UUID)}.

    ``domains``: (name, UUID, XML documents) of each libvirt domain. Nova
    creates each guest's domain with the instance's UUID.
    """
    found = {}
    for name, uuid, docs in domains:
        for doc in docs:
            try:
                uuids, addrs = xmlbuild.hostdev_refs(doc)
            except Exception as e:  # one odd domain hides no other
                LOG.debug('domain %s: unreadable XML: %s', name, e)
                continue
            for key in uuids | addrs:
                found.setdefault(key, (name, uuid))
    return found


def scan_domains(libvirt_host):
    """The ``domain_instances`` of every domain libvirt knows."""
    return domain_instances(libvirt_host.domains(
        'listing domains for GPU metrics'))


def _text(value):
    return value.decode() if isinstance(value, bytes) else str(value)


def _gpu_mode(gpu, providers):
    if gpu.mig_enabled:
        return MIG
    kinds = {p.kind for p in providers}
    if kinds & {report_mod.PF_MDEV, report_mod.VF_MDEV,
                report_mod.PCI_POOL} or gpu.vgpus:
        return VGPU
    if report_mod.PCI_DEVICE in kinds:
        return PASSTHROUGH
    return 'none'


class HostCollector:
    """Builds the host's series from the last cycle plus live NVML."""

    def __init__(self, host, nvml=None, catalog=None, clock=time.time):
        self.host = host
        self.nvml = nvml
        self.catalog = catalog or catalog_mod.load_catalog()
        self.clock = clock
        self._lock = threading.Lock()
        self._report = None        # the last published report (dict)
        self._parsed = None        # and its core form
        self._instances = {}
        # The last cycle's GPUs NVML could not read (Agent.cycle).
        self._unreadable = []
        self._health = {'cycles': 0, 'failures': 0, 'reconcile_errors': 0,
                        'rollbacks': 0, 'orphans_removed': 0,
                        'orphans_waiting': 0, 'last_cycle': None,
                        'last_reconcile': None, 'journal_intents': None,
                        'unsent_reports': None}

    # -- fed by the agent's service loop --------------------------------

    def observe(self, result, instances=None, journal_intents=None):
        """Take in one agent cycle's result (``Agent.cycle``)."""
        report = result.get('report')
        try:
            parsed = report_mod.parse(report, self.catalog)
        except exceptions.GpuError as e:
            LOG.warning('GPU metrics: the cycle\'s report does not parse '
                        '(%s); keeping the previous one', e)
            parsed = None
        now = self.clock()
        with self._lock:
            h = self._health
            h['cycles'] += 1
            h['last_cycle'] = now
            if parsed is not None:
                self._report, self._parsed = report, parsed
            if instances is not None:
                self._instances = dict(instances)
            self._unreadable = list(result.get('unreadable_gpus') or ())
            reconcile = result.get('reconcile')
            if reconcile is not None:
                h['last_reconcile'] = now
                h['reconcile_errors'] += len(reconcile.get('errors', ()))
                h['rollbacks'] += len(reconcile.get('rolled_back', ()))
                h['orphans_removed'] += len(reconcile.get('removed', ()))
                h['orphans_waiting'] = len(reconcile.get('waiting', ()))
            if journal_intents is not None:
                h['journal_intents'] = journal_intents
            if result.get('unsent_reports') is not None:
                h['unsent_reports'] = result['unsent_reports']

    def failed(self):
        """An agent cycle raised."""
        with self._lock:
            self._health['failures'] += 1

    # -- prometheus_client collector protocol ---------------------------

    def describe(self):
        # No descriptions: registering must not run a collection.
        return []

    def collect(self):
        with self._lock:
            report, parsed = self._report, self._parsed
            instances = dict(self._instances)
            health = dict(self._health)
            unreadable = list(self._unreadable)
        families = []
        families.extend(self._health_families(health))
        families.extend(self._unreadable_families(unreadable))
        if parsed is not None:
            families.extend(self._gpu_families(report, parsed, instances))
        families.extend(self._nvml_families(parsed))
        return families

    # -- the series -----------------------------------------------------

    def _gauge(self, name, doc, labels=('host',)):
        return prom_core.GaugeMetricFamily(PREFIX + name, doc,
                                           labels=list(labels))

    def _counter(self, name, doc):
        # prometheus_client adds the _total suffix.
        return prom_core.CounterMetricFamily(PREFIX + name, doc,
                                             labels=['host'])

    def _health_families(self, h):
        host = [self.host]
        out = []
        for name, key, doc in (
                ('agent_cycles', 'cycles', 'Agent cycles run.'),
                ('agent_cycle_failures', 'failures',
                 'Agent cycles that failed.'),
                ('agent_reconcile_errors', 'reconcile_errors',
                 'Device errors reconcile met (failed rollbacks, starts, '
                 'orphan removals).'),
                ('agent_device_rollbacks', 'rollbacks',
                 'Device changes cut short (a crash mid-carve) that '
                 'reconcile rolled back.'),
                ('agent_orphans_removed', 'orphans_removed',
                 'Unused GPU devices reconcile removed.')):
            c = self._counter(name, doc)
            c.add_metric(host, h[key])
            out.append(c)
        for name, key, doc in (
                ('agent_last_cycle_timestamp_seconds', 'last_cycle',
                 'When the last agent cycle ended (Unix time).'),
                ('agent_last_reconcile_timestamp_seconds', 'last_reconcile',
                 'When reconcile last ran (Unix time).'),
                ('agent_journal_intents', 'journal_intents',
                 'Device changes recorded in the intent journal and not '
                 'finished (backlog).'),
                ('agent_unsent_reports', 'unsent_reports',
                 'GPU reports in the outbox waiting for the broker.')):
            if h[key] is None:
                continue
            g = self._gauge(name, doc)
            g.add_metric(host, h[key])
            out.append(g)
        g = self._gauge('agent_orphan_devices',
                        'Unused GPU devices waiting out the orphan grace '
                        'period.')
        g.add_metric(host, h['orphans_waiting'])
        out.append(g)
        g = self._gauge('agent_nvml_available',
                        '1 when the agent reads GPUs through NVML.')
        g.add_metric(host, int(bool(self.nvml and self.nvml.available)))
        out.append(g)
        return out

    def _unreadable_families(self, unreadable):
        count = self._gauge('agent_gpus_unreadable',
                            'GPUs NVML lists but cannot read (fallen off '
                            'the bus, a driver fault), left out of the '
                            'host\'s GPU report.')
        count.add_metric([self.host], len(unreadable))
        info = self._gauge('gpu_unreadable_info',
                           'A GPU NVML cannot read and why; value 1.',
                           ('host', 'nvml_index', 'address', 'reason'))
        for gpu in unreadable:
            info.add_metric([self.host, str(gpu['nvml_index']),
                             gpu['address'] or '', gpu['reason']], 1)
        return [count, info]

    def _gpu_families(self, report, parsed, instances):
        info = self._gauge(
            'gpu_info', 'A physical GPU and its mode (vgpu, mig, '
            'passthrough, none); value 1.',
            GPU_LABELS + ('mode', 'vgpu_types', 'mig_layout'))
        free = self._gauge('gpu_free_ratio', 'Free capacity of a GPU as the '
                           'scheduler counts it (0..1).', GPU_LABELS)
        dev_info = self._gauge(
            'device_info', 'A GPU device (vGPU, MIG instance, passthrough '
            'GPU) and the Nova instance it is attached to; value 1.',
            DEVICE_LABELS)
        attached = self._gauge(
            'device_attached', '1 when a libvirt domain references the '
            'device, 0 when none does (leaked or orphaned).',
            ('host', 'gpu', 'kind', 'device'))
        providers = {}
        for p in parsed.providers:
            providers.setdefault(p.gpu, []).append(p)
        for raw, gpu in zip(sorted(report['gpus'], key=lambda g: g['index']),
                            parsed.host.gpus):
            mine = providers.get(gpu.index, [])
            mode = _gpu_mode(gpu, mine)
            labels = [self.host, str(gpu.index), gpu.address,
                      gpu.model.name]
            types = sorted({p.vgpu_type for p in mine if p.vgpu_type}
                           | set(gpu.vgpus))
            layout = ','.join('%s@%d' % (name, start) for start, name in
                              sorted((s, n) for n, s in
                                     _mig_slots(raw)))
            info.add_metric(labels + [mode, ','.join(types), layout], 1)
            free.add_metric(labels, gpu.free_milli / host_mod.MILLI)
            for kind, device, profile in _devices(raw, gpu, mine):
                name, uuid = instances.get(device, ('', ''))
                dev_info.add_metric([self.host, str(gpu.index), kind,
                                     device, profile, uuid, name], 1)
                attached.add_metric([self.host, str(gpu.index), kind,
                                     device], int(bool(name)))
        return [info, free, dev_info, attached]

    def _nvml_families(self, parsed):
        nvml = self.nvml
        if nvml is None or not nvml.available:
            return []
        lib = nvml.lib
        gauges = {
            'util': self._gauge('gpu_utilization_ratio', 'Share of time a '
                                'kernel ran on the GPU (NVML, 0..1).',
                                GPU_LABELS),
            'used': self._gauge('gpu_memory_used_bytes', 'GPU framebuffer '
                                'memory in use (NVML).', GPU_LABELS),
            'total': self._gauge('gpu_memory_total_bytes', 'GPU framebuffer '
                                 'memory (NVML).', GPU_LABELS),
            'power': self._gauge('gpu_power_watts', 'GPU power draw '
                                 '(NVML).', GPU_LABELS),
            'temp': self._gauge('gpu_temperature_celsius', 'GPU core '
                                'temperature (NVML).', GPU_LABELS),
            'vutil': self._gauge('vgpu_utilization_ratio', 'Share of time '
                                 'a vGPU\'s work ran on the GPU (NVML).',
                                 ('host', 'gpu', 'vgpu', 'device',
                                  'instance_uuid')),
            'vmem': self._gauge('vgpu_memory_used_bytes', 'Framebuffer a '
                                'vGPU uses (NVML).',
                                ('host', 'gpu', 'vgpu', 'device',
                                 'instance_uuid')),
        }
        models, indices = {}, {}
        if parsed is not None:
            models = {g.address: g.model.name for g in parsed.host.gpus}
            # The report's index labels a GPU in every series; NVML's
            # differs once a GPU NVML cannot read is left out before it.
            indices = {g.address: str(g.index) for g in parsed.host.gpus}

        def read(fn, *args):
            try:
                return fn(*args)
            except Exception as e:  # NVMLError, NotSupported, missing API
                LOG.debug('NVML %s: %s', getattr(fn, '__name__', fn), e)
                return None
        with nvml_lock:
            count = read(lib.nvmlDeviceGetCount) or 0
            for index in range(count):
                dev = read(lib.nvmlDeviceGetHandleByIndex, index)
                pci = dev is not None and read(lib.nvmlDeviceGetPciInfo, dev)
                if not pci:
                    continue
                address = nvml_mod.normalise_bus_id(pci.busId)
                model = models.get(address) or _text(
                    read(lib.nvmlDeviceGetName, dev) or '')
                labels = [self.host, indices.get(address, str(index)),
                          address, model]
                util = read(lib.nvmlDeviceGetUtilizationRates, dev)
                if util is not None:
                    gauges['util'].add_metric(labels, util.gpu / 100.0)
                mem = read(lib.nvmlDeviceGetMemoryInfo, dev)
                for key, field in (('used', 'used'), ('total', 'total')):
                    value = getattr(mem, field, None)
                    if value is not None:
                        gauges[key].add_metric(labels, value)
                power = read(lib.nvmlDeviceGetPowerUsage, dev)
                if power is not None:
                    gauges['power'].add_metric(labels, power / 1000.0)
                temp = read(lib.nvmlDeviceGetTemperature, dev,
                            lib.NVML_TEMPERATURE_GPU)
                if temp is not None:
                    gauges['temp'].add_metric(labels, temp)
                self._vgpus(lib, read, dev, labels[1], gauges)
        return list(gauges.values())

    def _vgpus(self, lib, read, dev, index, gauges):
        vgpus = read(lib.nvmlDeviceGetActiveVgpus, dev) or []
        if not vgpus:
            return
        samples = read(lib.nvmlDeviceGetVgpuUtilization, dev, 0) or []
        util = {int(s.vgpuInstance): s.smUtil.uiVal for s in samples}
        for vgpu in vgpus:
            vm = read(lib.nvmlVgpuInstanceGetVmID, vgpu)
            uuid = ''
            if vm and vm[1] == getattr(lib, 'NVML_VGPU_VM_ID_UUID', 1):
                uuid = _text(vm[0]).lower()
            mdev = _mdev_of(lib, read, vgpu)
            labels = [self.host, index, str(int(vgpu)), mdev, uuid]
            if int(vgpu) in util:
                gauges['vutil'].add_metric(labels, util[int(vgpu)] / 100.0)
            fb = read(lib.nvmlVgpuInstanceGetFbUsage, vgpu)
            if fb is not None:
                gauges['vmem'].add_metric(labels, fb)


def utilisation_samples(nvml, gpm=None):
    """What NVML reads now of each GPU's, vGPU's and GPU instance's use
    (``core.idle``).

    The readings the series above are made of, for the agent's idle
    windows::

        {'gpus': {address: {'compute', 'memory_mib'}},
         'vgpus': {address: [{'mdev', 'vm', 'gi', 'compute',
                              'memory_mib'}]},
         'migs': {address: [{'gi', 'start', 'compute', 'memory_mib'}]}}

    A GPU's and a vGPU's compute is a share of the GPU's time (0..1); a
    GPU instance's (MIG) a share of the instance, from NVML's GPU
    Performance Monitoring (GPM, Hopper and later: the graphics activity
    between this pass's sample and the last one, kept in ``gpm``, a dict
    the caller keeps between passes; None: not read). Its frame buffer is
    read from its MIG device. A vGPU's ``gi`` is the GPU instance it runs
    on (MIG-backed). A value NVML cannot read is None: a GPU in MIG mode
    has no utilisation of its own, an A100's instances no compute, and a
    GPU passed through to a guest is not the host's to read at all (NVML
    does not list it). None when NVML is not available. Never raises for
    one value.
    """
    if nvml is None or not nvml.available:
        if gpm:
            gpm.clear()   # samples of an NVML gone: not to be compared
        return None
    lib = nvml.lib

    def read(fn, *args):
        try:
            return fn(*args)
        except Exception as e:  # NVMLError, NotSupported, missing API
            LOG.debug('NVML %s: %s', getattr(fn, '__name__', fn), e)
            return None
    gpus, vgpus, migs = {}, {}, {}
    seen = set()
    with nvml_lock:
        for index in range(read(lib.nvmlDeviceGetCount) or 0):
            dev = read(lib.nvmlDeviceGetHandleByIndex, index)
            pci = dev is not None and read(lib.nvmlDeviceGetPciInfo, dev)
            if not pci:
                continue
            address = nvml_mod.normalise_bus_id(pci.busId)
            util = read(lib.nvmlDeviceGetUtilizationRates, dev)
            mem = read(lib.nvmlDeviceGetMemoryInfo, dev)
            used = getattr(mem, 'used', None)
            gpus[address] = {
                'compute': util.gpu / 100.0 if util is not None else None,
                'memory_mib': used / MIB if used is not None else None}
            instances = _mig_readings(nvml, read, dev, address, gpm, seen)
            if instances:
                migs[address] = instances
            active = read(lib.nvmlDeviceGetActiveVgpus, dev) or []
            if not active:
                continue
            samples = read(lib.nvmlDeviceGetVgpuUtilization, dev, 0) or []
            util = {int(s.vgpuInstance): s.smUtil.uiVal for s in samples}
            mine = vgpus[address] = []
            for vgpu in active:
                vm = read(lib.nvmlVgpuInstanceGetVmID, vgpu)
                uuid = ''
                if vm and vm[1] == getattr(lib, 'NVML_VGPU_VM_ID_UUID', 1):
                    uuid = _text(vm[0]).lower()
                fb = read(lib.nvmlVgpuInstanceGetFbUsage, vgpu)
                mine.append({
                    'mdev': _mdev_of(lib, read, vgpu), 'vm': uuid,
                    'gi': read(getattr(lib, 'nvmlVgpuInstanceGetGpuInstanceId',
                                       None), vgpu),
                    'compute': (util[int(vgpu)] / 100.0
                                if int(vgpu) in util else None),
                    'memory_mib': fb / MIB if fb is not None else None})
        if gpm is not None:
            for key in set(gpm) - seen:   # instances gone: free samples
                read(lib.nvmlGpmSampleFree, gpm.pop(key))
    return {'gpus': gpus, 'vgpus': vgpus, 'migs': migs}


def _mig_readings(nvml, read, dev, address, gpm, seen):
    """[{'gi', 'start', 'compute', 'memory_mib'}] of a MIG GPU's GPU
    instances (``utilisation_samples``); [] for a GPU not in MIG mode.
    """
    lib = nvml.lib
    mode = read(lib.nvmlDeviceGetMigMode, dev)
    if not mode or mode[0] != lib.NVML_DEVICE_MIG_ENABLE:
        return []
    instances = read(nvml.mig_instances, dev) or []
    memory = {}
    for i in range(read(lib.nvmlDeviceGetMaxMigDeviceCount, dev) or 0):
        mig = read(lib.nvmlDeviceGetMigDeviceHandleByIndex, dev, i)
        if mig is None:
            continue   # no MIG device at that index
        gi = read(lib.nvmlDeviceGetGpuInstanceId, mig)
        used = getattr(read(lib.nvmlDeviceGetMemoryInfo, mig), 'used', None)
        if gi is not None and used is not None:
            memory[gi] = used / MIB
    support = read(lib.nvmlGpmQueryDeviceSupport, dev) if gpm is not None \
        else None
    out = []
    for inst in instances:
        compute = None
        if getattr(support, 'isSupportedDevice', 0):
            key = (address, inst.gi_id)
            seen.add(key)
            compute = _gpm_activity(lib, read, dev, inst.gi_id, key, gpm)
        out.append({'gi': inst.gi_id, 'start': inst.start,
                    'compute': compute,
                    'memory_mib': memory.get(inst.gi_id)})
    return out


def _gpm_activity(lib, read, dev, gi_id, key, gpm):
    """GPM's graphics activity of GPU instance ``gi_id`` since the last
    pass (0..1), or None; this pass's sample replaces it in ``gpm``.
    """
    sample = read(lib.nvmlGpmSampleAlloc)
    if sample is None:
        return None
    if read(lib.nvmlGpmMigSampleGet, dev, gi_id, sample) is None:
        read(lib.nvmlGpmSampleFree, sample)
        return None
    before = gpm.pop(key, None)
    gpm[key] = sample
    if before is None:
        return None   # the first sample: activity needs two
    try:
        metrics = lib.c_nvmlGpmMetricsGet_t()
        metrics.version = lib.NVML_GPM_METRICS_GET_VERSION
        metrics.numMetrics = 1
        metrics.sample1, metrics.sample2 = before, sample
        metrics.metrics[0].metricId = lib.NVML_GPM_METRIC_GRAPHICS_UTIL
        lib.nvmlGpmMetricsGet(metrics)
        found = metrics.metrics[0]
        if found.nvmlReturn != lib.NVML_SUCCESS:
            return None
        return min(1.0, max(0.0, found.value / 100.0))
    except Exception as e:  # NVMLError, an older binding
        LOG.debug('NVML GPM of GPU instance %s: %s', gi_id, e)
        return None
    finally:
        read(lib.nvmlGpmSampleFree, before)


def _mdev_of(lib, read, vgpu):
    fn = getattr(lib, 'nvmlVgpuInstanceGetMdevUUID', None)
    return _text(read(fn, vgpu) or '').lower() if fn else ''


def _mig_slots(raw):
    for dev in report_mod.present_devices(raw):
        if dev.get('kind') == host_mod.MIG and dev.get('detail'):
            yield dev['detail'][0], dev['detail'][1]


def _devices(raw, gpu, providers):
    """(kind, device key, profile) of each device on one GPU.

    The key is what a domain's XML references: an mdev UUID or a PCI
    address (VF or passthrough PF); a MIG instance without a vGPU is
    named ``<GPU address>/mig@<start slice>``.
    """
    for dev in report_mod.present_devices(raw):
        kind = dev.get('kind')
        detail = dev.get('detail')
        if kind == host_mod.VGPU:
            yield VGPU, (dev.get('uuid') or dev.get('vf') or ''), detail
        elif kind == host_mod.MIG:
            profile, start, vgpu = detail
            yield MIG, '%s/mig@%d' % (gpu.address, start), vgpu or profile
    if any(p.kind == report_mod.PCI_DEVICE for p in providers) \
            and not gpu.mig_enabled and not gpu.vgpus:
        yield PASSTHROUGH, gpu.address, gpu.model.name


class _Off:
    """What ``serve`` returns when metrics are off: does nothing."""

    collector = None

    def observe(self, result):
        pass

    def failed(self):
        pass

    def stop(self):
        pass


class MetricsServer:
    """The agent's exporter: a collector on its own registry and port."""

    def __init__(self, agent, address, port):
        self.agent = agent
        self.collector = HostCollector(agent.host, agent.nvml, agent.catalog)
        self.registry = prometheus_client.CollectorRegistry()
        self.registry.register(self.collector)
        # nova_gpu.wsgi_server: eventlet's server where eventlet patched
        # the process (a stdlib server thread there would block every
        # green thread), else a stdlib server thread.
        self._http = wsgi_server.WsgiServer(
            prometheus_client.make_wsgi_app(self.registry), address, port,
            name='nova-gpu-agent-metrics')
        self.port = self._http.port
        LOG.info('GPU metrics on http://%s:%d/metrics', address, self.port)

    def observe(self, result):
        instances = None
        if self.agent.libvirt is not None:
            try:
                instances = scan_domains(self.agent.libvirt)
            except Exception as e:  # metrics never break the agent
                LOG.warning('GPU metrics: cannot list domains: %s', e)
        try:
            intents = len(self.agent.journal.intents())
        except Exception as e:
            LOG.warning('GPU metrics: cannot read the journal: %s', e)
            intents = None
        self.collector.observe(result, instances, intents)

    def failed(self):
        self.collector.failed()

    def stop(self):
        self._http.stop()


def serve(conf, agent):
    """Start the exporter if ``[gpu_agent] metrics_listen`` is set.

    Returns an object with ``observe(cycle result)``, ``failed()`` and
    ``stop()``; a do-nothing one when metrics are off.
    """
    listen = conf.gpu_agent.metrics_listen
    if not listen:
        return _Off()
    address, port = parse_listen(listen)
    return MetricsServer(agent, address, port)
