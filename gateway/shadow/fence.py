"""Reported geofence and stream-rate specs in MAVLink terms. Pure.

A desired geofence (mavjet.drivers.mavlink.fence.Geofence) is two things on an
ArduPilot vehicle: FENCE mission items and parameters. `fence_to_json` turns
what was read back (items downloaded, PARAM_VALUEs) into the document shape
for `reported.geofence`.

A desired rate names a telemetry channel (or a MAVLink message) and a rate
in Hz; it is applied with MAV_CMD_SET_MESSAGE_INTERVAL.
"""

from __future__ import annotations

from typing import Any

from mavjet.drivers.mavlink.dialect import mavlink2
from mavjet.drivers.mavlink.fence import FENCE_ACTIONS
from mavjet.drivers.mavlink.mission import MissionItem
from mavjet.drivers.mavlink.plan import digest
from mavjet.gateway.shadow.document import RATE_CHANNELS


def fence_to_json(items: list[MissionItem] | tuple[MissionItem, ...], params: dict[str, float]) -> dict[str, Any]:
    """What the vehicle holds, in the desired document's shape (for `reported.geofence`)."""
    polygons: list[dict[str, Any]] = []
    circles: list[dict[str, Any]] = []
    poly_cmds = {
        mavlink2.MAV_CMD_NAV_FENCE_POLYGON_VERTEX_INCLUSION: True,
        mavlink2.MAV_CMD_NAV_FENCE_POLYGON_VERTEX_EXCLUSION: False,
    }
    circle_cmds = {
        mavlink2.MAV_CMD_NAV_FENCE_CIRCLE_INCLUSION: True,
        mavlink2.MAV_CMD_NAV_FENCE_CIRCLE_EXCLUSION: False,
    }
    k = 0
    seq = list(items)
    while k < len(seq):
        it = seq[k]
        if it.command in poly_cmds:
            n = max(1, int(it.param1))
            polygons.append(
                {"inclusion": poly_cmds[it.command], "points": [[v.x / 1e7, v.y / 1e7] for v in seq[k : k + n]]}
            )
            k += n
            continue
        if it.command in circle_cmds:
            circles.append(
                {"inclusion": circle_cmds[it.command], "center": [it.x / 1e7, it.y / 1e7], "radius_m": it.param1}
            )
        k += 1
    out: dict[str, Any] = {"polygons": polygons, "circles": circles, "digest": digest(seq)}
    if "FENCE_ENABLE" in params:
        out["enabled"] = bool(params["FENCE_ENABLE"])
    if "FENCE_ALT_MAX" in params:
        out["max_alt_m"] = params["FENCE_ALT_MAX"]
    if "FENCE_ACTION" in params:
        by_value = {v: k for k, v in FENCE_ACTIONS.items()}
        out["action"] = by_value.get(int(params["FENCE_ACTION"]), int(params["FENCE_ACTION"]))
    return out


def rate_message(channel: str) -> tuple[str, int] | None:
    """(message name, message id) for a rate channel or a MAVLink message name; None if unknown."""
    name = RATE_CHANNELS.get(channel, channel)
    msg_id = getattr(mavlink2, f"MAVLINK_MSG_ID_{name}", None)
    if not isinstance(msg_id, int):
        return None
    return name, msg_id


def interval_us(hz: float) -> int:
    return round(1e6 / hz)


def rate_matches(desired_hz: float, reported_hz: float, rel_tol: float = 0.02) -> bool:
    """Rates compare through their whole-microsecond interval, with a small tolerance."""
    a, b = interval_us(desired_hz), interval_us(reported_hz) if reported_hz > 0 else 0
    return b > 0 and abs(a - b) <= max(1, rel_tol * a)
