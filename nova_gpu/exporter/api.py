"""The exporter's HTTP server: /metrics and a small read-only JSON API.

``openstack gpu`` (``nova_gpu.osc``) reads the JSON API; Prometheus
scrapes /metrics. Both show the same ``CloudState``. Routes (GET only)::

    /metrics                    Prometheus text format
    /v1/hosts                   {"hosts": [host summary, ...]}
    /v1/hosts/<host>            host summary + "gpus" + "free_devices"
    /v1/capacity                {"capacity": [{model, kind, profile, servers,
                                               free, hosts}, ...]}
    /v1/providers               {"providers": [{name, host, gpu, kind,
                                   address, vfs, vgpu_type, mig}, ...]}
    /v1/usage?start=T1[&end=T2][&project=P][&server=S]
                                {"usage": [{project_id, server_id, model,
                                  profile, seconds, gpu_seconds,
                                  fb_gib_seconds, first, last}, ...],
                                 start, end, ledger_since, written}
    /v1/idle                    {"idle": [{host, gpu, address, device,
                                  server_id, model, kind, profile, since,
                                  seconds, peak_compute, peak_memory_mib,
                                  suggestion}, ...]} (core.idle)

Times are ISO 8601 (a time without an offset is UTC); answers give them
in UTC. Unknown paths answer 404, other methods 405, bad parameters 400,
all with a JSON error.
"""

import datetime
import itertools
import json
import urllib.parse

import prometheus_client

from nova_gpu.core import host as host_mod
from nova_gpu.exporter import collector
from nova_gpu import wsgi_server

MILLI = float(host_mod.MILLI)


def _summary(entry, figures, now, stale_after):
    age = max(0.0, now - entry.received)
    return {
        'host': entry.name,
        'nodename': entry.report.nodename,
        'generation': entry.report.generation,
        'gpus': len(entry.report.host.gpus),
        'models': dict(sorted(figures.gpus.items())),
        'free_gpus': figures.free_milli / MILLI,
        'fragmentation_gpus': round(figures.fragmentation_milli / MILLI, 6),
        'fragmentation_ratio': round(
            figures.fragmentation_milli / figures.capacity_milli
            if figures.capacity_milli else 0.0, 6),
        'stranded_gpus': figures.stranded_milli / MILLI,
        'report_age_seconds': round(age, 3),
        'stale': age > stale_after,
        # GPUs the agent left out of the report (NVML cannot read them).
        'unreadable_gpus': [{'address': g.address, 'reason': g.reason}
                            for g in entry.report.left_out],
        # GPUs the agent quarantined for a hardware fault (core.health).
        'quarantined_gpus': [{'address': g.address, 'reason': g.quarantine}
                             for g in entry.report.host.gpus
                             if g.quarantine is not None],
    }


def _gpu(gpu, raw, providers):
    return {
        'index': gpu.index, 'address': gpu.address, 'model': gpu.model.name,
        'numa_node': gpu.numa_node, 'mig_enabled': gpu.mig_enabled,
        'pcie_switch': raw.get('pcie_switch'),
        'nvlink_peers': list(raw.get('nvlink_peers') or ()),
        'vgpu_types': list(gpu.vgpu_types or ()),
        'free_ratio': gpu.free_milli / MILLI,
        'devices': list(raw.get('devices') or ()),
        'providers': [p.name for p in providers],
        # What the agent's health pass found: faults, since when, evidence.
        'health': raw.get('health'),
    }


def parse_time(value, name):
    """Unix time of an ISO 8601 ``value``; ValueError naming ``name``."""
    try:
        when = datetime.datetime.fromisoformat(value)
    except (TypeError, ValueError):
        raise ValueError('%s=%r is not an ISO 8601 time (e.g. '
                         '2025-01-31T00:00:00Z)' % (name, value)) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.timezone.utc)
    return when.timestamp()


def iso(t):
    """ISO 8601 (UTC) of a Unix time."""
    return datetime.datetime.fromtimestamp(
        t, datetime.timezone.utc).isoformat()


USAGE_PARAMETERS = ('start', 'end', 'project', 'server')


def usage_body(book, query):
    """The /v1/usage answer for ``query`` (a parsed query string)."""
    unknown = sorted(set(query) - set(USAGE_PARAMETERS))
    if unknown:
        raise ValueError('unknown parameter %s (known: %s)' % (
            ', '.join(unknown), ', '.join(USAGE_PARAMETERS)))
    for name, values in query.items():
        if len(values) != 1:
            raise ValueError('%s given %d times' % (name, len(values)))
    if 'start' not in query:
        raise ValueError('start is required (ISO 8601)')
    start = parse_time(query['start'][0], 'start')
    end = (parse_time(query['end'][0], 'end') if 'end' in query
           else book.clock())
    if end <= start:
        raise ValueError('end (%s) must be after start (%s)'
                         % (iso(end), iso(start)))
    ledger = book.published()
    rows = ledger.usage(start, end,
                        project=query.get('project', [None])[0],
                        server=query.get('server', [None])[0])
    for row in rows:
        row['first'], row['last'] = iso(row['first']), iso(row['last'])
    return {'usage': rows, 'start': iso(start), 'end': iso(end),
            'ledger_since': iso(ledger.since) if ledger.since else None,
            'written': iso(book.last_write) if book.last_write else None}


class Api:
    def __init__(self, state, registry, stale_after, usage=None):
        self.state = state
        self.stale_after = stale_after
        self.usage = usage
        self.metrics = prometheus_client.make_wsgi_app(registry)

    def __call__(self, environ, start_response):
        path = environ.get('PATH_INFO', '/').rstrip('/') or '/'
        if path == '/metrics':
            return self.metrics(environ, start_response)
        if environ.get('REQUEST_METHOD', 'GET') not in ('GET', 'HEAD'):
            return self._reply(start_response, 405,
                               {'error': 'read-only API: GET only'})
        parts = path.strip('/').split('/')
        try:
            if parts[:1] != ['v1']:
                raise LookupError('no such path: %s' % path)
            if parts == ['v1', 'usage'] and self.usage is not None:
                body = usage_body(self.usage, urllib.parse.parse_qs(
                    environ.get('QUERY_STRING', ''),
                    keep_blank_values=True))
            else:
                body = self.route(parts[1:])
        except LookupError as e:
            return self._reply(start_response, 404, {'error': str(e)})
        except ValueError as e:
            return self._reply(start_response, 400, {'error': str(e)})
        return self._reply(start_response, 200, body)

    @staticmethod
    def _reply(start_response, status, body):
        data = json.dumps(body, sort_keys=True).encode()
        start_response('%d %s' % (status, {200: 'OK', 400: 'Bad Request',
                                           404: 'Not Found',
                                           405: 'Method Not Allowed'}
                                  [status]),
                       [('Content-Type', 'application/json'),
                        ('Content-Length', str(len(data)))])
        return [data]

    def route(self, parts):
        figures = self.state.figures()
        now = self.state.clock()
        if parts == ['hosts']:
            return {'hosts': [_summary(e, f, now, self.stale_after)
                              for _n, (e, f) in sorted(figures.items())]}
        if len(parts) == 2 and parts[0] == 'hosts':
            if parts[1] not in figures:
                raise LookupError('no GPU report from host %s' % parts[1])
            entry, f = figures[parts[1]]
            body = _summary(entry, f, now, self.stale_after)
            by_gpu = {}
            for p in entry.report.providers:
                by_gpu.setdefault(p.gpu, []).append(p)
            raws = sorted(entry.raw['gpus'], key=lambda g: g['index'])
            body['gpus'] = [_gpu(g, raw, by_gpu.get(g.index, ()))
                            for g, raw in zip(entry.report.host.gpus, raws)]
            # What planners outside the scheduler (``openstack gpu
            # defrag``) need to judge a destination as the scheduler does:
            # the host's CPU, memory and NUMA cells, and its vGPU manager.
            for key in ('cpu_milli', 'memory_mib', 'numa_cells', 'nvidia'):
                body[key] = entry.raw.get(key)
            body['free_devices'] = [
                {'model': m, 'kind': k, 'profile': p, 'free': n}
                for (m, k, p), n in sorted(f.free_devices.items())]
            return body
        if parts == ['capacity']:
            totals, servers = {}, {}
            for _n, (_e, f) in figures.items():
                for key, n in f.free_devices.items():
                    free, hosts = totals.get(key, (0, 0))
                    totals[key] = (free + n, hosts + (1 if n else 0))
                    fit = f.free_servers.get(key, ())
                    servers[key] = [a + b for a, b in itertools.zip_longest(
                        servers.get(key, []), fit, fillvalue=0)]
            return {'capacity': [
                {'model': m, 'kind': k, 'profile': p, 'free': free,
                 'hosts': hosts,
                 # servers asking 1, 2, ... of these devices, each on its
                 # own GPU, that fit now (host by host)
                 'servers': servers.get((m, k, p), [])}
                for (m, k, p), (free, hosts) in sorted(totals.items())]}
        if parts == ['idle']:
            idle = collector.idle_devices(self.state.hosts())
            for row in idle:
                row['since'] = iso(row['since']) if row['since'] else None
            return {'idle': idle}
        if parts == ['providers']:
            return {'providers': [
                {'name': p.name, 'host': e.name, 'gpu': p.gpu,
                 'gpu_address': e.report.host.gpus[p.gpu].address,
                 'model': e.report.host.gpus[p.gpu].model.name,
                 'kind': p.kind, 'address': p.address,
                 'resource_class': p.resource_class,
                 'vgpu_type': p.vgpu_type, 'vfs': list(p.vfs),
                 'mig': list(p.mig) if p.mig else None}
                for _n, (e, _f) in sorted(figures.items())
                for p in e.report.providers]}
        raise LookupError('no such path: /v1/%s' % '/'.join(parts))


class HttpServer(wsgi_server.WsgiServer):
    """Serves the exporter's ``app`` on ``address:port`` (0: any free
    port) in the background, the way ``nova_gpu.wsgi_server`` serves
    (eventlet's server where eventlet patched the process, else a stdlib
    server thread).
    """

    def __init__(self, app, address, port):
        super().__init__(app, address, port, name='nova-gpu-exporter-http')
