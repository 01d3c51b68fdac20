"""The contract: what every part of mavjet agrees on (docs/design.md).

Subjects, the envelope, units, command bodies and results, the error family,
NATS connection options. The bottom layer: it imports nothing else of mavjet,
so a client, the simulator or the analytics jobs can use it without the daemon.
"""

__version__ = "0.1.0"
