# Sphinx configuration of the nova-gpu documentation.
project = 'nova-gpu'
copyright = '2026, nova-gpu developers'
extensions = []
master_doc = 'index'
exclude_patterns = ['_build']
html_theme = 'alabaster'
pygments_style = 'sphinx'
