"""The compute agent assembled from its configuration.

One object wires sysfs, NVML, libvirt, discovery, device management and
reconcile from ``[gpu_agent]`` options; the service, the helper CLI and the
benchmark all use it.
"""

import os
import socket
import time
import uuid

from oslo_log import log as logging

from nova_gpu.agent import carver as carver_mod
from nova_gpu.agent import devices
from nova_gpu.agent import discovery
from nova_gpu.agent import errors
from nova_gpu.agent import fabric as fabric_mod
from nova_gpu.agent import health as health_mod
from nova_gpu.agent import host_metrics as exporter_mod
from nova_gpu.agent import journal as journal_mod
from nova_gpu.agent import libvirt_host
from nova_gpu.agent import mixed_size_mode
from nova_gpu.agent import nvml as nvml_mod
from nova_gpu.agent import placement
from nova_gpu.agent import planning
from nova_gpu.agent import provider_config
from nova_gpu.agent import reconcile
from nova_gpu.agent import restore as restore_mod
from nova_gpu.agent import sriov as sriov_mod
from nova_gpu.agent import sysfs as sysfs_mod
from nova_gpu.agent import vf_types as vf_types_mod
from nova_gpu.core import catalog as catalog_mod
from nova_gpu.core import idle as idle_mod
from nova_gpu.core import report as report_mod

LOG = logging.getLogger(__name__)


def orphan_kinds(opts):
    """``[gpu_agent] orphan_kinds``, plus VF types where the qemu hook
    types VFs (``vf_types_on_demand``): there a typed VF no domain
    references was left by a start cut short, and it counts as a vGPU in
    use until it is cleared.
    """
    kinds = list(opts.orphan_kinds)
    if opts.vf_types_on_demand and reconcile.ORPHAN_VF_TYPE not in kinds:
        kinds.append(reconcile.ORPHAN_VF_TYPE)
    return kinds


class Agent:
    def __init__(self, conf, nvml_lib=None):
        opts = conf.gpu_agent
        self.conf = conf
        self.host = opts.host or socket.gethostname()
        self.nodename = opts.nodename or self.host
        self.sysfs = sysfs_mod.Sysfs(opts.sysfs_root)
        self.nvml = nvml_mod.Nvml(lib=nvml_lib) if opts.use_nvml else None
        try:
            self.libvirt = libvirt_host.LibvirtHost(
                opts.libvirt_uri, retries=opts.libvirt_retries,
                settle_timeout=opts.device_timeout)
        except errors.Unavailable as e:
            LOG.warning('libvirt not used: %s', e)
            self.libvirt = None
        self.catalog = catalog_mod.load_catalog(conf.gpu.catalog_files)
        # [gpu_agent] nvswitch_mode = shared: Fabric Manager, and the
        # partitions the qemu hook activated for guests.
        self.fabric = fabric_mod.from_conf(conf)
        self.partitions = fabric_mod.keeper_from_conf(conf, self.fabric)
        self.journal = journal_mod.Journal.in_dir(opts.state_dir)
        # What a reboot loses, recorded for the restore at boot: the VFs
        # each PF had, and the vGPU type of each VF (the qemu hook
        # records the ones it sets).
        self.sriov = sriov_mod.SriovStore(opts.state_dir)
        self.vf_types = vf_types_mod.VfTypes(opts.state_dir)
        self.manager = devices.DeviceManager(
            self.sysfs, self.libvirt, self.nvml, timeout=opts.device_timeout,
            journal=self.journal, vf_types=self.vf_types)
        # What the layout planner carved, made again after a reboot, and
        # kept by the reconciler though no guest uses it yet.
        layouts = carver_mod.LayoutStore(opts.state_dir)
        self.carver = carver_mod.Carver(
            self.manager, layouts,
            mig_modes=carver_mod.MigModeStore(opts.state_dir),
            switch_mig_mode=opts.carve_switch_mig_mode)
        self.reconciler = reconcile.Reconciler(
            self.manager, remove_orphans=opts.remove_orphans,
            grace_period=opts.orphan_grace_period, layouts=layouts.load,
            orphan_kinds=orphan_kinds(opts))
        self._generation = 0
        # PFs in mixed-size vGPU mode last recorded (None: not yet).
        self._mixed_size = None
        self.boot_id = uuid.uuid4().hex
        self._placement = None
        self._warned_heads = False
        # GPU health from NVML, persisted (agent.health); the quarantines
        # the report carries.
        self.health_store = health_mod.HealthStore(opts.state_dir)
        self.health = (health_mod.HealthWatch(self.nvml, self.health_store)
                       if self.nvml is not None else None)
        # Idle guest devices ([gpu_agent] idle_threshold, idle_after): a
        # window of NVML utilisation per device (core.idle).
        self.idle = (idle_mod.Tracker(
            threshold=opts.idle_threshold, idle_after=opts.idle_after,
            max_gap=max(300, 2 * opts.reconcile_interval))
            if opts.idle_threshold > 0 else None)
        # NVML GPM samples of the GPU instances (MIG), one per instance
        # from the last pass: their activity is measured between two.
        self.gpm_samples = {}
        # Carve to demand ([gpu_agent] carve_enabled): the demand the
        # service's listener feeds, and the loop that plans with it.
        self.demand = None
        self.planning = None
        if opts.carve_enabled:
            self.demand = planning.source_from_conf(conf)
            self.planning = planning.PlanningLoop.from_conf(
                conf, self, self.demand)

    def close(self):
        if self.libvirt is not None:
            self.libvirt.close()
        if self.nvml is not None:
            self.nvml.close()

    def discover(self):
        return discovery.Discovery(
            self.sysfs, self.nvml, self.catalog, host=self.host,
            nodename=self.nodename, libvirt=self.libvirt,
            resource_classes=self.conf.gpu_agent.pci_resource_classes,
            vf_types_on_demand=self.conf.gpu_agent.vf_types_on_demand,
            fabric=self.fabric,
            pcie_tree=self.conf.gpu_agent.report_pcie_tree,
        ).discover()

    def _note_mixed_size(self, inventory):
        """Record the GPUs in mixed-size vGPU mode for the qemu hook
        (``mixed_size_mode``) when they changed.
        """
        found = frozenset(g.address for g in inventory.host.gpus
                          if g.mixed_size)
        state_dir = self.conf.gpu_agent.state_dir
        if found == self._mixed_size or not state_dir:
            return
        if self._mixed_size is None and not found and not os.path.exists(
                os.path.join(state_dir, mixed_size_mode.STORE_NAME)):
            self._mixed_size = found  # nothing to record, nothing stale
            return
        try:
            mixed_size_mode.write(state_dir, found)
            self._mixed_size = found
        except OSError as e:
            LOG.warning('cannot record the GPUs in mixed-size mode: %s', e)

    def next_generation(self):
        # Milliseconds since the epoch: increases across agent restarts.
        self._generation = max(self._generation + 1,
                               int(time.time() * 1000))
        return self._generation

    def restore_layouts(self):
        """Make MIG modes, GPU layouts and VF types again (at start, after
        a reboot; ``nova_gpu.agent.restore``); VFs only in
        ``nova-gpu-restore``, before nova-compute starts.

        What a killed operation (a killed restore too) left is rolled
        back first, so that the reconcile after the restore does not undo
        what the restore makes.
        """
        try:
            self.reconciler.roll_back()
        except errors.AgentError as e:
            LOG.warning('rolling back cut-short operations before the '
                        'restore failed (%s); the reconcile retries', e)
        return restore_mod.restore(self.carver, self.catalog,
                                   sriov=self.sriov, vf_types=self.vf_types)

    def reconcile(self):
        if self.libvirt is None:
            return None
        return self.reconciler.run()

    def cycle(self, publisher=None):
        """Reconcile, discover, write the provider config, publish.

        Returns what happened and how long each step took.
        """
        timings = {}
        start = time.perf_counter()
        try:
            result = self.reconcile()
        except errors.AgentError as e:
            # libvirtd restarting, say: report what is there all the same,
            # and reconcile again next cycle
            LOG.warning('reconcile failed (%s); reporting without it', e)
            result = None
        timings['reconcile_s'] = time.perf_counter() - start
        partitions = fabric_mod.keep(
            self.partitions, self.libvirt,
            self.conf.gpu_agent.orphan_grace_period)
        try:
            # the VFs each PF has now, for the restore after a reboot
            self.sriov.observe(self.sysfs)
        except OSError as e:
            LOG.warning('cannot record the SR-IOV VFs: %s', e)
        start = time.perf_counter()
        inventory = self.discover()
        timings['discover_s'] = time.perf_counter() - start
        self._note_mixed_size(inventory)
        carved = None
        if self.planning is not None and self.planning.due():
            start = time.perf_counter()
            try:
                carved = self.planning.run(inventory)
            except Exception:  # the report goes out all the same
                LOG.exception('carve to demand failed; planning again '
                              'next time')
            timings['carve_s'] = time.perf_counter() - start
            if carved and carved['changed']:
                inventory = self.discover()  # report the new layouts
        report = inventory.report(generation=self.next_generation())
        # A restarted agent's lower generation is accepted at once.
        report['boot_id'] = self.boot_id
        self._add_health(report)
        self._add_layouts(report)
        self._add_idle(report)
        if self.conf.gpu_agent.placement_cloud:
            try:
                if self._placement is None:
                    self._placement = placement.PlacementClient(
                        placement.connect(self.conf.gpu_agent.placement_cloud))
                self._placement.annotate(report)
            except Exception as e:  # Placement is optional for the agent
                LOG.warning('cannot read Placement: %s', e)
        elif not self._warned_heads and any(
                p.get('kind') == report_mod.VF_MDEV
                for g in report['gpus'] for p in g.get('providers') or ()):
            self._warned_heads = True
            LOG.warning('[gpu_agent] placement_cloud is unset: multi-GPU '
                        'flavors find no candidate on the GPUs whose VFs '
                        'are providers (the agent keeps their set traits '
                        'in Placement)')
        path = self.conf.gpu_agent.provider_config_file
        changed = False
        if path:
            try:
                changed = provider_config.write(
                    inventory, path,
                    quota=self.conf.gpu_agent.quota_inventory)
            except OSError as e:
                LOG.error('cannot write provider config %s: %s', path, e)
            if changed:
                LOG.warning('GPU topology traits or quota inventory '
                            'changed in %s: restart nova-compute so that '
                            'it reads them', path)
        pending = publisher.publish(report) if publisher else None
        return {'reconcile': result.as_dict() if result else None,
                'report': report, 'provider_config_changed': changed,
                'unsent_reports': pending, 'timings': timings,
                'carve': carved, 'partitions': partitions,
                # GPUs NVML cannot read now, left out of the report.
                'unreadable_gpus': inventory.unreadable,
                'left_out_gpus': [g['address'] for g in inventory.left_out]}

    def _add_health(self, report):
        """Each GPU's health (``health``: quarantined, reason, faults).

        The saved quarantines go out even when NVML cannot be read this
        cycle: a quarantine is lifted by evidence or an operator, never
        by a failed read.
        """
        try:
            healths = (self.health.cycle() if self.health is not None
                       else self.health_store.load())
        except Exception:
            LOG.exception('GPU health not read this cycle')
            try:
                healths = self.health_store.load()
            except Exception:
                LOG.exception('GPU quarantines cannot be read: reporting '
                              'no GPU of this host as available')
                healths = None
        for gpu in report.get('gpus', ()):
            if healths is None:
                gpu['health'] = {'quarantined': True, 'faults': [],
                                 'reason': 'the agent cannot read its '
                                           'quarantine records'}
                continue
            health = healths.get(gpu.get('address'))
            if health is not None and health.faults:
                gpu['health'] = health.to_dict()

    def _add_idle(self, report, now=None):
        """Mark the idle guest devices of ``report`` (``idle``).

        An additive field (``core.idle.annotate``): since when, the
        observed peak, a smaller profile it fits. Never raises: the
        report goes out without it.
        """
        if self.idle is None:
            return
        try:
            idle_mod.annotate(report,
                              exporter_mod.utilisation_samples(
                                  self.nvml, self.gpm_samples),
                              self.idle, self.catalog,
                              time.time() if now is None else now)
        except Exception:
            LOG.exception('idle GPU devices not judged this cycle')

    def keep_heads(self):
        """A quick pass between cycles: move the set traits of SR-IOV +
        mdev GPUs off the VFs guests took since (``[gpu_agent]
        heads_interval``), from the last cycle's providers: one Placement
        request per host when nothing moved. Never raises.
        """
        if self._placement is None or self._placement.last is None:
            return 0
        try:
            return self._placement.keep_heads(*self._placement.last)
        except Exception as e:  # the next cycle reads everything again
            LOG.warning('cannot move the GPU set traits: %s', e)
            return 0

    def _add_layouts(self, report):
        """Add each carved GPU's layout to ``report`` (``layout``).

        An additive field: the schedulers' views and operators can read it.
        """
        if self.planning is None:
            return
        try:
            layouts = self.carver.store.load()
        except Exception as e:  # the report goes out without them
            LOG.warning('cannot read the carved layouts: %s', e)
            return
        for gpu in report.get('gpus', ()):
            layout = layouts.get(gpu.get('address'))
            if layout is not None:
                gpu['layout'] = carver_mod.layout_to_dict(layout)
