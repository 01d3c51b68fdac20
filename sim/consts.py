"""MAVLink values the vehicle model's modules share (sim/model.py and the modules it delegates to)."""

from __future__ import annotations

from typing import Final

from pymavlink.dialects.v20 import ardupilotmega as mavlink2

R = mavlink2  # brevity for MAV_* constants
ACCEPTED: Final[int] = R.MAV_RESULT_ACCEPTED
TEMP_REJECTED: Final[int] = R.MAV_RESULT_TEMPORARILY_REJECTED
DENIED: Final[int] = R.MAV_RESULT_DENIED
UNSUPPORTED: Final[int] = R.MAV_RESULT_UNSUPPORTED
FAILED: Final[int] = R.MAV_RESULT_FAILED
IN_PROGRESS: Final[int] = R.MAV_RESULT_IN_PROGRESS
FORCEABLE: Final = frozenset(k for k in R.enums["MAV_RESULT"] if k < R.MAV_RESULT_ENUM_END)

NAV_CMDS_MAX: Final = 95  # MAV_CMD ids below this are navigation commands
PX4_MAIN_AUTO: Final = 4  # PX4's main mode AUTO (custom_mode bits 16..23)
# ArduPilot runs its pre-arm checks at 1 Hz but prints a failing one only every
# PREARM_DISPLAY_PERIOD (AP_Arming: 30 s); the first line came 30 s after boot on SITL.
PREARM_DISPLAY_S: Final = 30.0
TIMESYNC_S: Final = 10.0  # ArduPilot asks every link for a TIMESYNC this often (sim seconds; tc1 = 0)
