"""What cannot be real is refused, cheaply first (issue 25, 6).

A report's size is bounded in total (providers, VFs and devices over all
GPUs, ``report.MAX_TOTAL_*``), checked from the lists' lengths before any
entry is read; a PCI address stands for one device (a GPU, a VF); the
header is read alone (``report.parse_header``) so that a receiver can
hold it against the report it has first.
"""

import copy
import time

from nova_gpu.core import exceptions
from nova_gpu.core import report
from nova_gpu.tests.unit.core import base
from nova_gpu.tests.unit.core import test_report


def pool(name, pf, vfs):
    return report.provider_dict(name, report.PCI_POOL, pf,
                                'CUSTOM_NVIDIA_VGPU', 'A100-10C', vfs=vfs)


def vf(gpu, n):
    return '0000:%02x:%02x.%d' % (gpu, 1 + n // 8, n % 8)


def big(gpus, providers, vfs, model='A100-40GB'):
    """A report of ``gpus`` GPUs with ``providers`` pools of ``vfs`` VFs
    each, distinct everywhere (built fast: ``vfs`` lists are shared).
    """
    raws = []
    for i in range(gpus):
        pf = '0000:%02x:00.0' % i
        addresses = [vf(i, n) for n in range(vfs)]
        raws.append({'index': i, 'address': pf, 'model': model,
                     'providers': [pool('h_%d_%d' % (i, p), pf, addresses)
                                   for p in range(providers)]})
    return {'version': 2, 'host': 'h', 'generation': 1, 'gpus': raws}


class SizeTest(base.TestCase):

    def refused(self, data):
        return self.assertRaises(report.ReportError, report.parse, data,
                                 self.catalog)

    def test_too_many_providers_over_all_gpus(self):
        # Each GPU within the per-GPU bound (512), the total not. GPU 0's
        # model is unknown: the size is checked before any GPU is read.
        data = big(9, report.MAX_PROVIDERS, 0)
        data['gpus'][0]['model'] = 'no such model'
        err = self.refused(data)
        self.assertEqual('gpus', err.field)
        self.assertIn('more than 4096 providers over all GPUs', str(err))

    def test_too_many_vfs_over_all_gpus(self):
        data = big(9, 1, report.MAX_LIST)
        data['gpus'][0]['model'] = 'no such model'
        err = self.refused(data)
        self.assertIn('more than 4096 VFs over all GPUs', str(err))

    def test_too_many_devices_over_all_gpus(self):
        data = big(2, 0, 0)
        for raw in data['gpus']:
            raw['devices'] = [{'kind': 'vgpu', 'detail': 'A100-10C'}] * (
                report.MAX_DEVICES)
        err = self.refused(data)
        self.assertIn('more than 4096 devices over all GPUs', str(err))

    def test_left_out_providers_count(self):
        data = big(8, report.MAX_PROVIDERS, 0)
        data['left_out'] = [{'address': '0000:ee:00.0', 'reason': 'lost',
                             'providers': ['x%d' % n for n in range(8)]}]
        self.assertIn('providers over all GPUs', str(self.refused(data)))

    def test_largest_bounded_report_refused_at_once(self):
        # The per-field bounds' largest: 64 GPUs x 512 providers x 512
        # VFs took about 30 s to read in full.
        data = big(report.MAX_GPUS, report.MAX_PROVIDERS, report.MAX_LIST)
        start = time.perf_counter()
        self.refused(data)
        self.assertLess(time.perf_counter() - start, 0.5)
        # The largest real host is not: 16 GPUs of 64 VFs each, a pool of
        # them and an mdev provider for each VF, beside the PF's.
        data = big(16, 1, 64)
        for i, raw in enumerate(data['gpus']):
            pf = raw['address']
            raw['providers'].append(report.provider_dict(
                'h_pf_%d' % i, report.PF_MDEV, pf))
            raw['providers'] += [report.provider_dict(
                'h_vf_%d_%d' % (i, n), report.VF_MDEV, '0000:%02x:%02x.%d'
                % (0x80 + i, 1 + n // 8, n % 8), vgpu_type='A100-10C')
                for n in range(64)]
            raw['devices'] = [{'kind': 'vgpu', 'detail': 'A100-10C'}] * 4
        parsed = report.parse(data, self.catalog)
        self.assertEqual(16, len(parsed.host.gpus))
        self.assertEqual(16 * 66, len(parsed.providers))


class DuplicateAddressTest(base.TestCase):

    def refused(self, data, field):
        err = self.assertRaises(report.ReportError, report.parse, data,
                                self.catalog)
        self.assertEqual(field, err.field)
        self.assertIn('listed twice', err.problem)
        return err

    def test_gpu_address_twice(self):
        data = test_report._v2(self.catalog,
                               **{'gpus.2.address': '0000:18:00.0'})
        err = self.refused(data, 'gpus[2].address')
        self.assertIn('also gpus[0].address', str(err))
        # Case is no disguise.
        data = test_report._v2(self.catalog, **{
            'gpus.2.address': '0000:3b:00.0',
            'gpus.3.address': '0000:3B:00.0'})
        self.refused(data, 'gpus[3].address')
        # Distinct addresses are what a real host reports.
        report.parse(test_report._v2(self.catalog), self.catalog)

    def test_vf_twice_in_one_pool(self):
        data = test_report._v2(self.catalog, **{
            'gpus.2.providers.0.vfs': ['0000:58:00.4', '0000:58:00.4']})
        self.refused(data, 'gpus[2].providers[0].vfs[1]')

    def test_vf_in_two_pools(self):
        data = test_report._v2(self.catalog)
        data['gpus'][3]['providers'] = [pool(
            'c1_0000:78:00.0', '0000:78:00.0', ['0000:58:00.5'])]
        err = self.refused(data, 'gpus[3].providers[0].vfs[0]')
        self.assertIn('also gpus[2].providers[0].vfs[1]', str(err))

    def test_vf_that_is_a_gpu(self):
        data = test_report._v2(self.catalog, **{
            'gpus.2.providers.0.vfs': ['0000:58:00.4', '0000:18:00.0']})
        err = self.refused(data, 'gpus[2].providers[0].vfs[1]')
        self.assertIn('also gpus[0].address', str(err))

    def test_two_mdev_providers_of_one_vf(self):
        data = test_report._v2(self.catalog)
        extra = copy.deepcopy(data['gpus'][1]['providers'][0])
        extra['name'] = 'c1_other'
        data['gpus'][1]['providers'].append(extra)
        self.refused(data, 'gpus[1].providers[1].address')

    def test_left_out_gpu_twice(self):
        gone = {'address': '0000:98:00.0', 'reason': 'lost'}
        data = test_report._v2(self.catalog, left_out=[gone, gone])
        self.refused(data, 'left_out[1].address')


class HeaderTest(base.TestCase):

    def test_header_read_alone(self):
        data = test_report._v2(self.catalog, gpus='not even a list')
        header = report.parse_header(data)
        self.assertEqual((2, 'c1', 'c1', 3, 'run-1'),
                         (header.version, header.host, header.nodename,
                          header.generation, header.boot_id))
        self.assertRaises(report.ReportError, report.parse, data,
                          self.catalog)

    def test_header_fields_checked(self):
        for changes in ({'generation': float('inf')}, {'version': 9},
                        {'host': ''}, {'boot_id': 7}, {'nodename': 3}):
            data = test_report._v2(self.catalog, **changes)
            err = self.assertRaises(report.ReportError, report.parse_header,
                                    data)
            self.assertIsInstance(err, exceptions.InvalidRequest)
        self.assertRaises(report.ReportError, report.parse_header, [])
