"""The reliability runner keeps each part's latest rows."""

import os
import tempfile

import testtools

from nova_gpu.bench import reliability


class SaveTest(testtools.TestCase):

    def test_parts_merge_and_markdown(self):
        out = os.path.join(tempfile.mkdtemp(), 'reliability.md')
        fig = reliability.Figure
        reliability.save([fig('boots', 'over-commits', 0, '0', True)], out)
        reliability.save([fig('specs', 'HTTP 5xx', 2, '0', False)], out)
        reliability.save([fig('specs', 'HTTP 5xx', 0, '0', True)], out)
        with open(out) as f:
            text = f.read()
        self.assertIn('| boots | over-commits | 0 | 0 | yes |', text)
        self.assertIn('| specs | HTTP 5xx | 0 | 0 | yes |', text)
        self.assertNotIn('| NO |', text)
        # Parts in the runner's order, whatever order they ran in.
        self.assertLess(text.index('| specs |'), text.index('| boots |'))
