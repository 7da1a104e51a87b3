"""Defragmentation by vGPU live migration, in real Nova.

Two T4 hosts (the vGPU type T4-16C enabled on every GPU, one per GPU:
each guest holds a whole GPU), two GPUs each, one guest on each host: no
host has two free GPUs, so a two-GPU request is refused (NoValidHost).
``openstack gpu defrag`` (the command's class, run as OpenStackClient
runs it) reads the cloud (the exporter's JSON API on the hosts' reports,
servers from Nova's API, their allocations from Placement; the calls it
makes through openstacksdk are answered by the harness's API clients),
plans from the demand model's large requests (``--dry-run`` first), and
carries the one live migration it chooses out through Nova's
live-migration API; Nova's libvirt driver moves the guest and its
vGPU (fake libvirt, as in Nova's own ``VGPULiveMigrationTests``, with
the libvirt and QEMU versions Nova requires for mdev live migration).
The server ends ACTIVE on its destination, and the two-GPU request then
fits on the host it left.

Nova keeps an mdev after its guest leaves; nova-gpu-agent removes such
orphans after a grace period (``[gpu_agent] remove_orphans``,
``agent.reconcile``). No agent runs in this harness, so the test removes
the source's unused mdev itself, as the agent would, before the
two-GPU request.
"""

import io
import json
import types

from nova.tests.functional.api import client
from nova.tests.functional.libvirt import base as libvirt_base
from openstack import exceptions as sdk_exceptions
import prometheus_client

from nova_gpu import cloud_api
from nova_gpu.core import catalog as catalog_mod
from nova_gpu.core import defrag
from nova_gpu.core import inventory
from nova_gpu.exporter import api as exporter_api
from nova_gpu.exporter import cloud as exporter_cloud
from nova_gpu.osc import defrag as defrag_cmd
from nova_gpu.tests.harness import cloud

FULL = 'T4-16C'


class InProcessExporter:
    """nova-gpu-exporter's JSON API on the harness's reports, no HTTP."""

    def __init__(self, case):
        self.state = exporter_cloud.CloudState(case.catalog)
        for name in case._host_specs:
            self.state.ingest_report(case.gpu_report(name))
        self.api = exporter_api.Api(
            self.state, prometheus_client.CollectorRegistry(), 180)

    def hosts(self):
        return self.api.route(['hosts'])['hosts']

    def host(self, name):
        return self.api.route(['hosts', name])

    def providers(self):
        return self.api.route(['providers'])['providers']


class NovaConnection:
    """The openstacksdk calls ``core.defrag`` makes, answered by Nova's
    and Placement's APIs through the harness's clients.
    """

    def __init__(self, case):
        self.case = case
        self.compute = types.SimpleNamespace(
            servers=self.servers, get_server=self.get_server,
            live_migrate_server=self.live_migrate_server)
        self.placement = types.SimpleNamespace(get=self.placement_get)
        self.image = types.SimpleNamespace(
            get_image=lambda image_id: types.SimpleNamespace(properties={}))

    @staticmethod
    def _server(body):
        return types.SimpleNamespace(
            id=body['id'], status=body['status'],
            compute_host=body.get('OS-EXT-SRV-ATTR:host'),
            task_state=body.get('OS-EXT-STS:task_state'),
            image=body.get('image'), fault=body.get('fault'))

    def servers(self, details, all_projects):
        return [self._server(s) for s in self.case.admin_api.get_servers(
            detail=details, search_opts={'all_tenants': 1})]

    def get_server(self, server_id):
        try:
            return self._server(self.case.admin_api.get_server(server_id))
        except client.OpenStackApiNotFoundException as e:
            raise sdk_exceptions.NotFoundException(str(e)) from e

    def live_migrate_server(self, server_id, host, block_migration):
        self.case.moving_to = host
        self.case.admin_api.post_server_action(server_id, {
            'os-migrateLive': {'host': host,
                               'block_migration': block_migration}})

    def placement_get(self, url, microversion=None, raise_exc=True):
        resp = self.case.placement.get(url, version=microversion)
        return types.SimpleNamespace(status_code=resp.status,
                                     json=lambda: resp.body,
                                     text=str(resp.body))


class DefragLiveMigrationTest(libvirt_base.LibvirtMigrationMixin,
                              cloud.GpuCloudTestCase):
    HOSTS = (cloud.GpuHost('t4-a', 'T4', FULL, gpus=2, numa=(0, 0)),
             cloud.GpuHost('t4-b', 'T4', FULL, gpus=2, numa=(0, 0)))
    # Nova live-migrates mdevs from libvirt 8.6.0 and QEMU 8.1.0 on.
    FAKE_LIBVIRT_VERSION = 8006000
    FAKE_QEMU_VERSION = 8001000

    def setUp(self):
        super().setUp()
        self.catalog = catalog_mod.load_catalog()
        self.moving_to = None

    def _migrate_stub(self, domain, destination, params, flags):
        # Nova's fake libvirt does not migrate by itself: define the guest
        # on the destination with the XML Nova's driver made for it (its
        # mdev there) and end the source's job (Nova's own mixin does the
        # same with fixed hosts).
        self.computes[self.moving_to].driver._host.get_connection(
        ).createXML(params['destination_xml'], 'flags-unused')
        domain.complete_job()
        self.migrate_stub_ran = True

    def defrag(self, conn, *argv):
        """Run ``openstack gpu defrag ARGV -f json``: (exit code, rows)."""
        app = types.SimpleNamespace(
            client_manager=types.SimpleNamespace(
                gpu=InProcessExporter(self), sdk_connection=conn),
            stdout=io.StringIO(), stderr=io.StringIO(), options=None)
        cmd = defrag_cmd.Defrag(app, None)
        parsed = cmd.get_parser('openstack gpu defrag').parse_args(
            list(argv) + ['-f', 'json', '--timeout', '60'])
        code = cmd.run(parsed)
        return code, json.loads(app.stdout.getvalue())

    def host_of(self, server):
        return self.admin_api.get_server(server['id'])[
            'OS-EXT-SRV-ATTR:host']

    def remove_orphan_mdevs(self, hostname):
        """What the agent's reconcile does after its grace period."""
        conn = self.computes[hostname].driver._host.get_connection()
        used = self._domain_devices(hostname)
        for name in list(conn.mdev_info.devices):
            uuid = name[len('mdev_'):].replace('_', '-')
            if uuid not in used:
                del conn.mdev_info.devices[name]
        self._run_periodics()
        self.sync_gpu_reports()

    def test_planned_live_migration_makes_room(self):
        one = self.create_gpu_flavor({'gpu:profile': FULL})
        two = self.create_gpu_flavor({'gpu:profile': FULL, 'gpu:count': '2'})
        servers = {h: self.boot(one, host=h) for h in ('t4-a', 't4-b')}
        # Fragmented: a GPU free on each host, two on none.
        refused = self.boot(two, expected_state='ERROR')
        self.assertIn('No valid host', refused['fault']['message'])
        self._delete_server(refused)

        conn = NovaConnection(self)
        hosts, found, infos, problems = inventory.read_cloud(
            InProcessExporter(self), cloud_api.Cloud(conn), self.catalog)
        self.assertEqual([], problems)
        self.assertEqual({s['id'] for s in servers.values()},
                         {s.id for s in found if s.movable})

        # "openstack gpu defrag --dry-run": the plan, nothing moved.
        code, (row,) = self.defrag(conn, '--dry-run', '--min-gpus', '2')
        self.assertEqual((0, 'planned'), (code, row['Status']))
        source, dest = (row['Source'].split()[0],
                        row['Destination'].split()[0])
        self.assertNotEqual(source, dest)
        self.assertEqual(servers[source]['id'], row['Server'])
        self.assertEqual([], self.admin_api.get_migrations())

        # "openstack gpu defrag": carried out through Nova's API.
        code, (row,) = self.defrag(conn, '--min-gpus', '2')
        self.assertEqual((0, defrag.DONE), (code, row['Status']),
                         row['Detail'])
        self.assertTrue(self.migrate_stub_ran)
        moved = self._wait_for_state_change(servers[source], 'ACTIVE')
        self.assertEqual(dest, self.host_of(moved))
        # Nova's own migration record, and the vGPU on the destination.
        (migration,) = self.admin_api.get_migrations()
        self.assertEqual(('live-migration', 'completed', source, dest), (
            migration['migration_type'], migration['status'],
            migration['source_compute'], migration['dest_compute']))
        (device,) = self.guest_devices(moved)
        self.assertEqual((dest, FULL), (device.host, device.vgpu_type))
        self.assertEqual({0: (1, 1), 1: (1, 1)}, self.vgpu_usage(dest))

        self.remove_orphan_mdevs(source)
        big = self.boot(two)
        self.assertEqual(source, self.host_of(big))
        self.assertEqual([0, 1], self.gpus_of(big))
