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
* ``nova_gpu_host_unreadable_gpus`` / ``nova_gpu_cloud_unreadable_gpus``:
  GPUs the agents left out of their reports (``left_out``: NVML cannot
  read them), not counted in the figures above;
* counters from the notifications: ``nova_gpu_scheduler_requests_total``,
  ``nova_gpu_scheduler_requests_unplaced_total``,
  ``nova_gpu_scheduler_refusals_total{reason}`` (hosts refused),
  ``nova_gpu_placements_total``, ``nova_gpu_device_changes_total{action,
  kind}``, ``nova_gpu_exporter_reports_total``,
  ``nova_gpu_exporter_reports_rejected_total``.
"""

from prometheus_client import core as prom_core

from nova_gpu.core import host as host_mod

PREFIX = 'nova_gpu_'
MILLI = float(host_mod.MILLI)


def _gauge(name, doc, labels=()):
    return prom_core.GaugeMetricFamily(PREFIX + name, doc,
                                       labels=list(labels))


def _counter(name, doc, labels=()):
    return prom_core.CounterMetricFamily(PREFIX + name, doc,
                                         labels=list(labels))


class CloudCollector:
    def __init__(self, state, stale_after=180):
        self.state = state
        self.stale_after = stale_after

    def describe(self):
        return []

    def collect(self):
        figures = self.state.figures()
        now = self.state.clock()
        out = []
        out.extend(self._hosts(figures, now))
        out.extend(self._counters(self.state.snapshot_counters()))
        return out

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
        gpus, free_devices = {}, {}
        capacity = free = frag = stranded = 0.0
        stale = unreadable = 0
        for name, (entry, f) in sorted(figures.items()):
            left_out = len(entry.report.left_out)
            host_unread.add_metric([name], left_out)
            unreadable += left_out
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
                 'their reports: NVML cannot read them.', unreadable)):
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
