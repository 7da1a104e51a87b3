"""What every nova-gpu command shares: the agent, --json, errors.

``--json`` prints a command's whole result (``result``: what the agent
knows); otherwise cliff prints the command's table (``rows``, with
``-f table|json|yaml|csv|value``) or line.
"""

import json

from cliff import command
from cliff import lister
from cliff import show


def to_json(value):
    return json.dumps(value, indent=2, sort_keys=True, default=str)


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


class Lister(_Base, lister.Lister):
    """A table: ``columns``, and ``rows`` (a sequence of tuples)."""

    columns = ()

    def rows(self, agent, args):
        raise NotImplementedError()

    def take_action(self, parsed_args):
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
