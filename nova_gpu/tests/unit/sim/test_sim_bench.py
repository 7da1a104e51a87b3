"""The simulator benchmark's tables print (``nova_gpu.bench.sim_bench``).

The full benchmark needs the Alibaba trace and minutes; its tables are
built here from stand-in results, through the same table printer.
"""

import fixtures
import testtools

from nova_gpu.bench import sim_bench
from nova_gpu import tables


class FakeResult:
    """What the tables read of a ``replay.ReplayResult``."""

    def __init__(self, at100, at130):
        self.points = {50: 50.0, 80: 80.0, 100: at100, 130: at130}
        self.failed = 7
        self.cpu_seconds = self.seconds = 0.5

    def curve(self):
        return self.points


class TablesTest(testtools.TestCase):

    def by_policy(self, names, base=90.0):
        return {name: [FakeResult(base + i, base + i + 0.2)
                       for _ in range(2)]
                for i, name in enumerate(names)}

    def test_every_table_prints(self):
        default = self.by_policy(sim_bench.POLICIES)
        self.useFixture(fixtures.MockPatch(
            'nova_gpu.sim.report.published',
            return_value={100: 90.0, 130: 90.5}))
        built = [sim_bench.reproduction(default, None, sim_bench.SEEDS)[:2],
                 sim_bench.ours_against_fgd(
                     {'default': default,
                      'gpushare100': self.by_policy(('fgd', 'ours'))},
                     None, sim_bench.SEEDS)[:2],
                 sim_bench.summary_table(default),
                 sim_bench.speed_table(default)]
        for header, rows in built:
            # Duplicate column names are refused by the printer.
            self.assertEqual(len(header), len(set(header)))
            self.assertIn(str(header[0]), tables.text(header, rows))
            self.assertIn('|', tables.markdown(header, rows))
