"""Carve to demand on this host: the agent's planning loop.

Every ``[gpu_agent] carve_interval`` seconds (inside the agent's cycle,
after reconcile and discovery) the core layout planner
(``nova_gpu.core.layout.LayoutPlanner``) chooses a layout for each idle GPU of
the host from the demand the schedulers measure, and the carver
(``nova_gpu.agent.carver``) makes the changed ones. The demand:

* published by the schedulers (``gpu.demand.updated`` on ``[gpu_agent]
  demand_topic``, the contract in ``core.notification``), received by a
  notification listener in a pool named after this host, so that every
  agent gets every publication; the newest one is kept, on disk too
  (``nova_gpu.atomic_file``: a power cut leaves the old or the new one),
  so an agent restart does not forget it;
* else, or when the newest is older than ``carve_demand_max_age``, the
  static ``carve_static_demand`` of the configuration.

What counts as in use (the planner never changes such a GPU): an mdev, a
typed VF a libvirt domain references, a MIG GPU instance with a vGPU on
it, the GPU itself in a domain (passthrough). When the agent cannot tell
(libvirt or NVML cannot say) it plans nothing. The carver checks a MIG
GPU's instances once more just before it changes them.

Which layouts a GPU may get: those of its MIG mode, or, with ``[gpu_agent]
carve_switch_mig_mode``, every kind on an idle MIG-capable GPU (the
carver switches the mode). A GPU whose MIG mode switch is pending a GPU
reset gets nothing, and its decision says so. No layout adds or removes
SR-IOV VFs: nova-compute takes the host's PCI devices only when it starts
(Nova 34 ``ResourceTracker._setup_pci_tracker``), so the carver types,
clears and carves on the VFs that are there (``nova_gpu.agent.carver``).
"""

import json
import os
import threading
import time

from oslo_log import log as logging
import oslo_messaging as messaging

from nova_gpu.agent import errors
from nova_gpu import atomic_file
from nova_gpu.core import exceptions
from nova_gpu.core import fragmentation
from nova_gpu.core import host as host_mod
from nova_gpu.core import layout as layout_mod
from nova_gpu.core import notification
from nova_gpu.core import request as request_mod
from nova_gpu import listening

LOG = logging.getLogger(__name__)
DEMAND_FILE = 'demand.json'
POOL_PREFIX = 'nova-gpu-agent-'


# -- the demand -------------------------------------------------------------

def parse_static_demand(items):
    """``[gpu_agent] carve_static_demand`` as a ``fragmentation.Demand``.

    Items: ``vgpu:TYPE=W``, ``mig:PROFILE=W``, ``whole:COUNT=W``; None
    when there are none. Raises InvalidRequest naming the bad item.
    """
    found = []
    for item in items or ():
        text = item.strip()
        try:
            what, _eq, weight = text.rpartition('=')
            kind, _colon, detail = what.partition(':')
            kind, detail = kind.strip(), detail.strip()
            weight = float(weight)
            if not what or weight < 0 or weight != weight:
                raise ValueError('a weight >= 0 after "=" is needed')
            if kind == host_mod.WHOLE:
                req = request_mod.GpuRequest(host_mod.WHOLE,
                                             count=int(detail or 1))
            elif kind in (host_mod.VGPU, host_mod.MIG) and detail:
                req = request_mod.GpuRequest(kind, profile=detail)
            else:
                raise ValueError('expected vgpu:TYPE, mig:PROFILE or '
                                 'whole:COUNT before "="')
        except (ValueError, exceptions.InvalidRequest) as e:
            raise exceptions.InvalidRequest(
                '[gpu_agent] carve_static_demand item %r: %s'
                % (item, e)) from None
        found.append(fragmentation.DemandItem(req, weight))
    return fragmentation.Demand(found) if found else None


class DemandSource:
    """The demand to carve to: the newest published one, else static.

    Thread-safe: the listener's thread updates it, the agent's cycle
    reads it.
    """

    def __init__(self, static=None, max_age=0, state_dir=None,
                 use_published=True, clock=time.time):
        self.static = static
        self.max_age = max_age
        self.use_published = use_published
        self.clock = clock
        self.path = (os.path.join(state_dir, DEMAND_FILE)
                     if state_dir else None)
        self._lock = threading.Lock()
        self._published = None   # (DemandPayload, received at)
        self._load()

    def update(self, payload, received=None):
        """Keep ``payload`` (a DemandPayload) as the newest demand.

        An older window of the same scheduler (messages handled out of
        order by the listener's threads) is ignored; False then.
        """
        received = self.clock() if received is None else received
        with self._lock:
            held = self._published[0] if self._published else None
            if held is not None and held.publisher == payload.publisher \
                    and held.version > payload.version:
                return False
            self._published = (payload, received)
            self._save(payload, received)
        return True

    def current(self):
        """``(Demand or None, where it comes from)``."""
        with self._lock:
            published = self._published
        if self.use_published and published is not None:
            payload, received = published
            age = self.clock() - received
            if not self.max_age or age <= self.max_age:
                return payload.demand(), (
                    'scheduler %s (window version %d, %d requests, '
                    'received %.0f s ago)' % (
                        payload.publisher or '?', payload.version,
                        payload.requests, max(age, 0)))
            why = 'the published demand is %.0f s old' % age
        elif self.use_published:
            why = 'no demand published yet'
        else:
            why = 'configured'
        if self.static is not None:
            return self.static, 'static (%s)' % why
        return None, why

    def _load(self):
        if not self.path:
            return
        try:
            with open(self.path, encoding='utf-8') as f:
                doc = json.load(f)
            payload = notification.DemandPayload.from_primitive(
                doc['payload'])
            self._published = (payload, float(doc['received']))
        except FileNotFoundError:
            pass
        except (OSError, ValueError, KeyError, TypeError,
                notification.PayloadError) as e:
            LOG.warning('saved demand %s cannot be read (%s): ignored',
                        self.path, e)

    def _save(self, payload, received):
        if not self.path:
            return
        try:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            atomic_file.write_json(self.path, {
                'received': received, 'payload': payload.to_primitive()})
        except OSError as e:  # the demand in memory still counts
            LOG.warning('cannot save the demand to %s: %s', self.path, e)


class DemandEndpoint:
    """oslo.messaging endpoint: the schedulers' demand into a source."""

    filter_rule = listening.event_filter([notification.DEMAND_EVENT])

    def __init__(self, source):
        self.source = source

    def info(self, ctxt, publisher_id, event_type, payload, metadata):
        # A bad publication must neither escape into oslo.messaging nor
        # replace the demand held.
        try:
            if self.source.update(notification.parse(event_type, payload)):
                LOG.debug('demand from %s received', publisher_id)
        except Exception as e:
            LOG.warning('dropping the demand published by %s: %s',
                        publisher_id, e)
        return messaging.NotificationResult.HANDLED


class DemandListener:
    """The notification listener of the demand topic (start/stop once)."""

    def __init__(self, conf, source, host, transport=None):
        self.conf = conf
        self.source = source
        self.host = host
        opts = conf.gpu_agent
        # One pool per host: every agent gets every publication.
        self._listener = listening.Listener(
            conf, [(opts.demand_topic, opts.report_exchange)],
            [DemandEndpoint(source)], pool=POOL_PREFIX + host, drain=True,
            transport=transport, log=LOG)

    def start(self):
        self._listener.start()
        LOG.info('listening for the GPU demand on topic %s',
                 self.conf.gpu_agent.demand_topic)
        return self

    def stop(self):
        self._listener.stop()


def source_from_conf(conf):
    """The ``DemandSource`` ``[gpu_agent]`` asks for."""
    opts = conf.gpu_agent
    return DemandSource(
        static=parse_static_demand(opts.carve_static_demand),
        max_age=opts.carve_demand_max_age, state_dir=opts.state_dir or None,
        use_published=opts.carve_demand_source == 'scheduler')


# -- the loop -----------------------------------------------------------------

class PlanningLoop:
    """Plans the host's idle GPUs and has the carver make the changes."""

    def __init__(self, carver, source, host, interval=0,
                 hysteresis=layout_mod.DEFAULT_HYSTERESIS,
                 min_hold=layout_mod.DEFAULT_MIN_HOLD,
                 max_changes=layout_mod.DEFAULT_MAX_CHANGES,
                 libvirt=None, clock=time.monotonic):
        self.carver = carver
        self.source = source
        self.host = host
        self.interval = interval
        self.libvirt = libvirt
        self.clock = clock
        self.planner = layout_mod.LayoutPlanner(hysteresis, min_hold,
                                                max_changes)
        self.last = None
        self._no_kinds = {}  # GPU index -> why it takes no layout

    @classmethod
    def from_conf(cls, conf, agent, source):
        opts = conf.gpu_agent
        return cls(agent.carver, source, agent.host,
                   interval=opts.carve_interval,
                   hysteresis=opts.carve_hysteresis,
                   min_hold=opts.carve_min_hold,
                   max_changes=opts.carve_max_changes,
                   libvirt=agent.libvirt)

    def due(self):
        return self.last is None or \
            self.clock() - self.last >= self.interval

    def run(self, inventory):
        """Plan and carve once; a summary dict (logged, for metrics).

        ``changed``: GPU indices carved; ``failed``: ``{index: error}``;
        ``decisions``: ``{index: reason}``; ``skipped``: why nothing was
        planned, or None.
        """
        self.last = self.clock()
        result = {'changed': [], 'failed': {}, 'decisions': {},
                  'skipped': None, 'demand': None}
        demand, origin = self.source.current()
        result['demand'] = origin
        nvml = self.carver.manager.nvml
        if demand is None:
            result['skipped'] = 'no demand (%s)' % origin
        elif nvml is None or not nvml.available:
            result['skipped'] = 'carving needs NVML'
        else:
            try:
                attached = self._attached()
                host, layouts, kinds = self.planning_view(inventory,
                                                          attached)
            except errors.AgentError as e:
                result['skipped'] = str(e)
        if result['skipped']:
            LOG.info('carve to demand: nothing planned: %s',
                     result['skipped'])
            return result
        models = list({g.model.name: g.model for g in host.gpus}.values())
        classes, ignored = layout_mod.classes_from_demand(demand, models)
        if ignored:
            LOG.debug('carve to demand: no layout serves %s',
                      ', '.join(ignored))
        decisions = self.planner.plan(host, layouts, classes, self.clock(),
                                      kinds=kinds)
        for d in decisions:
            if not kinds[d.gpu]:
                result['decisions'][d.gpu] = 'not carved: %s' % (
                    self._no_kinds.get(d.gpu) or 'NVML does not see this '
                    'GPU')
                continue
            result['decisions'][d.gpu] = d.reason
            if not d.changed or d.layout is None:
                LOG.debug('GPU %d: %s', d.gpu, d.reason)
                continue
            gpu = host.gpus[d.gpu]
            try:
                # The carver reaches the GPU by NVML's index.
                self.carver.apply(inventory.gpus[d.gpu].nvml.index,
                                  gpu.model, d.layout)
            except (errors.AgentError, exceptions.InvalidRequest,
                    OSError) as e:
                # InUse included: a guest started since discovery. The
                # planner counts the hold from now: no retry every cycle.
                result['failed'][d.gpu] = str(e)
                LOG.warning('GPU %d: carving %s failed: %s', d.gpu,
                            d.layout.describe(), e)
                continue
            result['changed'].append(d.gpu)
            LOG.info('GPU %d: %s [demand: %s]', d.gpu, d.reason, origin)
        return result

    def _attached(self):
        """PCI addresses libvirt domains use; raises when it cannot say."""
        if self.libvirt is None:
            raise errors.Unavailable('libvirt cannot say which GPUs '
                                     'guests use')
        try:
            return set(self.libvirt.domain_refs())
        except Exception as e:
            raise errors.Unavailable('libvirt cannot list the domains: %s'
                                     % e) from e

    def planning_view(self, inventory, attached):
        """``(Host, {index: Layout}, {index: kinds})`` for the planner.

        Each GPU is an empty one set up for its current layout holding
        only what is in use; a GPU whose use does not fit that picture
        (or NVML cannot tell) is busy (``_busy``).
        """
        nvml = self.carver.manager.nvml
        stored = self.carver.store.load()
        switch = getattr(self.carver, 'switch_mig_mode', False)
        gpus, layouts, kinds = [], {}, {}
        self._no_kinds = {}
        for record, seen in zip(inventory.gpus, inventory.host.gpus):
            mig_mode = bool(record.nvml and record.nvml.mig_enabled
                            and record.model.mig_capable)
            layout = stored.get(record.address)
            if layout is None and mig_mode and record.mig_slots:
                layout = layout_mod.Layout(
                    layout_mod.MIG, instances=tuple(record.mig_slots))
            if layout is not None and (layout.kind == layout_mod.MIG) \
                    != mig_mode:
                # Made in another mode (changed by hand): not ours now.
                layout = None
            layouts[seen.index] = layout
            gpu = self._in_use(record, seen, layout, attached, nvml,
                               mig_mode)
            # The carver reaches a GPU through NVML: a GPU only sysfs
            # shows takes no layout. It switches MIG mode only where
            # allowed, and only on an idle GPU.
            pending = record.nvml.mig_pending if record.nvml else None
            if record.nvml is None:
                kinds[seen.index] = set()
            elif pending is not None:
                kinds[seen.index] = set()
                self._no_kinds[seen.index] = (
                    'MIG mode %s is pending a GPU reset (nvidia-smi -i %s '
                    '-r) or a reboot' % ('enable' if pending else
                                         'disable', record.address))
                LOG.warning('GPU %d: %s', seen.index,
                            self._no_kinds[seen.index])
            elif switch and record.model.mig_capable and gpu.is_free:
                kinds[seen.index] = {layout_mod.MIG, layout_mod.TIME_SLICED,
                                     layout_mod.PASSTHROUGH}
            elif mig_mode:
                kinds[seen.index] = {layout_mod.MIG}
            else:
                kinds[seen.index] = {layout_mod.TIME_SLICED,
                                     layout_mod.PASSTHROUGH}
            gpus.append(gpu)
        host = host_mod.Host(inventory.host.name, gpus)
        return host, layouts, kinds

    @staticmethod
    def _in_use(record, seen, layout, attached, nvml, mig_mode):
        slots = [host_mod.Slot(seen.index, host_mod.VGPU, name)
                 for _uuid, name in record.mdevs]
        slots += [host_mod.Slot(seen.index, host_mod.VGPU, name)
                  for name in record.vf_vgpus.values()]
        if record.address in attached:
            return _busy(seen)  # passed through whole
        if mig_mode and record.mig_slots:
            # NVML's index, which the report's (``seen.index``) is not
            # once a GPU NVML cannot read is left out before this one.
            used = nvml.mig_in_use(record.nvml.index)
            if used is None:
                return _busy(seen)  # NVML cannot tell: all in use
            types = {start: vgpu for _gi, start, vgpu in
                     (layout.instances if layout else ())}
            for inst in nvml.mig_instances_of(record.nvml.index):
                if inst.gi_id in used:
                    name = next((gi for gi, start, _v in record.mig_slots
                                 if start == inst.start), None)
                    if name is None:
                        return _busy(seen)
                    slots.append(host_mod.Slot(
                        seen.index, host_mod.MIG,
                        (name, inst.start, types.get(inst.start))))
        gpu = layout_mod.gpu_for_layout(seen, layout)
        for slot in slots:
            try:
                gpu.take(slot)
            except (exceptions.GpuError, exceptions.InvalidRequest,
                    KeyError):
                return _busy(seen)
        return gpu


def _busy(seen):
    """A GPU the planner sees in use.

    The discovered GPU, or, when nothing is counted on it, a copy passed
    through whole.
    """
    if not seen.is_free:
        return seen
    gpu = layout_mod.gpu_for_layout(seen, None)
    gpu.take(host_mod.Slot(seen.index, host_mod.WHOLE, None))
    return gpu
