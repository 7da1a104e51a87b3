"""Trace replay: how much GPU capacity a placement policy strands.

``trace`` reads node and task lists (Alibaba GPU trace format) and builds
the FGD artifact's workload; ``state`` holds the modelled cluster as numpy
arrays and evaluates the core's fragmentation measure for many nodes at
once; ``policies`` are Random, BestFit and FGD (ports of the artifact),
stock Nova and ours (``nova_gpu.core.scoring``); ``replay`` runs one policy
and audits the decisions; ``nova_modes`` replays the same demand as vGPU
and MIG requests on core hosts; ``cli`` is ``nova-gpu-sim``.
"""
