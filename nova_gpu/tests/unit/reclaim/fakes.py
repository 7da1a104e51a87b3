"""A fake cloud for the reclaimer service: reports, servers, compute API."""

import dataclasses

from nova_gpu.core import catalog as catalog_mod
from nova_gpu.core import host as host_mod
from nova_gpu.core import report as report_mod
from nova_gpu.reclaim import planner_view as inventory

CATALOG = catalog_mod.load_catalog()
T4 = CATALOG.model('T4')
PROFILE = 'T4-16C'  # one per GPU
ON_DEMAND = {'gpu:profile': PROFILE, 'resources:VGPU': '1'}
SPOT = dict(ON_DEMAND, **{'gpu:preemptible': 'true'})


def provider(host, gpu):
    return '%s_pci_0000_%02x_00_0' % (host, 0x81 + gpu)


def report(host, used, generation=1, gpus=2):
    """Report of ``host``: ``gpus`` T4 GPUs with a T4-16C provider each;
    ``used``: the GPU indices holding a vGPU.
    """
    devices = [host_mod.Gpu(i, T4, address='0000:%02x:00.0' % (0x81 + i),
                            vgpu_types=[PROFILE]) for i in range(gpus)]
    h = host_mod.Host(host, devices, 64000, 262144)
    return report_mod.host_to_dict(
        h, host, generation,
        providers={i: [report_mod.provider_dict(
            provider(host, i), report_mod.PF_MDEV,
            '0000:%02x:00.0' % (0x81 + i), vgpu_type=PROFILE)]
            for i in range(gpus)},
        devices={i: [{'kind': 'vgpu', 'detail': PROFILE}] for i in used})


def server(sid, host, gpu, specs, status='ACTIVE', project='p1'):
    return inventory.ServerInfo(
        sid, sid, host, status, project, 'u-' + project, dict(specs),
        {provider(host, gpu): {'VGPU': 1}})


class FakeCompute:
    """The compute client's methods, on a dict of ServerInfo."""

    def __init__(self, servers, flavors=None):
        self.by_id = {s.id: s for s in servers}
        self.flavors = flavors or {}
        self.calls = []
        self.on_metadata = None  # hook: called after set_metadata

    def servers(self):
        return list(self.by_id.values())

    def server(self, server_id):
        return self.by_id.get(server_id)

    def flavor(self, name):
        return self.flavors[name], 2, 2048

    def _set(self, server_id, **changes):
        self.by_id[server_id] = dataclasses.replace(self.by_id[server_id],
                                                    **changes)

    def set_metadata(self, server_id, metadata):
        self.calls.append(('metadata', server_id, dict(metadata)))
        if self.on_metadata:
            self.on_metadata(server_id)

    def shelve(self, server_id):
        self.calls.append(('shelve', server_id))
        self._set(server_id, status='SHELVED')

    def shelve_offload(self, server_id):
        self.calls.append(('shelve_offload', server_id))
        self._set(server_id, status='SHELVED_OFFLOADED', host=None,
                  providers={})

    def delete(self, server_id):
        self.calls.append(('delete', server_id))
        del self.by_id[server_id]

    def live_migrate(self, server_id, host):
        self.calls.append(('live_migrate', server_id, host))

    def actions(self):
        return [c for c in self.calls if c[0] != 'metadata']


class Sent:
    """A notifier (``info``) that keeps what is sent."""

    def __init__(self):
        self.sent = []

    def info(self, ctxt, event_type, payload):
        self.sent.append((event_type, payload))

    def events(self):
        return [(e, p['nova_object.data']['instance_uuid'])
                for e, p in self.sent]


def build_error(instance, specs, exception='NoValidHost', name='gpu.small'):
    """Nova's compute_task.build_instances.error payload (as serialised)."""
    return {
        'nova_object.name': 'ComputeTaskPayload',
        'nova_object.namespace': 'nova', 'nova_object.version': '1.0',
        'nova_object.data': {
            'instance_uuid': instance, 'state': 'error',
            'reason': {'nova_object.name': 'ExceptionPayload',
                       'nova_object.data': {
                           'exception': exception,
                           'exception_message': 'No valid host was found.',
                           'function_name': '_schedule_instances',
                           'module_name': 'nova.conductor.manager',
                           'traceback': ''}},
            'request_spec': {
                'nova_object.name': 'RequestSpecPayload',
                'nova_object.data': {
                    'instance_uuid': instance, 'project_id': 'p2',
                    'user_id': 'u2', 'num_instances': 1,
                    'flavor': {'nova_object.name': 'FlavorPayload',
                               'nova_object.data': {
                                   'name': name, 'vcpus': 2,
                                   'memory_mb': 2048,
                                   'extra_specs': dict(specs)}}}}}}
