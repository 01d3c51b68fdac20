"""The mavjet daemon: MAVLink vehicles to JetStream digital twins."""

__version__ = "0.1.0"
