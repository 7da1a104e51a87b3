"""The cloud exporter's Prometheus series, built from a ``CloudState``.

Per host (``host`` label) and for the whole cloud:

* ``nova_gpu_host_gpus{host,model}`` / ``nova_gpu_cloud_gpus{model}``;
* ``nova_gpu_host_free_gpus`` / ``nova_gpu_cloud_free_gpus``: free
  capacity in GPUs; ``nova_gpu_cloud_allocated_ratio``: the share taken;
* ``nova_gpu_host_free_devices{host,model,kind,profile}`` and
  ``nova_gpu_cloud_free_devices{model,kind,profile}``: how many more of
  each vGPU type, MIG profile or whole GPU fit now;
* ``nova_gpu_host_fragmentation_gpus`` and ``_ratio`` (of the host's GPU
  capacity), ``nova_gpu_cloud_fragmentation_gpus`` and ``_ratio``: the
  expected fragmentation (FGD measure);
* ``nova_gpu_host_stranded_gpus``, ``nova_gpu_cloud_stranded_gpus``;
* ``nova_gpu_host_last_report_timestamp_seconds``,
  ``nova_gpu_host_report_age_seconds``, ``nova_gpu_host_stale`` (age over
  ``stale_after``) and ``nova_gpu_cloud_stale_hosts``;
* ``nova_gpu_gpu_quarantined`` / ``nova_gpu_cloud_quarantined_gpus``: the
  GPUs quarantined for a hardware fault (``core.health``), with the reason;
* ``nova_gpu_host_unreadable_gpus`` / ``nova_gpu_cloud_unreadable_gpus``:
  GPUs the agents left out of their reports (``left_out``: NVML cannot
  read them), not counted in the figures above;
* counters from the notifications: ``nova_gpu_scheduler_requests_total``,
  ``nova_gpu_scheduler_requests_unplaced_total``,
  ``nova_gpu_scheduler_refusals_total{reason}`` (hosts refused),
  ``nova_gpu_placements_total``, ``nova_gpu_device_changes_total{action,
  kind}``, ``nova_gpu_exporter_reports_total``,
  ``nova_gpu_exporter_reports_rejected_total``;
* usage for billing (``exporter.usage``, the ledger as last written):
  ``nova_gpu_usage_gpu_seconds_total``,
  ``nova_gpu_usage_framebuffer_gib_seconds_total`` and
  ``nova_gpu_usage_device_seconds_total`` by ``project_id``,
  ``server_id``, ``model``, ``profile``;
  ``nova_gpu_usage_ledger_write_timestamp_seconds``,
  ``nova_gpu_usage_unattributed_devices{host}`` (devices no known server
  holds: not billed).
* idle guest devices (``core.idle``, the agents' ``idle`` field):
  ``nova_gpu_device_idle_seconds{host,gpu,address,device,server_id,
  model,kind,profile,suggestion}``, how long each idle device has stayed
  under the agent's ``idle_threshold`` (``suggestion``: a smaller
  profile its observed peak fits, empty when none);
* owners told of idle devices (``[gpu_exporter] idle_notify``):
  ``nova_gpu_idle_notices_total{action}``,
  ``nova_gpu_idle_notices_failed_total{reason}``,
  ``nova_gpu_idle_notices_pending``, ``nova_gpu_idle_notices_servers``.
"""

from prometheus_client import core as prom_core

from nova_gpu.core import host as host_mod
from nova_gpu.core import usage as usage_mod

PREFIX = 'nova_gpu_'
MILLI = float(host_mod.MILLI)


def idle_devices(hosts):
    """The idle guest devices the hosts' reports mark, one dict each.

    ``hosts``: {name: HostEntry}. Keys: host, gpu, address, device,
    server_id, model, kind, profile, since, seconds, peak_compute,
    peak_memory_mib, suggestion. A device of a model or profile the
    catalog does not know keeps its report's names.
    """
    out = []
    for name, entry in sorted(hosts.items()):
        gpus = {g.index: g for g in entry.report.host.gpus}
        for raw in sorted(entry.raw.get('gpus') or (),
                          key=lambda g: g['index']):
            gpu = gpus.get(raw['index'])
            for n, dev in enumerate(raw.get('devices') or ()):
                mark = dev.get('idle') if isinstance(dev, dict) else None
                if not isinstance(mark, dict):
                    continue
                kind = dev.get('kind')
                try:
                    profile = usage_mod.device_size(
                        gpu.model, kind, dev.get('detail'))[0]
                except Exception:  # a device the core cannot size
                    profile = str(dev.get('detail'))
                out.append({
                    'host': name, 'gpu': raw['index'],
                    'address': raw.get('address'),
                    'device': usage_mod.device_key(raw.get('address'), dev),
                    'server_id': dev.get('instance'),
                    'model': raw.get('model'), 'kind': kind,
                    'profile': profile, 'since': mark.get('since'),
                    'seconds': mark.get('seconds'),
                    'peak_compute': mark.get('peak_compute'),
                    'peak_memory_mib': mark.get('peak_memory_mib'),
                    'suggestion': mark.get('suggestion')})
    return out


def _gauge(name, doc, labels=()):
    return prom_core.GaugeMetricFamily(PREFIX + name, doc,
                                       labels=list(labels))


def _counter(name, doc, labels=()):
    return prom_core.CounterMetricFamily(PREFIX + name, doc,
                                         labels=list(labels))


class CloudCollector:
    def __init__(self, state, stale_after=180, usage=None,
                 idle_notices=None):
        self.state = state
        self.stale_after = stale_after
        self.usage = usage
        self.idle_notices = idle_notices

    def describe(self):
        return []

    def collect(self):
        figures = self.state.figures()
        now = self.state.clock()
        out = []
        out.extend(self._hosts(figures, now))
        out.extend(self._counters(self.state.snapshot_counters()))
        out.append(self._idle(self.state.hosts()))
        if self.usage is not None:
            out.extend(self._usage(self.usage))
        if self.idle_notices is not None:
            out.extend(self._idle_notices(self.idle_notices.stats()))
        return out

    def _idle_notices(self, stats):
        done = _counter('idle_notices', 'Idle GPU notices to owners '
                        '([gpu_exporter] idle_notify) carried out, by '
                        'action: tell (metadata key and notification), '
                        'update (metadata), clear (key removed).',
                        ('action',))
        for action in ('tell', 'update', 'clear'):
            done.add_metric([action], stats[action])
        failed = _counter('idle_notices_failed', 'Idle GPU notices not '
                          'carried out: failed (a Nova call or the '
                          'notification; decided again at the host\'s '
                          'next report), dropped (queue full), metadata '
                          '(told by notification only), write (what was '
                          'told not saved).', ('reason',))
        for reason, key in (('failed', 'failed'), ('dropped', 'dropped'),
                            ('metadata', 'metadata_failed'),
                            ('write', 'write_failed')):
            failed.add_metric([reason], stats[key])
        pending = _gauge('idle_notices_pending', 'Idle GPU notices queued, '
                         'not carried out yet.')
        pending.add_metric([], stats['pending'])
        told = _gauge('idle_notices_servers', 'Servers whose owners are '
                      'told now that a GPU device of theirs is idle.')
        told.add_metric([], stats['told'])
        return [done, failed, pending, told]

    def _idle(self, hosts):
        labels = ('host', 'gpu', 'address', 'device', 'server_id', 'model',
                  'kind', 'profile', 'suggestion')
        g = _gauge('device_idle_seconds', 'How long a guest GPU device has '
                   'stayed under its agent\'s idle_threshold (core.idle); '
                   'suggestion: a smaller profile its observed peak fits.',
                   labels)
        for d in idle_devices(hosts):
            g.add_metric([str(d['host']), str(d['gpu']), d['address'] or '',
                          d['device'] or '', d['server_id'] or '',
                          d['model'] or '', d['kind'] or '',
                          d['profile'] or '', d['suggestion'] or ''],
                         float(d['seconds'] or 0))
        return g

    def _usage(self, book):
        labels = ('project_id', 'server_id', 'model', 'profile')
        gpu = _counter('usage_gpu_seconds', 'GPU-seconds servers held: '
                       'seconds x the device\'s share of one GPU (a whole '
                       'GPU 1, a vGPU or MIG slice its share).', labels)
        fb = _counter('usage_framebuffer_gib_seconds', 'Frame-buffer '
                      'GiB-seconds servers held: GiB of the device\'s '
                      'frame buffer x seconds.', labels)
        dev = _counter('usage_device_seconds', 'Seconds servers held GPU '
                       'devices, one device counting 1.', labels)
        ledger = book.published()
        for (server, model, profile), t in sorted(ledger.totals.items()):
            project = ledger.projects.get(server)
            if project is None:
                # Its series starts once its project is known, rather
                # than under a project_id it would leave.
                continue
            values = [project, server, model, profile]
            gpu.add_metric(values, t.gpu_seconds)
            fb.add_metric(values, t.fb_gib_seconds)
            dev.add_metric(values, t.seconds)
        written = _gauge('usage_ledger_write_timestamp_seconds', 'When the '
                         'usage ledger the usage counters show was '
                         'written (Unix time; 0: not yet).')
        written.add_metric([], book.last_write or 0)
        unattributed = _gauge('usage_unattributed_devices', 'Devices a '
                              'host\'s report shows held with no server '
                              'named (not billed).', ('host',))
        for host, n in sorted(book.unattributed.items()):
            unattributed.add_metric([host], n)
        return [gpu, fb, dev, written, unattributed]

    def _hosts(self, figures, now):
        host_gpus = _gauge('host_gpus', 'Physical GPUs of a host, by model.',
                           ('host', 'model'))
        host_free = _gauge('host_free_gpus', 'Free GPU capacity of a host, '
                           'in GPUs.', ('host',))
        host_dev = _gauge('host_free_devices', 'How many more devices of '
                          'each profile fit on a host now (each counted '
                          'alone).', ('host', 'model', 'kind', 'profile'))
        host_frag = _gauge('host_fragmentation_gpus', 'Expected GPU '
                           'fragmentation of a host (FGD), in GPUs.',
                           ('host',))
        host_frag_r = _gauge('host_fragmentation_ratio', 'Expected GPU '
                             'fragmentation of a host as a share of its '
                             'GPU capacity.', ('host',))
        host_strand = _gauge('host_stranded_gpus', 'Free GPU capacity of a '
                             'host no offered device can use, in GPUs.',
                             ('host',))
        host_seen = _gauge('host_last_report_timestamp_seconds', 'When the '
                           'host\'s newest GPU report arrived (Unix time).',
                           ('host',))
        host_age = _gauge('host_report_age_seconds', 'Age of the host\'s '
                          'newest GPU report.', ('host',))
        host_stale = _gauge('host_stale', '1 when the host\'s report is '
                            'older than the exporter\'s stale_after.',
                            ('host',))
        host_unread = _gauge('host_unreadable_gpus', 'GPUs the host\'s '
                             'agent left out of its report: NVML cannot '
                             'read them.', ('host',))
        host_held = _gauge('gpu_quarantined', '1 for a GPU its agent '
                           'quarantined (core.health): it takes no new '
                           'guest; reason names the fault.',
                           ('host', 'gpu', 'address', 'reason'))
        gpus, free_devices = {}, {}
        capacity = free = frag = stranded = 0.0
        stale = unreadable = quarantined = 0
        for name, (entry, f) in sorted(figures.items()):
            left_out = len(entry.report.left_out)
            host_unread.add_metric([name], left_out)
            unreadable += left_out
            for gpu in entry.report.host.gpus:
                if gpu.quarantine is not None:
                    host_held.add_metric([name, str(gpu.index),
                                          gpu.address, gpu.quarantine], 1)
                    quarantined += 1
            for model, count in sorted(f.gpus.items()):
                host_gpus.add_metric([name, model], count)
                gpus[model] = gpus.get(model, 0) + count
            host_free.add_metric([name], f.free_milli / MILLI)
            for (model, kind, profile), n in sorted(f.free_devices.items()):
                host_dev.add_metric([name, model, kind, profile], n)
                key = (model, kind, profile)
                free_devices[key] = free_devices.get(key, 0) + n
            host_frag.add_metric([name], f.fragmentation_milli / MILLI)
            host_frag_r.add_metric([name], (
                f.fragmentation_milli / f.capacity_milli
                if f.capacity_milli else 0.0))
            host_strand.add_metric([name], f.stranded_milli / MILLI)
            age = max(0.0, now - entry.received)
            host_seen.add_metric([name], entry.received)
            host_age.add_metric([name], age)
            is_stale = int(age > self.stale_after)
            host_stale.add_metric([name], is_stale)
            stale += is_stale
            capacity += f.capacity_milli
            free += f.free_milli
            frag += f.fragmentation_milli
            stranded += f.stranded_milli
        cloud_gpus = _gauge('cloud_gpus', 'Physical GPUs of the cloud, by '
                            'model.', ('model',))
        for model, count in sorted(gpus.items()):
            cloud_gpus.add_metric([model], count)
        cloud_dev = _gauge('cloud_free_devices', 'How many more devices of '
                           'each profile fit in the cloud now (each '
                           'counted alone).', ('model', 'kind', 'profile'))
        for key, n in sorted(free_devices.items()):
            cloud_dev.add_metric(list(key), n)
        out = [host_gpus, host_free, host_dev, host_frag, host_frag_r,
               host_strand, host_seen, host_age, host_stale, host_unread,
               host_held,
               cloud_gpus, cloud_dev]
        for name, doc, value in (
                ('cloud_free_gpus', 'Free GPU capacity of the cloud, in '
                 'GPUs.', free / MILLI),
                ('cloud_allocated_ratio', 'Share of the cloud\'s GPU '
                 'capacity allocated to guests.',
                 (capacity - free) / capacity if capacity else 0.0),
                ('cloud_fragmentation_gpus', 'Expected GPU fragmentation '
                 'of the cloud (FGD, summed over hosts), in GPUs.',
                 frag / MILLI),
                ('cloud_fragmentation_ratio', 'Expected GPU fragmentation '
                 'as a share of the cloud\'s GPU capacity.',
                 frag / capacity if capacity else 0.0),
                ('cloud_stranded_gpus', 'Free GPU capacity no offered '
                 'device can use, in GPUs.', stranded / MILLI),
                ('cloud_hosts', 'GPU hosts that reported.', len(figures)),
                ('cloud_stale_hosts', 'GPU hosts whose report is stale.',
                 stale),
                ('cloud_unreadable_gpus', 'GPUs the agents left out of '
                 'their reports: NVML cannot read them.', unreadable),
                ('cloud_quarantined_gpus', 'GPUs their agents quarantined '
                 'for a hardware fault.', quarantined)):
            g = _gauge(name, doc)
            g.add_metric([], value)
            out.append(g)
        return out

    def _counters(self, c):
        out = []
        for name, key, doc in (
                ('scheduler_requests', 'requests', 'Scheduling requests '
                 'the GPU filter ran on.'),
                ('scheduler_requests_unplaced', 'requests_unplaced',
                 'Requests for which the GPU filter passed no host.'),
                ('placements', 'placements', 'GPU placements the '
                 'scheduler decided.'),
                ('exporter_reports', 'reports', 'Host GPU reports '
                 'received.'),
                ('exporter_reports_rejected', 'reports_rejected',
                 'Host GPU reports that failed validation.')):
            m = _counter(name, doc)
            m.add_metric([], c[key])
            out.append(m)
        refusals = _counter('scheduler_refusals', 'Hosts the GPU filter '
                            'refused, by reason.', ('reason',))
        for reason, n in sorted(c['refusals'].items()):
            refusals.add_metric([reason], n)
        changes = _counter('device_changes', 'GPU devices the agents '
                           'created, removed or rolled back.',
                           ('action', 'kind'))
        for (action, kind), n in sorted(c['device_changes'].items()):
            changes.add_metric([action, kind], n)
        return out + [refusals, changes]
