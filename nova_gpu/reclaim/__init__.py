"""Spot GPU servers: reclaiming preemptible capacity for on-demand users.

``reclaimer`` decides (OpenStack-free, on the core's hosts and the move
planner); the service that listens to Nova and acts through the compute
API is described in ``doc/source/economics.rst``.
"""
