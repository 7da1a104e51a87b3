"""Periodic defragmentation: ``nova-gpu-defrag`` (off by default).

The decisions are the core's (``nova_gpu.core.defrag``); this adapter
only reads the exporter over HTTP, connects to the cloud (openstacksdk)
and runs them every ``[gpu_defrag] interval`` seconds.
"""
