"""How PX4 stores an uploaded item and returns it on download, sans-IO.

Written from PX4's `MavlinkMissionManager::parse_mavlink_mission_item` and
`format_mavlink_mission_item` (src/modules/mavlink/mavlink_mission.cpp),
independently of the gateway's table (`mavjet.drivers.mavlink.normalise`): the sim
is the gateway's test peer and must not agree with it by construction.

- An item in a global frame (0, 3 or their _INT variants 5, 6) becomes a
  `mission_item_s` that keeps only what its command uses; on download every
  other param is 0 and the frame is the _INT variant (the sim's ground
  stations use MISSION_ITEM_INT). Yaw goes through float32 radians and back,
  wrapped to [0, 360), so it reads back with float noise (90 -> 90.00000x).
- An item in frame MISSION (2) keeps params 1-7 as sent.
- Fence points keep no `autocontinue` (0); mission and rally items keep it.
- Other frames (terrain 10/11, local) are refused: MAV_MISSION_UNSUPPORTED_FRAME.
"""

from __future__ import annotations

import math
import struct
from dataclasses import replace
from typing import Any, Final

from pymavlink.dialects.v20 import ardupilotmega as M

from mavjet.sim.missionitem import SimMissionItem

FENCE: Final = int(M.MAV_MISSION_TYPE_FENCE)

_GLOBAL_INT: Final = {0: 5, 5: 5, 3: 6, 6: 6}
_PI_F: Final = struct.unpack("<f", struct.pack("<f", math.pi))[0]


def _f32(v: float) -> float:
    return float(struct.unpack("<f", struct.pack("<f", v))[0]) if math.isfinite(v) else v


def _yaw(deg: float) -> float:
    """degrees(wrap_2pi(radians(deg))) in float32, as PX4 computes it."""
    if not math.isfinite(deg):
        return deg
    rad = _f32(_f32(deg) * _f32(_PI_F / 180.0))
    two_pi = _f32(2.0 * _PI_F)
    rad = _f32(rad - two_pi * math.floor(rad / two_pi))
    return _f32(rad * _f32(180.0 / _PI_F))


def _flag(v: float) -> float:
    return 1.0 if v > 0 else 0.0


def _u(bits: int, offset: float = 0.0) -> Any:
    def conv(v: float) -> float:
        v = v + offset
        return float(int(v)) if math.isfinite(v) and 0 <= v < 2**bits else 0.0

    return conv


_KEEP: Final[dict[int, tuple[Any, Any, Any, Any]]] = {
    M.MAV_CMD_NAV_WAYPOINT: (_f32, _f32, None, _yaw),
    M.MAV_CMD_NAV_LOITER_UNLIM: (None, None, _f32, _yaw),
    M.MAV_CMD_NAV_LOITER_TIME: (_f32, _flag, _f32, _flag),
    M.MAV_CMD_NAV_LAND: (None, _u(8), None, _yaw),
    M.MAV_CMD_NAV_TAKEOFF: (None, None, None, _yaw),
    M.MAV_CMD_NAV_LOITER_TO_ALT: (_flag, _f32, None, _flag),
    M.MAV_CMD_NAV_FENCE_POLYGON_VERTEX_INCLUSION: (_u(16, 0.5), None, None, None),
    M.MAV_CMD_NAV_FENCE_POLYGON_VERTEX_EXCLUSION: (_u(16, 0.5), None, None, None),
    M.MAV_CMD_NAV_FENCE_CIRCLE_INCLUSION: (_f32, None, None, None),
    M.MAV_CMD_NAV_FENCE_CIRCLE_EXCLUSION: (_f32, None, None, None),
    M.MAV_CMD_NAV_RALLY_POINT: (None, None, None, None),
    # Stored, but format_mavlink_mission_item has no case for them: sent with params 0 all the same.
    M.MAV_CMD_DO_SET_ROI_LOCATION: (None, None, None, None),
    M.MAV_CMD_DO_SET_ROI: (None, None, None, None),
    M.MAV_CMD_NAV_FENCE_RETURN_POINT: (None, None, None, None),
}


def px4_refusal(item: SimMissionItem) -> int | None:
    """The MISSION_ACK error PX4 answers for `item`, or None when it stores it."""
    if item.frame in _GLOBAL_INT:
        return None if item.command in _KEEP else int(M.MAV_MISSION_UNSUPPORTED)
    if item.frame == M.MAV_FRAME_MISSION:
        return None
    return int(M.MAV_MISSION_UNSUPPORTED_FRAME)


def px4_form(item: SimMissionItem) -> SimMissionItem:
    """The item as PX4 returns it on download (see the module docstring)."""
    auto = 0 if item.mission_type == FENCE else item.autocontinue
    if item.frame == M.MAV_FRAME_MISSION:
        return replace(item, current=0, autocontinue=auto)
    rules = _KEEP[item.command]
    raw = (item.param1, item.param2, item.param3, item.param4)
    p1, p2, p3, p4 = (0.0 if rule is None else rule(v) for rule, v in zip(rules, raw, strict=True))
    return replace(item, current=0, autocontinue=auto, frame=_GLOBAL_INT[item.frame], param1=p1, param2=p2,
                   param3=p3, param4=p4, z=_f32(item.z))  # fmt: skip
