# Sphinx configuration of the nova-gpu release notes (reno).
project = 'nova-gpu release notes'
extensions = ['reno.sphinxext']
master_doc = 'index'
html_theme = 'alabaster'
