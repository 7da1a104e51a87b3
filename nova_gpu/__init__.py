"""nova-gpu: GPU-aware scheduling and device management for OpenStack Nova."""
