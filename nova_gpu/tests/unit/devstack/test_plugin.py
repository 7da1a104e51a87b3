"""The devstack plugin, run phase by phase against scratch config files.

devstack itself is not available to the tests; ``devstack_shim.sh``
provides the functions the plugin calls (the ini editing with devstack's
semantics, the rest recorded). The resulting nova.conf is read back with
oslo.config's own parser, as nova-scheduler would read it.
"""

import ast
import json
import os
import shutil
import subprocess
import sys
import textwrap

import fixtures
from oslo_config import cfg
import testtools

from nova_gpu.scheduler import gpu_spec
from nova_gpu import tests

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = tests.REPO_ROOT
PLUGIN = os.path.join(ROOT, 'devstack', 'plugin.sh')
SETTINGS = os.path.join(ROOT, 'devstack', 'settings')
SHIM = os.path.join(HERE, 'devstack_shim.sh')
ETC_NOVA = os.path.join(ROOT, 'etc', 'nova')

# What devstack's lib/nova leaves in nova.conf before plugins run.
DEVSTACK_NOVA_CONF = textwrap.dedent("""\
    [DEFAULT]
    transport_url = rabbit://stackrabbit:secret@127.0.0.1:5672/

    [filter_scheduler]
    enabled_filters = ComputeFilter,ComputeCapabilitiesFilter,\
ImagePropertiesFilter,ServerGroupAntiAffinityFilter,\
ServerGroupAffinityFilter,SameHostFilter,DifferentHostFilter

    [scheduler]
    workers = 2
    """)

OUR_WEIGHERS = ['nova_gpu.scheduler.weighers.GpuFragmentationWeigher',
                'nova_gpu.scheduler.weighers.GpuTopologyWeigher']


def parse_ini(path):
    """{section: {option: [values]}} exactly as oslo.config reads it."""
    sections = {}
    cfg.ConfigParser(path, sections).parse()
    return sections


# Every [pci] alias of etc/nova/nova-gpu-pci.conf: the two of one device,
# one per device of multi-GPU flavors (core.gpu_sets: sets of 2 to 8, for
# whole GPUs and vGPUs) and the RDMA NIC VF's.
PCI_ALIASES = 2 + 2 * sum(range(2, 9)) + 1


class DevstackPluginTest(testtools.TestCase):

    def setUp(self):
        super().setUp()
        self.tmp = self.useFixture(fixtures.TempDir()).path
        self.nova_conf = os.path.join(self.tmp, 'nova.conf')
        self.agent_conf = os.path.join(self.tmp, 'nova-gpu',
                                       'nova-gpu.conf')
        self.log = os.path.join(self.tmp, 'calls.log')
        with open(self.nova_conf, 'w') as f:
            f.write(DEVSTACK_NOVA_CONF)
        self.placement_conf = os.path.join(self.tmp, 'placement.conf')
        with open(self.placement_conf, 'w') as f:
            f.write('[placement_database]\nconnection = sqlite://\n')

    def run_phases(self, *phases, env=None, check=True):
        lines = ['set -o errexit -o pipefail',
                 'source %s' % SHIM,
                 'source %s' % SETTINGS]
        lines += ['source %s %s' % (PLUGIN, phase) for phase in phases]
        environ = {
            'PATH': os.environ['PATH'],
            'HOME': self.tmp,
            'DEST': '/opt/stack',
            'NOVA_GPU_DIR': ROOT,
            'NOVA_GPU_PYTHON': sys.executable,
            'DATA_DIR': os.path.join(self.tmp, 'data'),
            'NOVA_CONF': self.nova_conf,
            'PLACEMENT_CONF': self.placement_conf,
            'NOVA_CONF_DIR': os.path.join(self.tmp, 'etc-nova'),
            'NOVA_GPU_CONF_DIR': os.path.dirname(self.agent_conf),
            'STACK_USER': 'stack',
            'ENABLED_SERVICES': 'key,n-api,n-cond,n-sch,n-cpu,placement-api',
            'SHIM_LOG': self.log,
            # No agent runs here: its provider config is not waited for.
            'NOVA_GPU_AGENT_READY_TIMEOUT': '0',
        }
        environ.update(env or {})
        proc = subprocess.run(['bash', '-c', '\n'.join(lines)], env=environ,
                              capture_output=True, text=True, timeout=60)
        if check:
            self.assertEqual(0, proc.returncode,
                             'plugin failed:\n%s%s' % (proc.stdout,
                                                       proc.stderr))
        return proc

    def calls(self):
        if not os.path.exists(self.log):
            return []
        with open(self.log) as f:
            return f.read().splitlines()

    # -- post-config ----------------------------------------------------

    def test_post_config_appends_scheduler_classes(self):
        self.run_phases('stack post-config')
        conf = parse_ini(self.nova_conf)
        sched = conf['filter_scheduler']
        # Nova's own filters stay available; ours is added to them.
        self.assertEqual(
            ['nova.scheduler.filters.all_filters',
             'nova_gpu.scheduler.filters.GpuFilter',
             'nova_gpu.scheduler.candidate_cut.GpuCandidateCutFilter'],
            sched['available_filters'])
        # devstack's own filters stay; the file's are added, the cut before
        # Nova's PCI filters, GpuFilter last.
        self.assertEqual(
            'ComputeFilter,ComputeCapabilitiesFilter,ImagePropertiesFilter,'
            'ServerGroupAntiAffinityFilter,ServerGroupAffinityFilter,'
            'SameHostFilter,DifferentHostFilter,GpuCandidateCutFilter,'
            'NUMATopologyFilter,PciPassthroughFilter,GpuFilter',
            sched['enabled_filters'][0])
        # Whole GPUs and vendor-VFIO vGPUs: PCI in Placement, by alias.
        self.assertEqual(['True'], sched['pci_in_placement'])
        aliases = [json.loads(a) for a in conf['pci']['alias']]
        by_name = {a['name']: a['resource_class'] for a in aliases}
        self.assertEqual('CUSTOM_NVIDIA_VGPU', by_name['nvidia-vgpu'])
        self.assertEqual('CUSTOM_NVIDIA_GPU', by_name['nvidia-gpu'])
        # and one alias per device of multi-GPU flavors (core.gpu_sets)
        self.assertEqual('CUSTOM_NVIDIA_GPU', by_name['nvidia-gpu-set8-7'])
        self.assertEqual(PCI_ALIASES, len(by_name))
        self.assertEqual(
            ['nova.scheduler.weights.all_weighers'] + OUR_WEIGHERS,
            sched['weight_classes'][0].split(','))
        self.assertEqual(
            ['gpu:profile=A100-10C', 'gpu:mig=3g.20gb',
             'gpu:profile=L40S-8C', 'gpu:kind=whole;gpu:count=2'],
            conf['gpu_scheduler']['typical_requests'])
        self.assertEqual(['10.0'], conf['gpu_scheduler'][
            'fragmentation_weight_multiplier'])
        self.assertEqual(['10.0'], conf['gpu_scheduler'][
            'topology_weight_multiplier'])
        # Nova's default: the file does not set it.
        self.assertNotIn('candidate_order', conf['gpu_scheduler'])
        self.assertEqual(['True'], conf['gpu_scheduler']['report_listener'])
        placement = parse_ini(self.placement_conf)['placement']
        self.assertEqual(['1000'], placement['max_allocation_candidates'])
        self.assertEqual(['breadth-first'], placement[
            'allocation_candidates_generation_strategy'])
        # What the plugin does not own is left alone.
        self.assertEqual(['rabbit://stackrabbit:secret@127.0.0.1:5672/'],
                         conf['DEFAULT']['transport_url'])
        self.assertEqual(['2'], conf['scheduler']['workers'])

    def test_post_config_without_filter_section_keeps_nova_defaults(self):
        with open(self.nova_conf, 'w') as f:
            f.write('[DEFAULT]\ndebug = True\n')
        self.run_phases('stack post-config')
        sched = parse_ini(self.nova_conf)['filter_scheduler']
        # The file's list: Nova 34.0.0's defaults, then what the GPU paths
        # need, GpuFilter last.
        self.assertEqual(
            'ComputeFilter,ComputeCapabilitiesFilter,ImagePropertiesFilter,'
            'ServerGroupAntiAffinityFilter,ServerGroupAffinityFilter,'
            'GpuCandidateCutFilter,NUMATopologyFilter,PciPassthroughFilter,'
            'GpuFilter',
            sched['enabled_filters'][0])

    def test_nova_conf_holds_every_setting_of_the_files(self):
        self.run_phases('stack post-config')
        conf = parse_ini(self.nova_conf)
        for name in ('nova-api.conf', 'nova-conductor.conf',
                     'nova-scheduler.conf', 'nova-gpu-pci.conf'):
            for group, options in parse_ini(
                    os.path.join(ETC_NOVA, name)).items():
                for option, values in options.items():
                    have = conf[group][option]
                    if option in ('enabled_filters', 'weight_classes'):
                        have = have[0].split(',')
                        values = values[0].split(',')
                    for value in values:
                        self.assertIn(value, have, (name, group, option))

    def test_cell_conductors_get_their_files(self):
        etc = os.path.join(self.tmp, 'etc-nova')
        os.makedirs(etc)
        cell = os.path.join(etc, 'nova_cell1.conf')
        with open(cell, 'w') as f:
            f.write('[DEFAULT]\ntransport_url = rabbit://x/\n')
        self.run_phases('stack post-config')
        conf = parse_ini(cell)
        # The cell conductor builds the request groups of moves.
        self.assertEqual(['True'],
                         conf['filter_scheduler']['pci_in_placement'])
        self.assertEqual(PCI_ALIASES, len(conf['pci']['alias']))
        self.assertNotIn('available_filters', conf['filter_scheduler'])

    def test_large_cloud_replaces_the_weighers(self):
        self.run_phases('stack post-config', env={
            'NOVA_GPU_LARGE_CLOUD': 'True'})
        conf = parse_ini(self.nova_conf)
        self.assertEqual(['nova.scheduler.weights.all_weighers',
                          'nova_gpu.scheduler.weighers.GpuWeigher'],
                         conf['filter_scheduler']['weight_classes'][0]
                         .split(','))
        self.assertNotIn('candidate_order', conf.get('gpu_scheduler', {}))

    def test_post_config_twice_changes_nothing_more(self):
        self.run_phases('stack post-config')
        with open(self.nova_conf) as f:
            once = f.read()
        self.run_phases('stack post-config')
        with open(self.nova_conf) as f:
            self.assertEqual(once, f.read())

    def test_scheduler_can_be_left_alone(self):
        self.run_phases('stack post-config',
                        env={'NOVA_GPU_ENABLE_SCHEDULER': 'False'})
        conf = parse_ini(self.nova_conf)
        self.assertNotIn('available_filters', conf['filter_scheduler'])
        self.assertNotIn('GpuFilter',
                         conf['filter_scheduler']['enabled_filters'][0])
        self.assertNotIn('gpu_scheduler', conf)

    def test_post_config_writes_agent_and_compute_config(self):
        spec = ('{"address":"0000:41:00.0",'
                '"resource_class":"CUSTOM_NVIDIA_GPU"}')
        self.run_phases('stack post-config',
                        env={'NOVA_GPU_MDEV_TYPES': 'nvidia-592,nvidia-593',
                             'NOVA_GPU_PCI_DEVICE_SPECS': spec})
        provider_dir = os.path.join(self.tmp, 'etc-nova', 'provider_config')
        conf = parse_ini(self.nova_conf)
        self.assertEqual([provider_dir + '/'],
                         conf['compute']['provider_config_location'])
        self.assertEqual(['nvidia-592,nvidia-593'],
                         conf['devices']['enabled_mdev_types'])
        self.assertEqual([spec], conf['pci']['device_spec'])
        self.assertEqual(['True'], conf['pci']['report_in_placement'])
        agent = parse_ini(self.agent_conf)['gpu_agent']
        self.assertEqual([os.path.join(provider_dir, 'nova-gpu.yaml')],
                         agent['provider_config_file'])
        self.assertEqual(
            ['sudo /opt/stack/data/venv/bin/privsep-helper --config-file %s '
             '--config-file %s' % (self.nova_conf, self.agent_conf)],
            parse_ini(self.agent_conf)['nova_gpu_privsep']['helper_command'])
        outbox = os.path.join(self.tmp, 'data', 'nova-gpu', 'outbox')
        self.assertEqual([outbox], agent['outbox_dir'])
        self.assertTrue(os.path.isdir(outbox))
        self.assertTrue(os.path.isdir(provider_dir))

    def test_agent_disabled_writes_no_agent_config(self):
        self.run_phases('stack post-config', env={
            'ENABLED_SERVICES': 'n-api,n-sch'})
        # settings enables the agent; a controller disables it again in
        # local.conf, which devstack reads after the plugin's settings.
        proc = subprocess.run(
            ['bash', '-c', 'source %s; ENABLED_SERVICES=n-sch; '
             'source %s; disable_service nova-gpu-agent; '
             'NOVA_CONF=%s SHIM_LOG=%s; source %s stack post-config'
             % (SHIM, SETTINGS, self.nova_conf, self.log, PLUGIN)],
            env={'PATH': os.environ['PATH'], 'DEST': '/opt/stack',
                 'NOVA_GPU_DIR': ROOT, 'NOVA_GPU_PYTHON': sys.executable,
                 'NOVA_GPU_CONF_DIR': os.path.join(self.tmp, 'ctl')},
            capture_output=True, text=True, timeout=60)
        self.assertEqual(0, proc.returncode, proc.stderr)
        self.assertFalse(os.path.exists(os.path.join(self.tmp, 'ctl')))

    # -- install, extra, unstack ------------------------------------------

    def test_install_puts_package_into_nova_environment(self):
        self.run_phases('stack install',
                        env={'NOVA_GPU_DIR': '/opt/stack/nova-gpu'})
        calls = self.calls()
        self.assertIn('setup_develop /opt/stack/nova-gpu compute', calls)
        self.assertIn('install_package mdevctl', calls)

    def test_extra_starts_agent_and_creates_flavors(self):
        self.run_phases('stack post-config', 'stack extra', env={
            'SHIM_EXISTING_FLAVORS': 'gpu.l40s.8c',
            'SHIM_BIN_DIR': '/opt/stack/data/venv/bin'})
        calls = self.calls()
        self.assertIn(
            'run_process nova-gpu-agent /opt/stack/data/venv/bin/'
            'nova-gpu-agent --config-file %s --config-file %s'
            % (self.nova_conf, self.agent_conf), calls)
        creates = [c for c in calls if ' flavor create ' in c]
        self.assertEqual(3, len(creates), creates)
        self.assertIn(
            'openstack --os-cloud devstack-admin flavor create --vcpus 8 '
            '--ram 32768 --disk 40 --property gpu:profile=A100-10C '
            '--property resources:VGPU=1 gpu.a100.10c', creates)
        # An existing flavor is kept as it is.
        self.assertFalse([c for c in creates if c.endswith(' gpu.l40s.8c')])

    def test_extra_runs_the_scheduler_as_nova_gpu_scheduler(self):
        self.run_phases('stack post-config', 'stack extra', env={
            'SHIM_BIN_DIR': '/opt/stack/data/venv/bin'})
        calls = self.calls()
        restart = ['stop_process n-sch',
                   'run_process n-sch /opt/stack/data/venv/bin/'
                   'nova-gpu-scheduler --config-file %s' % self.nova_conf]
        self.assertEqual(restart, [c for c in calls if ' n-sch' in c])

    def test_scheduler_left_to_devstack_without_the_plugin_scheduler(self):
        self.run_phases('stack extra', env={
            'NOVA_GPU_ENABLE_SCHEDULER': 'False'})
        self.assertEqual([], [c for c in self.calls() if ' n-sch' in c])

    def test_bad_flavor_entry_fails_naming_it(self):
        proc = self.run_phases('stack extra', check=False, env={
            'NOVA_GPU_FLAVORS': 'ok|1|512|1|gpu:count=1 broken|4|4096'})
        self.assertNotEqual(0, proc.returncode)
        self.assertIn("entry 'broken|4|4096' needs at least", proc.stderr)

    def test_unstack_stops_agent(self):
        self.run_phases('unstack')
        self.assertIn('stop_process nova-gpu-agent', self.calls())

    def test_cloud_services_start_where_enabled(self):
        # What tools/devstack-check.sh enables: the exporter before the
        # defrag that reads it, each on nova.conf and the agent's file.
        services = ['nova-gpu-exporter', 'nova-gpu-reclaimer',
                    'nova-gpu-defrag']
        env = {'ENABLED_SERVICES': 'key,n-api,n-cond,n-sch,n-cpu,'
                                   'placement-api,' + ','.join(services),
               'SHIM_BIN_DIR': '/opt/stack/data/venv/bin'}
        self.run_phases('stack post-config', 'stack extra', 'unstack',
                        env=env)
        calls = self.calls()
        starts = [c for c in calls if c.startswith('run_process nova-gpu-')
                  and 'nova-gpu-agent' not in c]
        self.assertEqual(
            ['run_process %s /opt/stack/data/venv/bin/%s --config-file %s '
             '--config-file %s' % (s, s, self.nova_conf, self.agent_conf)
             for s in services], starts)
        for service in services:
            self.assertIn('stop_process %s' % service, calls)

    def test_cloud_services_not_started_unless_enabled(self):
        self.run_phases('stack post-config', 'stack extra')
        self.assertFalse([c for c in self.calls()
                          if 'run_process nova-gpu-exporter' in c])

    def test_reclaimer_action_and_grace_period_where_set(self):
        env = {'ENABLED_SERVICES': 'n-api,n-sch,nova-gpu-reclaimer'}
        self.run_phases('stack post-config', env=env)
        reclaimer = parse_ini(self.agent_conf)['gpu_reclaimer']
        # Unset: the defaults stay (nothing written).
        self.assertNotIn('action', reclaimer)
        self.assertNotIn('grace_period', reclaimer)
        env.update(NOVA_GPU_RECLAIM_ACTION='delete',
                   NOVA_GPU_RECLAIM_GRACE_PERIOD='0')
        self.run_phases('stack post-config', env=env)
        reclaimer = parse_ini(self.agent_conf)['gpu_reclaimer']
        self.assertEqual(['delete'], reclaimer['action'])
        self.assertEqual(['0'], reclaimer['grace_period'])

    # -- the settings agree with the code ---------------------------------

    def settings_value(self, name):
        proc = subprocess.run(
            ['bash', '-c', 'source %s; source %s; printf %%s "$%s"'
             % (SHIM, SETTINGS, name)],
            env={'PATH': os.environ['PATH'], 'DEST': '/opt/stack'},
            capture_output=True, text=True, timeout=60)
        self.assertEqual(0, proc.returncode, proc.stderr)
        return proc.stdout

    def test_example_flavors_parse_and_ask_placement_consistently(self):
        entries = self.settings_value('NOVA_GPU_FLAVORS').split()
        self.assertGreaterEqual(len(entries), 3)
        for entry in entries:
            name, vcpus, ram, _disk, *specs = entry.split('|')
            extra = dict(s.split('=', 1) for s in specs)
            spec = gpu_spec.parse(extra, vcpus=int(vcpus),
                                  memory_mb=int(ram))
            self.assertIsNotNone(spec, name)
            self.assertIsNone(spec.problem, name)

    def test_typical_requests_parse(self):
        for item in self.settings_value('NOVA_GPU_TYPICAL_REQUESTS').split():
            extra = dict(s.split('=', 1) for s in item.split(';'))
            self.assertIsNotNone(gpu_spec.parse(extra), item)

    def test_configured_classes_exist(self):
        names = set()
        for path in os.listdir(ETC_NOVA):
            conf = parse_ini(os.path.join(ETC_NOVA, path))
            sched = conf.get('filter_scheduler', {})
            for value in (sched.get('available_filters', [])
                          + sched.get('weight_classes', [])):
                names.update(n for n in value.split(',')
                             if n.startswith('nova_gpu.'))
        self.assertGreaterEqual(len(names), 5)
        for path in sorted(names):
            module, cls = path.rsplit('.', 1)
            source = os.path.join(ROOT, *module.split('.')) + '.py'
            self.assertTrue(os.path.exists(source), source)
            with open(source) as f:
                tree = ast.parse(f.read())
            classes = {n.name for n in tree.body
                       if isinstance(n, ast.ClassDef)}
            self.assertIn(cls, classes, 'no class %s in %s' % (cls, source))

    # -- fake-hardware mode -----------------------------------------------

    def fake_launcher(self):
        """A stand-in for Nova's environment's python3 running
        nova_gpu.tests.harness.fake_compute (Nova is not in the unit
        tests' environment; its functional test runs the real one): it
        prints a path file and agent options of the shape the launcher
        writes. Returns the directory to use as SHIM_BIN_DIR.
        """
        bin_dir = os.path.join(self.tmp, 'venv-bin')
        os.makedirs(bin_dir)
        stub = os.path.join(bin_dir, 'python3')
        with open(stub, 'w') as f:
            f.write(textwrap.dedent("""\
                #!/bin/bash
                # -m nova_gpu.tests.harness.fake_compute COMMAND PATH HOST
                [[ "$2" == nova_gpu.tests.harness.fake_compute ]] || exit 2
                case "$3 $4" in
                "path-conf pf-mdev")
                    printf '[devices]\\nenabled_mdev_types = nvidia-764\\n'
                    printf '[mdev_nvidia-764]\\n'
                    printf 'device_addresses = 0000:10:00.0,0000:11:00.0\\n' ;;
                "path-conf vendor-vfio")
                    printf '[pci]\\nreport_in_placement = True\\n'
                    for f in 4 5; do
                        printf 'device_spec = {"address": '
                        printf '"0000:10:00.%s", ' "$f"
                        printf '"resource_class": "CUSTOM_NVIDIA_VGPU", '
                        printf '"managed": "no"}\\n'
                    done ;;
                "agent-options "*)
                    printf 'host\\t%s\\nnodename\\t%s\\n' "$5" "$5"
                    [[ $4 == vendor-vfio ]] && printf '%s\\t%s\\n' \\
                        pci_resource_classes 0000:10:00.0:CUSTOM_NVIDIA_VGPU
                    ;;
                *) exit 2 ;;
                esac
                exit 0
                """))
        os.chmod(stub, 0o755)
        return bin_dir

    def fake_env(self, **more):
        env = {'NOVA_GPU_FAKE_HARDWARE': 'True',
               'NOVA_GPU_FAKE_PATHS': 'pf-mdev vendor-vfio',
               'NOVA_GPU_FAKE_HOST_PREFIX': 'ds',
               'SHIM_BIN_DIR': self.fake_launcher()}
        env.update(more)
        return env

    def test_fake_hardware_writes_each_hosts_files(self):
        self.run_phases('stack post-config', 'stack extra',
                        env=self.fake_env())
        conf_dir = os.path.dirname(self.agent_conf)
        fake_dir = os.path.join(self.tmp, 'data', 'nova-gpu', 'fake')
        pf = parse_ini(os.path.join(conf_dir,
                                    'nova-compute-fake-pf-mdev.conf'))
        # nova.conf (nova-cpu.conf) as it is, devstack's bus included...
        self.assertEqual(['rabbit://stackrabbit:secret@127.0.0.1:5672/'],
                         pf['DEFAULT']['transport_url'])
        # ...with the path file written for this host, its own name and
        # state.
        self.assertEqual(['ds-pf-mdev'], pf['DEFAULT']['host'])
        self.assertEqual(['nvidia-764'], pf['devices']['enabled_mdev_types'])
        self.assertEqual(['0000:10:00.0,0000:11:00.0'],
                         pf['mdev_nvidia-764']['device_addresses'])
        self.assertEqual([os.path.join(fake_dir, 'pf-mdev', 'nova')],
                         pf['DEFAULT']['state_path'])
        self.assertEqual(
            [os.path.join(fake_dir, 'pf-mdev', 'provider_config') + '/'],
            pf['compute']['provider_config_location'])
        vfio = parse_ini(os.path.join(conf_dir,
                                      'nova-compute-fake-vendor-vfio.conf'))
        # Multi-valued JSON entries, one line each (not split at blanks).
        self.assertEqual(
            [json.dumps({'address': '0000:10:00.%d' % f,
                         'resource_class': 'CUSTOM_NVIDIA_VGPU',
                         'managed': 'no'}) for f in (4, 5)],
            vfio['pci']['device_spec'])
        self.assertNotIn('devices', vfio)
        agent = parse_ini(os.path.join(
            conf_dir, 'nova-gpu-fake-vendor-vfio.conf'))['gpu_agent']
        self.assertEqual(['ds-vendor-vfio'], agent['host'])
        self.assertEqual([os.path.join(fake_dir, 'vendor-vfio', 'sys')],
                         agent['sysfs_root'])
        self.assertEqual(['0000:10:00.0:CUSTOM_NVIDIA_VGPU'],
                         agent['pci_resource_classes'])
        self.assertEqual(['False'], agent['use_nvml'])
        self.assertEqual(
            [os.path.join(fake_dir, 'vendor-vfio', 'provider_config',
                          'nova-gpu.yaml')], agent['provider_config_file'])
        # The real host's agent file is left as it was.
        self.assertNotIn('sysfs_root', parse_ini(self.agent_conf)['gpu_agent'])

    def test_fake_computes_restarted_for_their_agents_files(self):
        # nova-compute reads provider configs only when it starts: each
        # fake host's nova-compute is restarted once its agent wrote one
        # naming providers (set traits, quota inventory), after every
        # fake host registered.
        env = self.fake_env()
        fake_dir = os.path.join(self.tmp, 'data', 'nova-gpu', 'fake')
        for path, text in (('pf-mdev', 'providers:\n- identification:\n'
                                       '    name: ds-pf-mdev\n'),):
            os.makedirs(os.path.join(fake_dir, path, 'provider_config'))
            with open(os.path.join(fake_dir, path, 'provider_config',
                                   'nova-gpu.yaml'), 'w') as f:
                f.write(text)
        self.run_phases('stack post-config', 'stack extra', env=env)
        calls = self.calls()
        restarts = [i for i, c in enumerate(calls)
                    if c.startswith('sudo systemctl restart devstack@n-gpu')]
        self.assertEqual(
            ['sudo systemctl restart devstack@n-gpu-fake-pf-mdev.service'],
            [calls[i] for i in restarts])
        waits = [i for i, c in enumerate(calls)
                 if 'compute service list --host ds-' in c]
        self.assertLess(max(waits), min(restarts))
        # No file from vendor-vfio's agent within the timeout: said, not
        # fatal.
        self.assertEqual(1, len([c for c in calls if c.startswith(
            'warn nova-gpu: no provider config') and 'vendor-vfio' in c]),
            calls)

    def test_fake_hardware_starts_units_then_waits_for_them(self):
        env = self.fake_env()
        bin_dir = env['SHIM_BIN_DIR']
        self.run_phases('stack post-config', 'stack extra', env=env)
        calls = self.calls()
        conf_dir = os.path.dirname(self.agent_conf)
        sysfs = os.path.join(self.tmp, 'data', 'nova-gpu', 'fake',
                             'pf-mdev', 'sys')
        compute_conf = os.path.join(conf_dir,
                                    'nova-compute-fake-pf-mdev.conf')
        self.assertIn(
            'run_process n-gpu-fake-pf-mdev %s/python3 -m '
            'nova_gpu.tests.harness.fake_compute run pf-mdev --sysfs %s '
            '--dir %s -- --config-file %s' % (
                bin_dir, sysfs, os.path.dirname(sysfs), compute_conf), calls)
        self.assertIn(
            'run_process nova-gpu-agent-fake-pf-mdev %s/python3 -m '
            'nova_gpu.tests.harness.fake_compute agent pf-mdev ds-pf-mdev '
            '--state %s -- --config-file %s --config-file %s' % (
                bin_dir, os.path.join(os.path.dirname(sysfs), 'agent-state'),
                compute_conf,
                os.path.join(conf_dir, 'nova-gpu-fake-pf-mdev.conf')), calls)
        waits = [i for i, c in enumerate(calls)
                 if 'compute service list --host ds-' in c]
        self.assertEqual(2, len(waits), calls)
        starts = [i for i, c in enumerate(calls)
                  if c.startswith('run_process n-gpu-fake-')]
        self.assertLess(max(starts), min(waits))

    def test_fake_hardware_units_are_enabled_and_stopped(self):
        proc = subprocess.run(
            ['bash', '-c', 'source %s; source %s; echo "$ENABLED_SERVICES"'
             % (SHIM, SETTINGS)],
            env={'PATH': os.environ['PATH'], 'DEST': '/opt/stack',
                 'NOVA_GPU_FAKE_HARDWARE': 'True',
                 'NOVA_GPU_FAKE_PATHS': 'whole-gpu'},
            capture_output=True, text=True, timeout=60)
        self.assertEqual(0, proc.returncode, proc.stderr)
        enabled = proc.stdout.strip().split(',')
        self.assertIn('n-gpu-fake-whole-gpu', enabled)
        self.assertIn('nova-gpu-agent-fake-whole-gpu', enabled)
        self.run_phases('unstack', env=self.fake_env())
        calls = self.calls()
        for unit in ('n-gpu-fake-pf-mdev', 'nova-gpu-agent-fake-pf-mdev',
                     'n-gpu-fake-vendor-vfio',
                     'nova-gpu-agent-fake-vendor-vfio'):
            self.assertIn('stop_process %s' % unit, calls)

    def test_fake_hardware_installs_what_nova_tests_import(self):
        self.run_phases('stack install', env=self.fake_env())
        self.assertIn('pip_install fixtures testtools oslotest '
                      'wsgi-intercept python-neutronclient', self.calls())

    def test_no_fake_hardware_by_default(self):
        self.run_phases('stack install', 'stack post-config', 'stack extra',
                        'unstack')
        self.assertEqual([], [c for c in self.calls() if 'fake' in c])


class ShellcheckTest(testtools.TestCase):

    def test_plugin_is_shellcheck_clean(self):
        shellcheck = shutil.which('shellcheck')
        if shellcheck is None:
            self.fail('shellcheck is not installed; it is listed in '
                      'bindep.txt (apt-get install shellcheck)')
        proc = subprocess.run(
            [shellcheck, '--shell=bash', '--severity=style', PLUGIN,
             SETTINGS, SHIM], capture_output=True, text=True, timeout=120)
        self.assertEqual(0, proc.returncode, proc.stdout + proc.stderr)
