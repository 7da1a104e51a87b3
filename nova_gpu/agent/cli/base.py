"""What every nova-gpu command shares: the agent, --json, errors.

``--json`` prints a command's whole result (``result``: what the agent
knows); otherwise cliff prints the command's table (``rows``, with
``-f table|json|yaml|csv|value``) or line. Each ``-c`` must name a column
of the output: cliff would ignore one that names none (or fail with a
traceback when no ``-c`` does), and ``-f value`` output would lose a field
silently.
"""

import json

from cliff import command
from cliff import lister
from cliff import show

from nova_gpu.core import exceptions
from nova_gpu import daemon


class UnknownColumn(exceptions.GpuError):
    """A ``-c`` names no column of the command's output."""


def to_json(value):
    return json.dumps(value, indent=2, sort_keys=True, default=str)


def _column_key(name):
    # as cliff matches -c to a column: '-c vgpu_type' is 'VGPU TYPE'
    return name.lower().strip().replace(' ', '_')


def check_columns(asked, columns):
    """Raise UnknownColumn unless every name in ``asked`` (``-c``) is one
    of ``columns``.
    """
    known = {_column_key(c) for c in columns}
    unknown = [c for c in asked or () if _column_key(c) not in known]
    if unknown:
        raise UnknownColumn('unknown column%s %s (the columns: %s)' % (
            's' if len(unknown) > 1 else '',
            ', '.join(daemon.printable(c) for c in unknown),
            ', '.join(columns)))


class _Base:

    def result(self, agent, args):
        """The whole result, as ``--json`` prints it."""
        raise NotImplementedError()

    def run(self, parsed_args):
        try:
            if self.app.options.json or self.as_json(parsed_args):
                self.app.stdout.write(to_json(self.result(
                    self.app.agent, parsed_args)) + '\n')
                return 0
            return super().run(parsed_args)
        except BrokenPipeError:
            raise  # output piped to head: cliff exits quietly
        except Exception as e:
            return self.app.fail(e)

    def as_json(self, args):
        """Whether this invocation prints JSON without ``--json``."""
        return False

    def produce_output(self, parsed_args, column_names, data):
        # Lister and ShowOne (whose columns are its result's keys): -c is
        # checked before anything is printed.
        check_columns(parsed_args.columns, column_names)
        return super().produce_output(parsed_args, column_names, data)


class Lister(_Base, lister.Lister):
    """A table: ``columns``, and ``rows`` (a sequence of tuples)."""

    columns = ()

    def rows(self, agent, args):
        raise NotImplementedError()

    def take_action(self, parsed_args):
        # The columns are known: a bad -c is refused before the work.
        check_columns(parsed_args.columns, self.columns)
        return self.columns, self.rows(self.app.agent, parsed_args)


class ShowOne(_Base, show.ShowOne):
    """The result, a dict, as field/value pairs."""

    def take_action(self, parsed_args):
        result = self.result(self.app.agent, parsed_args)
        return tuple(result), tuple(result.values())


class Action(_Base, command.Command):
    """A change to the host; prints one line (the result)."""

    def take_action(self, parsed_args):
        self.app.stdout.write('%s\n' % self.result(self.app.agent,
                                                   parsed_args))
        return 0
