"""The one place that imports pymavlink's generated dialect.

`from pymavlink import mavutil` would pull in the 'all' dialect (+17 MiB RSS,
+50 ms); the ardupilotmega dialect is a superset of common and is what both
ArduPilot and PX4 speak for everything mavjet uses.
"""

from __future__ import annotations

import os

# pymavlink reads this at import of its generator; pin MAVLink 2 for anything
# else that might import pymavlink after us.
os.environ.setdefault("MAVLINK20", "1")

from pymavlink.dialects.v20 import ardupilotmega as mavlink2

__all__ = ["fastcrc_available", "mavlink2"]


def fastcrc_available() -> bool:
    """True when pymavlink computes CRCs with fastcrc (2x faster decoding)."""
    try:
        import fastcrc  # noqa: F401
    except ImportError:
        return False
    return True
