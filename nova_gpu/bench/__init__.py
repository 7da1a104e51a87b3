"""Benchmarks printed by ``python -m nova_gpu.bench`` (``tox -e bench``)."""
