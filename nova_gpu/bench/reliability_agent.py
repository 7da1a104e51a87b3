"""Reliability of the compute agent: SIGKILLs, broker and libvirtd restarts.

Part ``agent`` of ``nova_gpu.bench.reliability``. Runs on the functional
tests' fake GPU host (``nova_gpu/tests/functional/agent/fakehost.py``: a real
libvirtd and mdevctl on a fake sysfs tree; NVML faked at the pynvml
boundary with its MIG state in a file, as the driver keeps it across
processes). Needs root, libvirtd, mdevctl, gcc and rabbitmq-server.

*Kills*: a worker process runs the agent's device manager (journal,
libvirt, privsep, NVML) creating and removing mdevs, VF vGPU types and MIG
instances at random, and tries to remove the devices in use too. It is
SIGKILLed after a random delay, then a fresh agent (new journal reader,
connections and reconciler, as after a restart) runs one reconcile with
a one-hour orphan grace period, so only the journal can clean up. Then:

* *leaked*: a device that exists, is not in use and that the agent never
  declared complete (the worker appends to a ledger just before the
  journal marks a create done);
* *half-made*: an mdev not both active and persistent in libvirt and
  sysfs, a MIG GPU instance without compute instance;
* *in use touched*: two mdevs and a VF referenced by a defined domain and
  a MIG instance with a vGPU on it, compared with their state at start.

*Restarts*: ``nova-gpu-agent`` runs as a service (1 s cycles) publishing to
a private RabbitMQ node (``nova_gpu/tests/functional/agent/rabbit.py``; the
shared
broker is not disturbed) while a listener counts the reports; the broker
is stopped for a few seconds, then libvirtd. Every report generation the
agent logged as published must arrive; the agent must keep cycling
without a restart.
"""

import json
import logging
import os
import random
import signal
import sys
import threading
import time
import uuid as uuid_mod

from nova_gpu.bench.reliability import Figure

PART = 'agent'
PARENT = '0000:3b:00.0'
MDEV_TYPE = 'nvidia-222'
PF = '0000:86:00.0'
VGPU_TYPE = 1061
NVML_GPU = '00000000:07:00.0'
MIG_PROFILE = '1g.5gb'
CAP = {'mdev': 6, 'vf': 3, 'mig': 3}


def build_host(fs):
    """One T4 (mdev parent) and one H100-like PF with four VFs."""
    from nova_gpu.tests.functional.agent import fakehost
    fakehost.t4_host(fs, gpus=1)
    fs.add_pci(PF, '0x2330', numa_node=1)
    fs.add_vfs(PF, 4, {VGPU_TYPE: 'NVIDIA H100XM-10C'})


def fake_nvml(state_file):
    from nova_gpu.tests.unit.agent import fakenvml
    gpu = fakenvml.FakeGpu(NVML_GPU, 'NVIDIA A100-SXM4-40GB', 40960,
                           mig=True)
    return fakenvml.FakePynvml([gpu], state_file=state_file)


class Rig:
    """The objects of one agent process over the shared host state."""

    def __init__(self, uri, root, state_dir, nvml_state):
        from nova_gpu.agent import devices
        from nova_gpu.agent import journal
        from nova_gpu.agent import libvirt_host
        from nova_gpu.agent import nvml
        from nova_gpu.agent import privsep
        from nova_gpu.agent import sysfs
        privsep.use_in_process()
        self.lib = fake_nvml(nvml_state)
        self.nvml = nvml.Nvml(lib=self.lib)
        self.lv = libvirt_host.LibvirtHost(uri, retries=3, retry_delay=0.2)
        self.journal = journal.Journal.in_dir(state_dir)
        self.manager = devices.DeviceManager(
            sysfs.Sysfs(root), self.lv, self.nvml, timeout=10,
            journal=self.journal)

    def reconciler(self, grace=3600):
        from nova_gpu.agent import reconcile
        return reconcile.Reconciler(self.manager, grace_period=grace)

    def close(self):
        self.lv.close()

    def profile(self):
        from nova_gpu.core import catalog
        return catalog.load_catalog().model('A100-40GB').mig_profile(
            MIG_PROFILE)

    def state(self):
        """Every device: {kind: {name: detail}}."""
        m = self.manager
        known = self.lv.mdevs()
        active = m.sysfs.mdevs()
        mdevs = {}
        for uuid in set(known) | set(active):
            info = known.get(uuid) or {}
            mdevs[uuid] = (uuid in active, bool(info.get('active')),
                           bool(info.get('persistent')))
        vfs = {a: fn.current_vgpu_type
               for a, fn in m.sysfs.nvidia_gpus().items()
               if fn.physfn and fn.current_vgpu_type}
        migs = {}
        gpu = self.lib.gpus[0]
        self.lib._sync()
        for gi_id, gi in gpu.gis.items():
            migs[str(gi_id)] = (gi['start'], gi['cis'])
        return {'mdev': mdevs, 'vf': vfs, 'mig': migs}


# -- the worker that gets killed -------------------------------------------

def _ledger(path, kind, name, state):
    with open(path, 'a') as f:
        f.write(json.dumps([kind, str(name), state]) + '\n')
        f.flush()
        os.fsync(f.fileno())


def _ack_on_done(rig, ledger):
    """Acknowledge a create in the ledger just before the journal marks it
    done: a device present after reconcile that was never acknowledged
    was lost track of (a kill between the two leaves the intent, so the
    device is rolled back and simply absent).
    """
    done = rig.journal.done
    names = {'mdev_create': 'uuid', 'vf_create': 'vf', 'mig_create': 'gi_id'}

    def ack_then_done(key):
        intent = rig.journal.intents().get(key)
        if intent and intent['op'] in names and \
                names[intent['op']] in intent['args']:
            kind = intent['op'].split('_')[0]
            _ledger(ledger, kind, intent['args'][names[intent['op']]],
                    'have')
        done(key)
    rig.journal.done = ack_then_done


def _work(rig, ledger, seed):
    from nova_gpu.agent import errors
    rng = random.Random(seed)
    profile = rig.profile()
    _ack_on_done(rig, ledger)
    while True:
        state = rig.state()
        kind = rng.choice(('mdev', 'vf', 'mig'))
        create = len(state[kind]) < CAP[kind] and rng.random() < 0.6
        try:
            if kind == 'mdev' and create:
                uuid = str(uuid_mod.UUID(int=rng.getrandbits(128)))
                rig.manager.create_mdev(PARENT, MDEV_TYPE, uuid=uuid)
            elif kind == 'mdev' and state['mdev']:
                uuid = rng.choice(sorted(state['mdev']))
                rig.manager.remove_mdev(uuid)
                _ledger(ledger, kind, uuid, 'gone')
            elif kind == 'vf' and create:
                rig.manager.create_vf_vgpu(PF, VGPU_TYPE)
            elif kind == 'vf' and state['vf']:
                addr = rng.choice(sorted(state['vf']))
                rig.manager.remove_vf_vgpu(addr)
                _ledger(ledger, kind, addr, 'gone')
            elif kind == 'mig' and create:
                used = {s for s, _ in state['mig'].values()}
                free = [s for s in profile.starts if s not in used
                        and s >= 4]
                if free:
                    start = rng.choice(free)
                    rig.manager.create_mig(0, profile, start)
            elif kind == 'mig' and state['mig']:
                gi = int(rng.choice(sorted(state['mig'])))
                rig.manager.remove_mig(0, gi)
                _ledger(ledger, kind, gi, 'gone')
        except errors.InUse:
            pass  # the devices in use: refused, as they must be


def own_logging_locks():
    """Give every logging handler of this (forked) process a lock of its
    own.

    Under eventlet, oslo.log replaces handler locks with a ``PipeMutex``
    whose token travels through a pipe, and a fork shares that pipe: a
    worker SIGKILLed while it logs takes the token with it, and the
    parent's next log line waits for it forever (seen in CI: the test
    process hung in ``Handler.acquire``).
    """
    for ref in list(logging._handlerList):
        handler = ref()
        if handler is not None:
            handler.createLock()


def _fork_worker(args, ledger, seed):
    """Fork a worker; return (pid, read end that says 'ready')."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the worker: never returns
        code = 1
        try:
            own_logging_locks()
            os.close(r)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            rig = Rig(*args)
            os.write(w, b'r')
            _work(rig, ledger, seed)
        except BaseException as e:  # report, never fall into the caller
            sys.stderr.write('worker failed: %r\n' % (e,))
        finally:
            os._exit(code)
    os.close(w)
    return pid, r


def _acked(ledger):
    """{kind: set of names} the worker was told exist now."""
    have = {'mdev': set(), 'vf': set(), 'mig': set()}
    if os.path.exists(ledger):
        with open(ledger) as f:
            for line in f:
                try:
                    kind, name, state = json.loads(line)
                except ValueError:
                    continue  # the line the kill tore
                (have[kind].add if state == 'have'
                 else have[kind].discard)(name)
    return have


def _problems(state, acked, in_use, baseline):
    """Devices leaked, half-made and touched, and the entries libvirt
    alone still lists (``devices.is_stale_libvirt_entry``: libvirt's own
    race, nothing on the host; counted apart, not hidden).
    """
    from nova_gpu.agent import devices
    leaked, half, touched, stale = [], [], [], []
    for uuid, (sys_active, lv_active, persistent) in state['mdev'].items():
        if uuid in in_use['mdev']:
            continue
        if devices.is_stale_libvirt_entry({'persistent': persistent},
                                          sys_active):
            stale.append('mdev %s %s' % (uuid, state['mdev'][uuid]))
        elif not (sys_active and lv_active and persistent):
            half.append('mdev %s %s' % (uuid, state['mdev'][uuid]))
        elif uuid not in acked['mdev']:
            leaked.append('mdev ' + uuid)
    for addr in state['vf']:
        if addr not in in_use['vf'] and addr not in acked['vf']:
            leaked.append('vf ' + addr)
    for gi, (start, cis) in state['mig'].items():
        if gi in in_use['mig']:
            continue
        if cis < 1:
            half.append('mig %s@%d without compute instance' % (gi, start))
        elif gi not in acked['mig']:
            leaked.append('mig %s@%d' % (gi, start))
    for kind, names in in_use.items():
        for name in names:
            if state[kind].get(name) != baseline[kind][name]:
                touched.append('%s %s: %s -> %s' % (
                    kind, name, baseline[kind][name],
                    state[kind].get(name)))
    return leaked, half, touched, stale


def _reconcile_after_restart(args):
    rig = Rig(*args)
    try:
        result = rig.reconciler().run()
        return result, rig.state()
    finally:
        rig.close()


def kills(trials, seed=0, delay=(0.05, 1.2), log=print):
    """SIGKILL a worker ``trials`` times; return the figures' values."""
    import libvirt

    from nova_gpu.core import catalog
    from nova_gpu.tests.functional.agent import fakehost
    rng = random.Random(seed)
    host = fakehost.FakeHost(build_host)
    host.setUp()
    try:
        args = (host.uri, host.fs.root, os.path.join(host.dir, 'state'),
                os.path.join(host.dir, 'nvml.json'))
        ledger = os.path.join(host.dir, 'ledger')
        rig = Rig(*args)
        m = rig.manager
        used = [m.create_mdev(PARENT, MDEV_TYPE) for _ in range(2)]
        vf = m.create_vf_vgpu(PF, VGPU_TYPE)
        conn = libvirt.open(host.uri)
        conn.defineXML(host.domain_xml('guest', mdevs=used, pci=[vf]))
        conn.close()
        gi = m.create_mig(0, catalog.load_catalog().model(
            'A100-40GB').mig_profile('3g.20gb'), 0)
        rig.lib.start_vgpu_on(rig.lib.gpus[0], gi)
        baseline = rig.state()
        in_use = {'mdev': set(used), 'vf': {vf}, 'mig': {str(gi)}}
        rig.close()
        totals = {'trials': 0, 'leaked': 0, 'half': 0, 'touched': 0,
                  'rolled_back': 0, 'errors': 0, 'libvirt_stale': 0}
        details = []
        for trial in range(trials):
            pid, ready = _fork_worker(args, ledger, rng.getrandbits(32))
            os.read(ready, 1)  # set up: now at work
            os.close(ready)
            time.sleep(rng.uniform(*delay))
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            result, state = _reconcile_after_restart(args)
            totals['trials'] += 1
            totals['rolled_back'] += len(result.rolled_back)
            totals['errors'] += len(result.errors)
            leaked, half, touched, stale = _problems(
                state, _acked(ledger), in_use, baseline)
            for name, found in (('leaked', leaked), ('half', half),
                                ('touched', touched),
                                ('libvirt_stale', stale)):
                totals[name] += len(found)
                details += ['trial %d: %s %s' % (trial, name, f)
                            for f in found]
            details += ['trial %d: reconcile error %s' % (trial, e)
                        for e in result.errors]
            # what the next worker starts from: the ledger says what is
            # there now (a device left by a cut-short remove is in use or
            # acknowledged; the rest was rolled back)
            with open(ledger, 'w') as f:
                for kind, names in state.items():
                    for name in names:
                        f.write(json.dumps([kind, name, 'have']) + '\n')
        totals['details'] = details
        return totals
    finally:
        host.cleanUp()


# -- RabbitMQ and libvirtd restarts ----------------------------------------

def _service_options():
    """What the restarts run changes in the agent's config file."""
    return {
        'DEFAULT': {'debug': 'false'},
        # durable queues: what the broker took survives its restart
        'oslo_messaging_rabbit': {'amqp_durable_queues': 'true',
                                  'rabbit_retry_interval': 1},
        'gpu_agent': {'reconcile_interval': 1,
                      'orphan_grace_period': 3600,
                      'libvirt_retries': 1, 'device_timeout': 5,
                      'provider_config_file': ''},
    }


class _Reports:
    def __init__(self):
        self.generations = set()
        self.lock = threading.Lock()

    def info(self, ctxt, publisher_id, event_type, payload, metadata):
        with self.lock:
            self.generations.add(payload['generation'])


def _published(log_path, held=None):
    """Report generations the agent logged (``held``: also the cycles
    that kept reports in the outbox and that reconciled without libvirt).
    """
    gens = []
    with open(log_path, errors='replace') as f:
        for line in f:
            if 'GPU cycle: report generation' in line:
                gens.append(int(line.split('report generation ')[1]
                                .split(',')[0]))
                unsent = line.rsplit(' reports unsent', 1)[0].rsplit(' ', 1)
                if held is not None and unsent[-1] not in ('0', 'None'):
                    held['broker'] += 1
            elif held is not None and 'reconcile failed' in line:
                held['libvirt'] += 1
    return gens


def restarts(outage=4.0, log=print):
    """Run the agent service through a broker and a libvirtd restart."""
    from oslo_config import cfg

    from nova_gpu import listening
    from nova_gpu.tests.functional.agent import fakehost
    from nova_gpu.tests.functional.agent import rabbit
    from nova_gpu.tests.harness import agent_process
    host = fakehost.FakeHost(build_host)
    host.setUp()
    broker = rabbit.PrivateRabbit()
    try:
        broker.setUp()
        topic = 'ngpu_rel_%s' % uuid_mod.uuid4().hex[:8]
        conf = cfg.ConfigOpts()
        conf([], project='nova-gpu-bench')
        transport = listening.transport(conf, url=broker.url)
        # durable queues: what the broker took survives its restart
        conf.set_override('amqp_durable_queues', True,
                          group='oslo_messaging_rabbit')
        conf.set_override('rabbit_retry_interval', 1,
                          group='oslo_messaging_rabbit')
        reports = _Reports()
        listener = listening.Listener(
            conf, [(topic, 'nova')], [reports], transport=transport).start()
        path = agent_process.write_config(
            os.path.join(host.dir, 'agent.conf'), broker.url, topic,
            host.dir, host.fs.root, host='rel1', libvirt_uri=host.uri,
            options=_service_options())
        log_path = os.path.join(host.dir, 'agent.log')
        agent = agent_process.AgentProcess(path, log_path)
        agent.setUp()
        try:
            steps = {'started': agent.wait_cycles(2)}
            broker.stop_app()
            time.sleep(outage)
            broker.start_app()
            steps['after broker restart'] = agent.wait_cycles(3)
            host.stop_libvirtd()
            time.sleep(outage)
            host.start_libvirtd()
            steps['after libvirtd restart'] = agent.wait_cycles(3)
            alive = agent.running
        finally:
            agent.cleanUp()
        held = {'broker': 0, 'libvirt': 0}
        published = _published(log_path, held)
        unsent = len(os.listdir(os.path.join(host.dir, 'outbox')))
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with reports.lock:
                if set(published) <= reports.generations:
                    break
            time.sleep(0.2)
        listener.stop()
        transport.cleanup()
        with reports.lock:
            lost = sorted(set(published) - reports.generations)
        return {'published': len(published), 'lost': len(lost),
                'held_broker': held['broker'],
                'without_libvirt': held['libvirt'],
                'unsent': unsent, 'alive': alive, 'steps': steps,
                'log': log_path if lost or not alive else None}
    finally:
        broker.cleanUp()
        host.cleanUp()


def run(quick=False):
    trials = 20 if quick else 100
    k = kills(trials)
    for line in k['details'][:20]:
        print('  ' + line)
    r = restarts(outage=3.0 if quick else 5.0)
    recovered = r['alive'] and all(r['steps'].values())
    return [
        Figure(PART, 'agent SIGKILLs during create/remove (mdev, VF, MIG)',
               k['trials'], '%d' % trials, k['trials'] == trials),
        Figure(PART, 'leaked or half-made devices after one reconcile',
               k['leaked'] + k['half'], '0',
               k['leaked'] + k['half'] == 0),
        Figure(PART, 'devices in use touched', k['touched'], '0',
               k['touched'] == 0),
        Figure(PART, 'mdevs only libvirt still lists (its refresh race)',
               k['libvirt_stale'], '-', True),
        Figure(PART, 'half-made operations rolled back from the journal',
               k['rolled_back'], '-', True),
        Figure(PART, 'reports published across RabbitMQ + libvirtd '
               'restarts', r['published'], '> 0', r['published'] > 0),
        Figure(PART, 'cycles with reports held while RabbitMQ was down',
               r['held_broker'], '> 0', r['held_broker'] > 0),
        Figure(PART, 'cycles reporting while libvirtd was down',
               r['without_libvirt'], '> 0', r['without_libvirt'] > 0),
        Figure(PART, 'reports lost', r['lost'] + r['unsent'], '0',
               r['lost'] + r['unsent'] == 0),
        Figure(PART, 'agent recovered without restart',
               'yes' if recovered else 'no (%s)' % r['steps'], 'yes',
               recovered),
    ]


if __name__ == '__main__':
    from nova_gpu.bench import reliability
    sys.exit(reliability.part_main(PART, run))
