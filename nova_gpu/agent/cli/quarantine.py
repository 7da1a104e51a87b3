"""nova-gpu commands of GPU health: quarantine list, quarantine clear.

They read and edit the agent's health records (``agent.health``, in
``[gpu_agent] state_dir``) under the same lock as the agent; the agent's
next cycle reports the change to the schedulers.
"""

import getpass
import socket

from nova_gpu.agent.cli import base
from nova_gpu.agent import errors
from nova_gpu.agent import health as health_mod
from nova_gpu.core import health as core_health


class ListQuarantine(base.Lister):
    """List each GPU's faults: quarantined or watched, since when, why.

    ``--json`` adds each GPU's evidence of cleared faults.
    """

    columns = ('ADDRESS', 'QUARANTINED', 'FAULT', 'ACTION', 'SINCE',
               'CLEARED BY')

    def result(self, agent, args):
        return {address: h.to_dict()
                for address, h in agent.health_store.load().items()}

    def rows(self, agent, args):
        rows = []
        for address, h in sorted(agent.health_store.load().items()):
            for f in h.faults:
                rows.append((address, 'yes' if h.quarantined else 'no',
                             f.detail, f.action,
                             core_health.when(f.since),
                             f.clears))
        return rows


class ClearQuarantine(base.Action):
    """Clear a GPU's faults (after servicing it): it takes guests again."""

    def get_parser(self, prog_name):
        parser = super().get_parser(prog_name)
        parser.add_argument('address', help='GPU PCI address, as '
                            '"nova-gpu quarantine list" shows it')
        return parser

    def result(self, agent, args):
        who = '%s on %s' % (getpass.getuser(), socket.gethostname())
        try:
            after = health_mod.clear(agent.health_store, args.address, who)
        except KeyError:
            raise errors.NotFound('no health record of GPU %r (see "nova-gpu '
                                  'quarantine list")' % args.address)
        return ('GPU %s cleared; the agent reports it at its next cycle: %s'
                % (args.address, after.cleared[-1]))
