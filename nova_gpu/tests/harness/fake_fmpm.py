"""A fake ``fmpm`` for devstack's fake HGX host: Fabric Manager faked at
the command nova-gpu-agent runs.

``agent.fabric.FmpmClient`` runs NVIDIA's ``fmpm`` tool
(github.com/NVIDIA/Fabric-Manager-Client): ``-l`` and
``--list-unsupported-partitions`` print JSON (``partitionInfo``), ``-a
ID``, ``-d ID`` and ``--set-activated-list IDS`` change the activations,
and the exit status is the API's (negative) ``fmReturn_t``. This command
answers the same way, from a JSON state file that stands for Fabric
Manager's memory (the GPUs' bus IDs by module, the unsupported
partitions, the active ones): the partitions are the board's published
table and the answers ``tests/unit/agent/fakefm.FakeFabricManager``'s,
the fake the agent's unit tests use. Calls are serialised with a lock on
the state file (the agent and the ``qemu`` hook call at once)::

  python -m nova_gpu.tests.harness.fake_fmpm --state FILE init \\
      --board HGX-H100-8GPU --gpus ADDR,ADDR,... [--unsupported ID,...]
  python -m nova_gpu.tests.harness.fake_fmpm --state FILE FMPM-ARGS

``write_wrapper`` writes an executable that runs the second form, for
``[gpu_agent] fmpm_path``.
"""

import argparse
import fcntl
import json
import os
import shlex
import sys

from nova_gpu.agent import fabric


def _load(path):
    from nova_gpu.tests.unit.agent import fakefm
    with open(path) as f:
        state = json.load(f)
    fm = fakefm.FakeFabricManager(state['gpus'], state['board'],
                                  state.get('unsupported', ()))
    fm.active = set(state.get('active', ()))
    return state, fm


def init(path, board, gpus, unsupported=()):
    """Fabric Manager's state at its start: nothing active."""
    tmp = path + '.tmp'
    with open(tmp, 'w') as f:
        json.dump({'board': board, 'gpus': list(gpus),
                   'unsupported': sorted(unsupported), 'active': []}, f)
    os.replace(tmp, path)


def answer(path, argv):
    """(exit status, stdout text) of ``fmpm argv`` on the state ``path``."""
    parser = argparse.ArgumentParser(prog='fmpm', add_help=False)
    ops = parser.add_mutually_exclusive_group(required=True)
    ops.add_argument('-l', '--list-partitions', action='store_true')
    ops.add_argument('--list-unsupported-partitions', action='store_true')
    ops.add_argument('-a', '--activate', type=int)
    ops.add_argument('-d', '--deactivate', type=int)
    ops.add_argument('--set-activated-list')
    # Where Fabric Manager listens: one fake per host, whatever is named.
    parser.add_argument('--hostname')
    parser.add_argument('--unix-domain-socket')
    try:
        args = parser.parse_args(argv)
    except SystemExit:
        return fabric.FM_ST_BADPARAM, ''
    with open(path + '.lock', 'a') as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        state, fm = _load(path)
        try:
            if args.list_partitions:
                return 0, json.dumps({'partitionInfo': [
                    {'partitionId': p.id, 'isActive': int(p.active),
                     'numGpus': len(p.pci_bus_ids),
                     'gpuInfo': [{'physicalId': m, 'pciBusId': b}
                                 for m, b in zip(p.physical_ids,
                                                 p.pci_bus_ids)]}
                    for p in fm.supported_partitions()]})
            if args.list_unsupported_partitions:
                return 0, json.dumps({'partitionInfo': [
                    {'partitionId': p} for p in fm.unsupported_partitions()]})
            if args.activate is not None:
                fm.activate(args.activate)
            elif args.deactivate is not None:
                fm.deactivate(args.deactivate)
            else:
                fm.set_activated(int(i) for i in
                                 args.set_activated_list.split(',') if i)
        except fabric.FabricManagerError as e:
            return e.code, str(e)
        except ValueError as e:
            return fabric.FM_ST_BADPARAM, str(e)
        state['active'] = sorted(fm.active)
        tmp = path + '.tmp'
        with open(tmp, 'w') as f:
            json.dump(state, f)
        os.replace(tmp, path)
        return 0, ''


def write_wrapper(wrapper, state):
    """An executable ``fmpm`` at ``wrapper`` answering from ``state``."""
    with open(wrapper, 'w') as f:
        f.write('#!/bin/sh\n# nova_gpu.tests.harness.fake_fmpm\nexec %s -m '
                'nova_gpu.tests.harness.fake_fmpm --state %s "$@"\n'
                % (shlex.quote(sys.executable), shlex.quote(state)))
    os.chmod(wrapper, 0o755)
    return wrapper


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) < 2 or argv[0] != '--state':
        sys.stderr.write('usage: fake_fmpm --state FILE (init ...|FMPM '
                         'ARGS)\n')
        return 2
    path, rest = argv[1], argv[2:]
    if rest[:1] == ['init']:
        p = argparse.ArgumentParser(prog='fake_fmpm init')
        p.add_argument('--board', required=True)
        p.add_argument('--gpus', required=True)
        p.add_argument('--unsupported', default='')
        args = p.parse_args(rest[1:])
        init(path, args.board, args.gpus.split(','),
             [int(i) for i in args.unsupported.split(',') if i])
        return 0
    code, text = answer(path, rest)
    if text:
        (sys.stdout if code == 0 else sys.stderr).write(text + '\n')
    # fmpm exits with the fmReturn_t; the shell sees it mod 256.
    return code % 256


if __name__ == '__main__':
    sys.exit(main())
