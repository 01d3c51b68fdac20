"""A realistic ArduCopter parameter subset, with MAVLink types.

The gateway's parameter protocol (PARAM_REQUEST_LIST/READ, PARAM_SET) and its
shadow reconciler need names, types and values that behave like a real
autopilot's: integer parameters are stored as integers (a PARAM_SET of 2.6 on
an INT8 stores 3), every value travels as a float in PARAM_VALUE, and unknown
names are ignored without an answer. The parameters the simulator acts on are
marked in `docs/sim.md`; the rest are stored and reported only.

Names and defaults follow ArduCopter 4.7 (MAV_SYSID) except where noted (DISARM_DELAY is ArduCopter's 10:
a vehicle armed on the ground that does not take off disarms itself after 10 s of sim time), and the battery is a
4S 5200 mAh pack whose low/critical voltages (14.7 V, 14.2 V) fall at about
25 % and 7 % in the simulator's voltage model, with a low-battery action of
RTL (ArduCopter ships with 0, no action).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final

INT8: Final = 2  # MAV_PARAM_TYPE_INT8
INT16: Final = 4
INT32: Final = 6
REAL32: Final = 9

_INT_RANGES: Final = {INT8: (-128, 127), INT16: (-32768, 32767), INT32: (-(2**31), 2**31 - 1)}


@dataclass(frozen=True, slots=True, kw_only=True)
class SimParamSpec:
    name: str
    default: float
    type: int


_TABLE: Final[tuple[tuple[str, float, int], ...]] = (
    ("FORMAT_VERSION", 120, INT16),
    # ArduPilot 4.7 renamed SYSID_THISMAV / SYSID_MYGCS into the MAV_ namespace (converted once at
    # load, no alias: the old names are unknown to a 4.7 vehicle).
    ("MAV_SYSID", 1, INT16),
    ("MAV_GCS_SYSID", 255, INT16),
    ("FRAME_CLASS", 1, INT8),
    ("FRAME_TYPE", 1, INT8),
    ("ARMING_CHECK", 1, INT32),
    ("DISARM_DELAY", 10, INT8),
    ("ANGLE_MAX", 3000, INT16),
    ("PILOT_SPEED_UP", 250, INT16),
    ("PILOT_SPEED_DN", 0, INT16),
    ("PILOT_THR_BHV", 0, INT16),
    ("WPNAV_SPEED", 500, REAL32),
    ("WPNAV_SPEED_UP", 250, REAL32),
    ("WPNAV_SPEED_DN", 150, REAL32),
    ("WPNAV_RADIUS", 200, REAL32),
    ("WPNAV_ACCEL", 250, REAL32),
    ("WP_YAW_BEHAVIOR", 2, INT8),
    ("LAND_SPEED", 50, INT16),
    ("LAND_SPEED_HIGH", 0, INT16),
    ("RTL_ALT", 1500, INT32),
    ("RTL_ALT_FINAL", 0, INT32),
    ("RTL_SPEED", 0, INT16),
    ("RTL_LOIT_TIME", 5000, INT32),
    ("RTL_CLIMB_MIN", 0, INT16),
    ("AUTO_OPTIONS", 0, INT32),
    ("BATT_MONITOR", 4, INT8),
    ("BATT_CAPACITY", 5200, INT32),
    ("BATT_LOW_VOLT", 14.7, REAL32),
    ("BATT_CRT_VOLT", 14.2, REAL32),
    ("BATT_LOW_MAH", 0, REAL32),
    ("BATT_CRT_MAH", 0, REAL32),
    ("BATT_LOW_TIMER", 10, INT8),
    ("BATT_FS_LOW_ACT", 2, INT8),
    ("BATT_FS_CRT_ACT", 1, INT8),
    ("BATT_ARM_VOLT", 0, REAL32),
    ("BATT_ARM_MAH", 0, INT32),
    ("FENCE_ENABLE", 0, INT8),
    ("FENCE_TYPE", 7, INT8),
    ("FENCE_ACTION", 1, INT8),
    ("FENCE_ALT_MAX", 100, REAL32),
    ("FENCE_ALT_MIN", -10, REAL32),
    ("FENCE_RADIUS", 300, REAL32),
    ("FENCE_MARGIN", 2, REAL32),
    ("FS_GCS_ENABLE", 0, INT8),
    ("FS_GCS_TIMEOUT", 5, REAL32),
    ("FS_THR_ENABLE", 1, INT8),
    ("FS_EKF_ACTION", 1, INT8),
    ("FS_EKF_THRESH", 0.8, REAL32),
    ("FS_OPTIONS", 0, INT32),
    ("GPS_TYPE", 1, INT8),
    ("GPS_AUTO_CONFIG", 1, INT8),
    ("AHRS_EKF_TYPE", 3, INT8),
    ("EK3_ENABLE", 1, INT8),
    ("COMPASS_USE", 1, INT8),
    ("MOT_SPIN_ARM", 0.1, REAL32),
    ("MOT_HOVER_LEARN", 2, INT8),
    ("LOG_BITMASK", 176126, INT32),
    ("SERIAL0_BAUD", 115, INT32),
    ("SERIAL0_PROTOCOL", 2, INT8),
    ("TERRAIN_ENABLE", 1, INT8),
    # kept by the vehicle itself, broadcast (PARAM_VALUE index 65535) when an upload changes them
    ("MIS_TOTAL", 0, INT16),
    ("FENCE_TOTAL", 0, INT8),
    ("RALLY_TOTAL", 0, INT8),
)

SPECS: Final[tuple[SimParamSpec, ...]] = tuple(SimParamSpec(name=n, default=float(d), type=t) for n, d, t in _TABLE)
INDEX: Final[dict[str, int]] = {s.name: i for i, s in enumerate(SPECS)}
BY_NAME: Final[dict[str, SimParamSpec]] = {s.name: s for s in SPECS}


def coerce(spec: SimParamSpec, value: float) -> float:
    """The value as the autopilot would store it: integers rounded and clamped to the type."""
    if spec.type == REAL32:
        return float(value)
    lo, hi = _INT_RANGES[spec.type]
    return float(min(max(round(value), lo), hi))


def defaults(sysid: int) -> dict[str, float]:
    values = {s.name: s.default for s in SPECS}
    values["MAV_SYSID"] = float(sysid)
    return values


def to_bytewise(value: float) -> float:
    """An INT32 as PX4 puts it on the wire: its bytes read as a float32."""
    return float(struct.unpack("<f", struct.pack("<i", int(value)))[0])


def from_bytewise(wire: float) -> float:
    """The INT32 whose bytes a PX4 PARAM_SET/PARAM_VALUE float carries."""
    return float(struct.unpack("<i", struct.pack("<f", wire))[0])
