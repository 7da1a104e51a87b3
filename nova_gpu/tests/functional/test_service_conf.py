"""Each Nova service starts from its own files of etc/nova, as Nova does.

A service whose file lacks a setting Nova checks at start fails there, as
nova-api and nova-compute refuse ``[pci] alias`` entries without vendor
and product ids unless ``[filter_scheduler] pci_in_placement`` is on in
that service (nova/pci/request.py, ``_validate_required_ids``).
"""

import os
import shutil
import tempfile

import fixtures
from nova import exception
from nova.pci import request
from nova import test
from oslo_config import cfg

from nova_gpu.core import gpu_sets
from nova_gpu.tests.harness import cloud
from nova_gpu.tests.harness import service_conf

CONF = cfg.CONF


def _etc_copy(case, edit=None):
    """A copy of etc/nova the test may edit: {file name: text -> text}."""
    tmp = tempfile.mkdtemp(prefix='ngpu-etc-')
    case.addCleanup(shutil.rmtree, tmp, ignore_errors=True)
    for name in service_conf.all_files():
        with open(os.path.join(service_conf.etc_dir(), name)) as f:
            text = f.read()
        if edit and name in edit:
            text = edit[name](text)
        with open(os.path.join(tmp, name), 'w') as f:
            f.write(text)
    case.useFixture(fixtures.MonkeyPatch(
        'nova_gpu.tests.harness.service_conf.etc_dir', lambda: tmp))


def _without_pci_in_placement(text):
    return text.replace('pci_in_placement = True', '')


class ServiceFilesTest(test.NoDBTestCase):
    """Nova's own start-time check on each service's files."""

    def _check(self, service, **kwargs):
        values = service_conf.merge(service_conf.service_files(
            service, **kwargs))
        service_conf.apply(self, values, set())
        return request.get_alias_from_config()

    def test_every_service_file_set_passes_novas_check(self):
        # The one-device aliases and the set aliases of multi-GPU flavors
        # (core.gpu_sets), each with its resource class and trait, and the
        # RDMA NIC functions of gpu:rdma flavors (core.rdma).
        expected = {'nvidia-gpu', 'nvidia-vgpu', 'rdma-vf'} | {
            gpu_sets.alias_name(base, count, k)
            for base in ('nvidia-gpu', 'nvidia-vgpu')
            for count in range(2, gpu_sets.MAX_COUNT + 1)
            for k in range(count)}
        for service in service_conf.SERVICES:
            aliases = self._check(service, pci=True)
            self.assertEqual(expected, set(aliases))
        for path in service_conf.PATH_FILES:
            aliases = self._check(service_conf.COMPUTE, pci=True,
                                  paths=[path])
            self.assertEqual(expected, set(aliases))
        spec = aliases['nvidia-gpu-set4-3'][1][0]
        self.assertEqual('CUSTOM_NOVA_GPU_SET4_3', spec['traits'])
        self.assertEqual('CUSTOM_NVIDIA_GPU', spec['resource_class'])

    def test_aliases_without_pci_in_placement_refused_as_nova_does(self):
        # The old docs: the aliases in nova-api's and nova-compute's files,
        # pci_in_placement in the scheduler's only.
        _etc_copy(self, {service_conf.PCI_FILE: _without_pci_in_placement})
        for service in (service_conf.API, service_conf.COMPUTE):
            self.assertRaisesRegex(
                exception.PciInvalidAlias, 'vendor_id and product_id',
                self._check, service, pci=True)

    def test_unknown_option_named(self):
        _etc_copy(self, {'nova-api.conf': lambda t: t + 'vgpu_backnd = x\n'})
        self.assertRaisesRegex(
            service_conf.ConflictingFiles,
            r'nova-api.conf sets \[gpu_scheduler\] vgpu_backnd',
            service_conf.merge, ['nova-api.conf'])

    def test_one_option_two_values_refused(self):
        _etc_copy(self, {'nova-api.conf': lambda t: t.replace(
            'vgpu_backend = mdev', 'vgpu_backend = vfio')})
        by_service = {s: service_conf.merge(service_conf.service_files(s))
                      for s in service_conf.SERVICES}
        self.assertRaisesRegex(
            service_conf.ConflictingFiles,
            r'\[gpu_scheduler\] vgpu_backend is .* for nova-api',
            service_conf.union, by_service)

    def test_pci_in_one_service_only_refused(self):
        by_service = {s: service_conf.merge(service_conf.service_files(
            s, pci=s == service_conf.SCHEDULER))
            for s in service_conf.SERVICES}
        self.assertRaisesRegex(
            service_conf.ConflictingFiles,
            r'\[filter_scheduler\] pci_in_placement is set for '
            r'nova-scheduler but not for nova-api',
            service_conf.union, by_service)

    def test_device_spec_keeps_the_path_files_keys(self):
        values = service_conf.host_values(
            service_conf.merge(service_conf.service_files(
                service_conf.COMPUTE, pci=True, paths=['vfio'])),
            {}, [('vfio', '0000:81:00.4')])
        self.assertEqual(
            ['{"address": "0000:81:00.4", "resource_class": '
             '"CUSTOM_NVIDIA_VGPU", "managed": "no"}'],
            values[('pci', 'device_spec')])


class CloudFromOldFilesTest(cloud.GpuCloudTestCase):
    """The in-process cloud fails to start where Nova would: nova-api."""

    HOSTS = (cloud.GpuHost('h200', 'H200', None, gpus=1,
                           path=cloud.PASSTHROUGH),)

    def setUp(self):
        _etc_copy(self, {service_conf.PCI_FILE: _without_pci_in_placement})
        self.start_error = None
        try:
            super().setUp()
        except exception.PciInvalidAlias as e:
            self.start_error = e

    def test_api_refuses_to_start(self):
        self.assertIsInstance(self.start_error, exception.PciInvalidAlias)
        self.assertFalse(hasattr(self, 'api_fixture'))
