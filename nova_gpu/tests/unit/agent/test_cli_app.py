"""The nova-gpu cliff application, in process: its commands and errors."""

from importlib import metadata
import io

from cliff import command
import testtools

from nova_gpu.agent import cli
from nova_gpu.agent import errors

COMMANDS = {'list', 'profiles', 'report', 'reconcile', 'create_mdev',
            'create_vgpu', 'create_mig', 'remove_mdev', 'remove_vgpu',
            'remove_mig', 'attach', 'detach', 'quarantine_list',
            'quarantine_clear'}


class AppTest(testtools.TestCase):

    def app(self, *argv):
        self.out, self.err = io.StringIO(), io.StringIO()
        app = cli.NovaGpuApp(stdout=self.out, stderr=self.err)
        app.options, _rest = app.parser.parse_known_args(list(argv))
        return app

    def test_every_command_is_an_entry_point(self):
        found = metadata.entry_points(group=cli.NAMESPACE)
        self.assertEqual(COMMANDS, {ep.name for ep in found})
        for ep in found:
            self.assertTrue(issubclass(ep.load(), command.Command), ep)

    def test_expected_error_is_one_line(self):
        rc = self.app().fail(errors.NotFound('no GPU %r' % '7'))
        self.assertEqual(1, rc)
        self.assertEqual("nova-gpu: error: no GPU '7'\n",
                         self.err.getvalue())

    def test_oserror_names_the_file(self):
        self.app().fail(FileNotFoundError(2, 'No such file or directory',
                                          '/sys/bus/pci'))
        self.assertEqual('nova-gpu: error: No such file or directory: '
                         '/sys/bus/pci\n', self.err.getvalue())

    def test_unexpected_error_keeps_its_traceback(self):
        # A bug, not a user error: the traceback is the report.
        app = self.app()
        try:
            {}['gpu']
        except KeyError as e:
            rc = app.fail(e)
        self.assertEqual(1, rc)
        lines = self.err.getvalue().splitlines()
        self.assertEqual('Traceback (most recent call last):', lines[0])
        self.assertEqual("nova-gpu: error: KeyError: 'gpu'", lines[-1])

    def test_debug_adds_the_traceback_to_expected_errors(self):
        app = self.app('-d')
        try:
            raise errors.Unavailable('libvirtd is not reachable')
        except errors.Unavailable as e:
            app.fail(e)
        lines = self.err.getvalue().splitlines()
        self.assertEqual('Traceback (most recent call last):', lines[0])
        self.assertEqual('nova-gpu: error: libvirtd is not reachable',
                         lines[-1])
