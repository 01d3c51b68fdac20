"""The one place that imports pymavlink's generated dialect.

`from pymavlink import mavutil` would pull in the 'all' dialect (+17 MiB RSS,
+50 ms); the ardupilotmega dialect is a superset of common and is what both
ArduPilot and PX4 speak for everything mavjet uses.

MAVLink 2 is chosen by importing the `v20` package explicitly. Only
`mavutil` reads the MAVLINK20 environment variable, and nothing in mavjet
imports it, so nothing here touches the process environment.
"""

from __future__ import annotations

from typing import Any

from pymavlink.dialects.v20 import ardupilotmega as mavlink2

__all__ = ["MavMessage", "fastcrc_available", "mavlink2"]

#: A decoded or outgoing MAVLink message. pymavlink's generated message
#: classes are untyped (and the framer builds lighter look-alikes), so this is
#: the one name for "a MAVLink message object" across drivers and gateway.
MavMessage = Any


def fastcrc_available() -> bool:
    """True when pymavlink computes CRCs with fastcrc (2x faster decoding)."""
    try:
        import fastcrc  # noqa: F401
    except ImportError:
        return False
    return True
