"""nova_gpu.tables: the one table printer."""

import testtools

from nova_gpu import tables


def cells(text):
    """The rows of a prettytable, as lists of stripped cells."""
    return [[c.strip() for c in line.strip('|').split('|')]
            for line in text.splitlines() if line.startswith('|')]


class TextTest(testtools.TestCase):

    def test_cells_and_alignment(self):
        text = tables.text(('host', 'GPUs', 'frag.', 'note'),
                           [('h1', 8, 0.5, None), ('host-22', 10, 1.25,
                                                   'x')],
                           float_format='%.2f')
        self.assertEqual([['host', 'GPUs', 'frag.', 'note'],
                          ['h1', '8', '0.50', '-'],
                          ['host-22', '10', '1.25', 'x']], cells(text))
        # numbers right-aligned, text left-aligned
        self.assertIn('| h1      |    8 |  0.50 | -    |', text)

    def test_mixed_column_is_text(self):
        text = tables.text(('policy', 'sim@100'), [('fgd', 96.1),
                                                   ('ours', '-')])
        self.assertIn('| fgd    | 96.1    |', text)
        self.assertIn('| ours   | -       |', text)

    def test_none_in_a_number_column(self):
        text = tables.text(('name', 'MiB'), [('ours', 2.5), ('floor', None)])
        self.assertIn('| ours  | 2.5 |', text)
        self.assertIn('| floor |   - |', text)

    def test_title(self):
        text = tables.text(('a',), [(1,)], title='Placements')
        self.assertEqual('Placements', cells(text)[0][0])
        self.assertEqual([['a'], ['1']], cells(text)[1:])

    def test_booleans_are_not_numbers(self):
        text = tables.text(('ok',), [(True,), (False,)])
        self.assertIn('| True  |', text)


class MarkdownTest(testtools.TestCase):

    def test_markdown(self):
        self.assertEqual('| policy | alloc@130 |\n|---|---|\n'
                         '| ours | 96.29 |\n| fgd | None |',
                         tables.markdown(['policy', 'alloc@130'],
                                         [['ours', 96.29], ['fgd', None]]))
