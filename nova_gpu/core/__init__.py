"""The OpenStack-free GPU domain core.

Nothing in this package imports OpenStack libraries: the scheduler plugin,
the compute agent and the simulator all build on it, so the placement rules
exist exactly once.
"""
