"""The libvirt qemu hook types vendor-VFIO VFs just in time (fake sysfs)."""

import io
import os
import time
import types

import fixtures
import testtools

from nova_gpu.agent import mixed_size_mode
from nova_gpu.agent import privsep
from nova_gpu.agent import qemu_hook
from nova_gpu.agent import sysfs
from nova_gpu.agent import vf_types
from nova_gpu.tests.unit.agent import fakesys

PF = '0000:86:00.0'
TYPES = {1061: 'NVIDIA H100XM-10C', 1062: 'NVIDIA H100XM-20C'}
NS = qemu_hook.NOVA_NS


def domain_xml(addresses, profile='H100XM-10C', extra=''):
    specs = ('<nova:extraSpec name="gpu:profile">%s</nova:extraSpec>'
             % profile if profile else '')
    hostdevs = ''.join(
        "<hostdev mode='subsystem' type='pci' managed='yes'><source>"
        "<address domain='0x%s' bus='0x%s' slot='0x%s' function='0x%s'/>"
        "</source></hostdev>" % tuple(a.replace('.', ':').split(':'))
        for a in addresses)
    return (
        "<domain type='kvm'><name>instance-1</name><metadata>"
        "<nova:instance xmlns:nova='%s'><nova:flavor name='g1'>"
        "<nova:vcpus>4</nova:vcpus><nova:extraSpecs>%s%s"
        "</nova:extraSpecs></nova:flavor></nova:instance></metadata>"
        "<devices>%s</devices></domain>" % (NS, specs, extra, hostdevs))


class _VfCase(testtools.TestCase):
    """A fake sysfs with one H100 PF and ``VFS`` vendor-VFIO VFs."""

    VFS = 3

    def setUp(self):
        super().setUp()
        privsep.use_in_process()
        self.root = self.useFixture(fixtures.TempDir()).path
        self.fs = fakesys.FakeSysfs(self.root)
        self.fs.add_pci(PF, '0x2330')
        self.vfs = self.fs.add_vfs(PF, self.VFS, TYPES)


class QemuHookTest(_VfCase):

    def setUp(self):
        super().setUp()
        self.fs.add_pci('0000:3b:00.0', '0x1eb8')  # a PF, no vendor VFIO

    def current(self, vf):
        return sysfs.Sysfs(self.root).pci_function(vf).current_vgpu_type

    def run_hook(self, xml, op='prepare', subop='begin', state_dir=None):
        err = io.StringIO()
        rc = qemu_hook.main(['instance-1', op, subop, '-'],
                            stdin=io.StringIO(xml), stderr=err,
                            sysfs_root=self.root, state_dir=state_dir)
        return rc, err.getvalue()

    def test_types_recorded_for_the_restore_at_boot(self):
        state = self.useFixture(fixtures.TempDir()).path
        xml = domain_xml(self.vfs[:2])
        self.assertEqual(0, self.run_hook(xml, state_dir=state)[0])
        self.assertEqual({self.vfs[0]: 1061, self.vfs[1]: 1061},
                         vf_types.VfTypes(state).load())
        self.assertEqual(0, self.run_hook(xml, 'release', 'end',
                                          state_dir=state)[0])
        self.assertEqual({}, vf_types.VfTypes(state).load())
        # A record that cannot be written never fails the start.
        bad = os.path.join(state, 'not-a-dir')
        open(bad, 'w').close()
        rc, err = self.run_hook(xml, state_dir=bad)
        self.assertEqual(0, rc, err)
        self.assertIn('the record for the restore at boot failed', err)
        self.assertEqual([1061, 1061, 0],
                         [self.current(v) for v in self.vfs])

    def test_types_the_vfs_of_the_domain(self):
        rc, err = self.run_hook(domain_xml(self.vfs[:2]))
        self.assertEqual(0, rc, err)
        self.assertEqual([1061, 1061, 0], [self.current(v) for v in self.vfs])
        self.assertIn('VF %s set to vGPU type 1061' % self.vfs[0], err)
        # Again (a hard reboot): nothing to do, nothing refused.
        self.assertEqual(0, self.run_hook(domain_xml(self.vfs[:2]))[0])

    def test_another_type_is_never_set(self):
        self.fs.set_vgpu_type(self.vfs[0], 1062)
        rc, err = self.run_hook(domain_xml(self.vfs[:2]))
        self.assertEqual(1, rc)
        self.assertIn('VF %s has vGPU type H100XM-20C (1062), not '
                      'H100XM-10C: another type is never set' % self.vfs[0],
                      err)
        self.assertEqual([1062, 0, 0], [self.current(v) for v in self.vfs])

    def test_a_type_not_creatable_now_fails_the_start(self):
        rc, err = self.run_hook(domain_xml(self.vfs[:1],
                                           profile='H100XM-80C'))
        self.assertEqual(1, rc)
        self.assertIn('cannot take vGPU type H100XM-80C now (creatable: '
                      'H100XM-10C, H100XM-20C)', err)
        self.assertEqual(0, self.current(self.vfs[0]))

    def test_all_or_nothing(self):
        # The second write fails (the driver went away): the first VF's
        # new type is cleared again.
        real = privsep.set_vgpu_type_if_free

        def fails_on_second(root, address, type_id):
            if address == self.vfs[1]:
                raise OSError('No such device')
            return real(root, address, type_id)
        self.useFixture(fixtures.MockPatchObject(
            privsep, 'set_vgpu_type_if_free', fails_on_second))
        rc, err = self.run_hook(domain_xml(self.vfs[:2]))
        self.assertEqual(1, rc, err)
        self.assertIn('setting vGPU type H100XM-10C failed: No such device',
                      err)
        self.assertEqual([0, 0, 0], [self.current(v) for v in self.vfs])

    def test_left_alone(self):
        for xml, op in (
                (domain_xml(self.vfs[:1]), 'started'),
                (domain_xml(self.vfs[:1], profile=None), 'prepare'),
                (domain_xml(['0000:3b:00.0', '0000:99:00.0']), 'prepare'),
                ("<domain><devices/></domain>", 'prepare')):
            self.assertEqual((0, ''), self.run_hook(xml, op=op))
        self.assertEqual([0, 0, 0], [self.current(v) for v in self.vfs])

    def test_a_broken_configuration_stops_only_gpu_guests(self):
        def broken():
            raise ValueError('/etc/nova-gpu/nova-gpu.conf: no section')

        self.useFixture(fixtures.MonkeyPatch(
            'nova_gpu.agent.qemu_hook._configured', broken))
        for phase in (('prepare', 'begin'), ('release', 'end')):
            for xml in (domain_xml(self.vfs[:1], profile=None),
                        "<domain><devices/></domain>"):
                err = io.StringIO()
                self.assertEqual(0, qemu_hook.main(
                    ['instance-1', *phase, '-'], stdin=io.StringIO(xml),
                    stderr=err))
                self.assertEqual('', err.getvalue())
        err = io.StringIO()
        self.assertEqual(1, qemu_hook.main(
            ['instance-1', 'prepare', 'begin', '-'],
            stdin=io.StringIO(domain_xml(self.vfs[:1])), stderr=err))
        self.assertIn('no section', err.getvalue())
        self.assertEqual([0, 0, 0], [self.current(v) for v in self.vfs])

    def test_bad_input_is_named(self):
        rc, err = self.run_hook('<domain')
        self.assertEqual(1, rc)
        self.assertIn('domain XML cannot be read', err)
        rc, err = self.run_hook(domain_xml(['zzzz:00:00.0']))
        self.assertEqual(1, rc)
        self.assertIn('is not a PCI address', err)

    def test_mixed_size_gpu_takes_a_second_size(self):
        state = self.useFixture(fixtures.TempDir()).path
        self.fs.set_vgpu_type(self.vfs[2], 1061)  # another guest's VF
        xml = domain_xml(self.vfs[:1], 'H100XM-20C')
        # Equal-size mode (no record): refused, as above.
        self.assertEqual(1, self.run_hook(xml, state_dir=state)[0])
        # The agent recorded the GPU in mixed-size mode: the driver's
        # creatable list decides, as the scheduler's slots did.
        mixed_size_mode.write(state, [PF])
        rc, err = self.run_hook(xml, state_dir=state)
        self.assertEqual(0, rc, err)
        self.assertEqual([1062, 0, 1061], [self.current(v) for v in self.vfs])
        # An unreadable record: equal-size mode again, the safe side.
        with open(os.path.join(state, mixed_size_mode.STORE_NAME), 'w') as f:
            f.write('{')
        self.assertEqual(frozenset(), mixed_size_mode.read(state))

    def test_release_clears_the_domain_vfs(self):
        xml = domain_xml(self.vfs[:2])
        self.assertEqual(0, self.run_hook(xml)[0])
        self.fs.set_vgpu_type(self.vfs[2], 1061)  # another guest's VF
        rc, err = self.run_hook(xml, 'release', 'end')
        self.assertEqual(0, rc, err)
        self.assertEqual([0, 0, 1061], [self.current(v) for v in self.vfs])
        self.assertIn('VF %s vGPU type cleared' % self.vfs[1], err)
        # Equal-size mode: while the other guest holds H100XM-10C, the GPU
        # takes no other time-sliced type.
        xml = domain_xml(self.vfs[:1], 'H100XM-20C')
        rc, err = self.run_hook(xml)
        self.assertEqual(1, rc)
        self.assertIn('cannot take vGPU type H100XM-20C now (creatable: '
                      'H100XM-10C)', err)
        # Once that guest is gone too, the idle GPU takes another type.
        self.run_hook(domain_xml(self.vfs[2:]), 'release', 'end')
        rc, err = self.run_hook(xml)
        self.assertEqual(0, rc, err)
        self.assertEqual([1062, 0, 0], [self.current(v) for v in self.vfs])

    def calls_to(self, name):
        """The addresses privsep's ``name`` is called for, from now on."""
        calls = []
        real = getattr(privsep, name)

        def counted(root, address, *args):
            calls.append(address)
            return real(root, address, *args)
        self.useFixture(fixtures.MockPatchObject(privsep, name, counted))
        return calls

    def test_a_vf_listed_5000_times_is_one_action(self):
        # libvirt waits on the hook: each address is handled once.
        xml = domain_xml([self.vfs[0]] * 5000)
        sets = self.calls_to('set_vgpu_type_if_free')
        clears = self.calls_to('clear_vgpu_type')
        for phase, calls, said in ((('prepare', 'begin'), sets,
                                    'set to vGPU type 1061'),
                                   (('release', 'end'), clears,
                                    'vGPU type cleared')):
            start = time.monotonic()
            rc, err = self.run_hook(xml, *phase)
            elapsed = time.monotonic() - start
            self.assertEqual(0, rc, err)
            self.assertLess(elapsed, 1.0, phase)
            self.assertEqual([self.vfs[0]], calls, phase)
            self.assertEqual(['nova-gpu-qemu-hook: domain instance-1: VF %s '
                              '%s' % (self.vfs[0], said)], err.splitlines())
        self.assertEqual([0, 0, 0], [self.current(v) for v in self.vfs])

    def test_more_hostdevs_than_a_guest_can_have(self):
        others = ['0000:%02x:%02x.0' % (1 + i // 32, i % 32)
                  for i in range(qemu_hook.MAX_HOSTDEVS)]
        xml = domain_xml(self.vfs[:1] + others)
        rc, err = self.run_hook(xml)
        self.assertEqual(1, rc)
        self.assertIn('the domain has more than %d PCI hostdevs'
                      % qemu_hook.MAX_HOSTDEVS, err)
        self.assertEqual([0, 0, 0], [self.current(v) for v in self.vfs])
        # A release refuses nothing: the guest is gone, its VFs are freed.
        self.fs.set_vgpu_type(self.vfs[0], 1061)
        rc, err = self.run_hook(xml, 'release', 'end')
        self.assertEqual(0, rc, err)
        self.assertEqual([0, 0, 0], [self.current(v) for v in self.vfs])

    def test_release_skips_what_is_not_a_pci_address(self):
        self.assertEqual(0, self.run_hook(domain_xml(self.vfs[:1]))[0])
        rc, err = self.run_hook(domain_xml(['zzzz:00:00.0'] + self.vfs[:1]),
                                'release', 'end')
        self.assertEqual(0, rc, err)
        self.assertEqual([0, 0, 0], [self.current(v) for v in self.vfs])

    def test_a_domain_name_is_logged_escaped(self):
        # A newline would forge a line of libvirt's log, an escape
        # sequence rewrite the operator's terminal.
        name = ('instance-1\nnova-gpu-qemu-hook: domain x: VF 0000:86:00.7 '
                'vGPU type cleared\x1b[2K')
        err = io.StringIO()
        rc = qemu_hook.main([name, 'prepare', 'begin', '-'],
                            stdin=io.StringIO(domain_xml(self.vfs[:1])),
                            stderr=err, sysfs_root=self.root)
        self.assertEqual(0, rc, err.getvalue())
        escaped = ('instance-1\\nnova-gpu-qemu-hook: domain x: VF '
                   '0000:86:00.7 vGPU type cleared\\x1b[2K')
        self.assertEqual(['nova-gpu-qemu-hook: domain %s: VF %s set to vGPU '
                          'type 1061' % (escaped, self.vfs[0])],
                         err.getvalue().splitlines())
        # A refusal names the domain the same way.
        err = io.StringIO()
        rc = qemu_hook.main([name, 'prepare', 'begin', '-'],
                            stdin=io.StringIO(domain_xml(self.vfs[:1],
                                                         'H100XM-20C')),
                            stderr=err, sysfs_root=self.root)
        self.assertEqual(1, rc)
        self.assertEqual(1, len(err.getvalue().splitlines()))
        self.assertTrue(err.getvalue().startswith(
            'nova-gpu-qemu-hook: domain %s: VF %s has vGPU type'
            % (escaped, self.vfs[0])), err.getvalue())

    def memory_xml(self, addresses, memory):
        return domain_xml(addresses, profile=None, extra=(
            '<nova:extraSpec name="gpu:memory">%s</nova:extraSpec>'
            % memory))

    def test_memory_flavor_gets_the_smallest_type_settable_now(self):
        # gpu:memory: the scheduler's order of the types meeting the need
        # (MIG-backed ones first, which these VFs cannot take now).
        rc, err = self.run_hook(self.memory_xml(self.vfs[:1], '10GB'))
        self.assertEqual(0, rc, err)
        self.assertEqual(1061, self.current(self.vfs[0]))
        self.run_hook(self.memory_xml(self.vfs[:1], '10GB'), 'release',
                      'end')
        rc, err = self.run_hook(self.memory_xml(self.vfs[:1], '12GB'))
        self.assertEqual(0, rc, err)
        self.assertEqual(1062, self.current(self.vfs[0]))
        # The GPU holds H100XM-20C now: a 10GB guest gets that type too
        # (equal-size mode), as the agent reported the GPU to the
        # scheduler.
        rc, err = self.run_hook(self.memory_xml(self.vfs[1:2], '10GB'))
        self.assertEqual(0, rc, err)
        self.assertEqual([1062, 1062, 0],
                         [self.current(v) for v in self.vfs])
        # A reboot of the first guest keeps its type.
        rc, err = self.run_hook(self.memory_xml(self.vfs[:1], '12GB'))
        self.assertEqual((0, ''), (rc, err))

    def test_memory_flavor_no_type_meets_the_need(self):
        rc, err = self.run_hook(self.memory_xml(self.vfs[:1], '90GB'))
        self.assertEqual(1, rc)
        self.assertIn('VF %s: ' % self.vfs[0], err)
        self.assertIn('gpu:memory', err)
        self.assertEqual(0, self.current(self.vfs[0]))
        rc, err = self.run_hook(self.memory_xml(self.vfs[:1], 'lots'))
        self.assertEqual(1, rc)
        self.assertIn('gpu:memory', err)

    def test_release_leaves_domains_without_a_gpu_type(self):
        self.fs.set_vgpu_type(self.vfs[0], 1061)
        rc, err = self.run_hook(domain_xml(self.vfs[:1], profile=None),
                                'release', 'end')
        self.assertEqual((0, ''), (rc, err))
        self.assertEqual(1061, self.current(self.vfs[0]))

    def test_other_phases_do_nothing(self):
        self.fs.set_vgpu_type(self.vfs[0], 1061)
        for op, subop in (('stopped', 'end'), ('start', 'begin'),
                          ('release', 'begin'), ('prepare', 'end')):
            rc, err = self.run_hook(domain_xml(self.vfs[:2]), op, subop)
            self.assertEqual((0, ''), (rc, err))
        self.assertEqual([1061, 0, 0], [self.current(v) for v in self.vfs])


class CompareAndSetTest(_VfCase):

    VFS = 1

    def setUp(self):
        super().setUp()
        self.vf = self.vfs[0]

    def test_set_once_refuse_another(self):
        self.assertTrue(privsep.set_vgpu_type_if_free(self.root, self.vf,
                                                      1061))
        self.assertFalse(privsep.set_vgpu_type_if_free(self.root, self.vf,
                                                       1061))
        self.assertRaises(PermissionError, privsep.set_vgpu_type_if_free,
                          self.root, self.vf, 1062)
        self.assertRaises(ValueError, privsep.set_vgpu_type_if_free,
                          self.root, self.vf, 0)
        self.assertRaises(FileNotFoundError, privsep.set_vgpu_type_if_free,
                          self.root, PF, 1061)


class OnDemandOrphansTest(testtools.TestCase):
    """Where the hook types VFs, a typed VF no domain references is an
    orphan whatever ``orphan_kinds`` says (a start cut short left it).
    """

    def test_vf_type_orphans_with_the_hook(self):
        from nova_gpu.agent import agent

        def opts(kinds, on_demand):
            return types.SimpleNamespace(orphan_kinds=kinds,
                                         vf_types_on_demand=on_demand)
        self.assertEqual(['mdev'], agent.orphan_kinds(opts(['mdev'], False)))
        self.assertEqual(['mdev', 'vf_type'],
                         agent.orphan_kinds(opts(['mdev'], True)))
        self.assertEqual(['vf_type'],
                         agent.orphan_kinds(opts(['vf_type'], True)))
