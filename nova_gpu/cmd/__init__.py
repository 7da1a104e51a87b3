"""Entry points of nova-gpu's services and tools (``console_scripts``).

As Nova's ``nova/cmd`` modules choose the concurrency mode before anything
else is imported, each entry point of nova-gpu's own services imports
``native_threading`` first, which puts the process in native threading
(Nova 34's default) and forbids eventlet: those services never import it.
``scheduler`` (nova-gpu-scheduler) runs Nova's own scheduler service,
which chooses its mode as Nova does (``nova.monkey_patch``).
"""
