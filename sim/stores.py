"""What a ground station reads from and writes to a vehicle's storage.

Step functions over `mavjet.sim.state.VehicleState`, one per message:
parameters (PARAM_*, with ArduPilot's and PX4's differing index and type
rules; the PARAM_VALUE itself is `mavjet.sim.telemetry.send_param`), the
mission/fence/rally lists (the transfer protocol itself is
`mavjet.sim.missions.MissionServer`; this is what ArduPilot does around it:
MIS_TOTAL/FENCE_TOTAL/RALLY_TOTAL broadcasts, texts, re-arming AUTO),
terrain data (`mavjet.sim.terrain`) and dataflash logs (`mavjet.sim.logs`).
"""

from __future__ import annotations

import math
from typing import Any

from pymavlink.dialects.v20 import ardupilotmega as mavlink2

from mavjet.sim import control, flight, health, params, telemetry
from mavjet.sim.consts import R
from mavjet.sim.logs import DISARM_TEXT
from mavjet.sim.missionitem import SimMissionItem
from mavjet.sim.missions import FENCE, MISSION, RALLY
from mavjet.sim.state import VehicleState, mission_view, mode_named, send, seq_offset, text
from mavjet.sim.terrain import TERRAIN_FRAMES


def on_param_request_list(v: VehicleState, msg: Any, partner: tuple[int, int], now: float, wall: float) -> None:
    for i in range(len(params.SPECS)):
        telemetry.send_param(v, i)


def on_param_request_read(v: VehicleState, msg: Any, partner: tuple[int, int], now: float, wall: float) -> None:
    idx = int(msg.param_index)
    if idx < 0:
        idx = params.INDEX.get(_param_name(msg.param_id), -1)
    if 0 <= idx < len(params.SPECS):
        # ArduPilot echoes the request's index: -1 (65535 on the wire) for a read by name
        telemetry.send_param(v, idx, telemetry.NO_INDEX if int(msg.param_index) < 0 and v.is_ap else idx)
    elif not v.is_ap:  # ArduPilot stays silent; PX4 says the name does not exist (capture px4/param_error)
        param_error(v, msg, partner, PARAM_ERROR_DOES_NOT_EXIST)


# MAV_PARAM_ERROR values PX4's mavlink_parameters.cpp answers with (`send_error`).
PARAM_ERROR_DOES_NOT_EXIST = 1
PARAM_ERROR_TYPE_MISMATCH = 7


def param_error(v: VehicleState, msg: Any, partner: tuple[int, int], error: int) -> None:
    """PX4's PARAM_ERROR to the asker: by name when asked by name (param_index -1; PX4 itself leaves the index
    unset, a recorded 28432), else by index."""
    by_index = int(msg.param_index) >= 0 if msg.get_type() == "PARAM_REQUEST_READ" else False
    send(v, R.MAVLink_param_error_message(partner[0], partner[1], b"" if by_index else _raw_id(msg.param_id),
                                          int(msg.param_index) if by_index else -1, error))


def on_param_set(v: VehicleState, msg: Any, partner: tuple[int, int], now: float, wall: float) -> None:
    name = _param_name(msg.param_id)
    spec = params.BY_NAME.get(name)
    if spec is None:
        if not v.is_ap:  # PX4: PARAM_ERROR DOES_NOT_EXIST (capture px4/param_error); ArduPilot ignores it
            param_error(v, msg, partner, PARAM_ERROR_DOES_NOT_EXIST)
        return
    value = float(msg.param_value)
    if not v.is_ap:
        # PX4's mavlink_parameters.cpp: the declared type must be the param's own (else PARAM_ERROR
        # TYPE_MISMATCH, capture px4/param_error); an INT32 gets the float's bytes copied in
        if int(msg.param_type) != (params.REAL32 if spec.type == params.REAL32 else params.INT32):
            param_error(v, msg, partner, PARAM_ERROR_TYPE_MISMATCH)
            return
        if spec.type != params.REAL32:
            value = params.from_bytewise(value)
    if not math.isfinite(value):
        return
    v.params[name] = params.coerce(spec, value)
    telemetry.send_param(v, params.INDEX[name], telemetry.NO_INDEX)  # to every link, as ArduPilot broadcasts a change


def on_mission_count(v: VehicleState, msg: Any, partner: tuple[int, int], now: float, wall: float) -> None:
    v.out.extend(v.missions.on_count(msg, partner, now))
    up = v.missions.upload
    if v.is_ap and up is not None and up.mission_type == MISSION and v.params["MIS_TOTAL"] > up.count:
        telemetry.notify_param(v, "MIS_TOTAL", float(up.count))  # AP_Mission truncates at MISSION_COUNT


def on_mission_item(v: VehicleState, msg: Any, partner: tuple[int, int], now: float, wall: float) -> None:
    replies = v.missions.on_item(msg, partner, now)
    v.out.extend(replies)
    up = v.missions.upload
    if v.is_ap and up is not None and up.mission_type == MISSION and len(up.items) > v.params["MIS_TOTAL"]:
        telemetry.notify_param(v, "MIS_TOTAL", float(len(up.items)))  # each stored item grows the total
    mission_committed(v)
    if v.is_ap:
        after_upload(v, replies)


def after_upload(v: VehicleState, replies: list[Any]) -> None:
    """What ArduPilot says after a completed upload: a text and the list's *_TOTAL parameter."""
    for r in replies:
        if r.get_type() != "MISSION_ACK":
            continue
        mtype = int(r.mission_type)
        if mtype == MISSION:
            telemetry.notify_param(v, "MIS_TOTAL", float(v.missions.count(MISSION)))
            if r.type == R.MAV_MISSION_ACCEPTED:
                text(v, R.MAV_SEVERITY_INFO, "Flight plan received")
        elif mtype == FENCE and r.type == R.MAV_MISSION_ACCEPTED:
            text(v, R.MAV_SEVERITY_DEBUG, "Fence Indexed OK")
            telemetry.notify_param(v, "FENCE_TOTAL", float(_fence_total(v.missions.items(FENCE))))
        elif mtype == RALLY and r.type == R.MAV_MISSION_ACCEPTED:
            telemetry.notify_param(v, "RALLY_TOTAL", float(len(v.missions.items(RALLY))))


def on_mission_request_list(v: VehicleState, msg: Any, partner: tuple[int, int], now: float, wall: float) -> None:
    v.out.extend(v.missions.on_request_list(msg, partner))


def on_mission_request(v: VehicleState, msg: Any, partner: tuple[int, int], now: float, wall: float) -> None:
    v.out.extend(v.missions.on_request(msg, partner))


def on_mission_clear_all(v: VehicleState, msg: Any, partner: tuple[int, int], now: float, wall: float) -> None:
    v.out.extend(v.missions.on_clear(msg, partner))
    mission_committed(v)


def on_mission_set_current(v: VehicleState, msg: Any, partner: tuple[int, int], now: float, wall: float) -> None:
    if flight.set_mission_current(v, int(msg.seq) + seq_offset(v)):
        telemetry.send_mission_current(v)


def on_mission_ack(v: VehicleState, msg: Any, partner: tuple[int, int], now: float, wall: float) -> None:
    return None  # ends a download; nothing is tracked for downloads


def on_log_message(v: VehicleState, msg: Any, partner: tuple[int, int], now: float, wall: float) -> None:
    if v.armed:  # ArduPilot: one STATUSTEXT, then silence until disarmed
        if v.logs.warn_armed(True):
            text(v, 3, DISARM_TEXT)
        return
    v.logs.warn_armed(False)
    mtype = msg.get_type()
    if mtype == "LOG_REQUEST_LIST":
        v.out.extend(v.logs.on_request_list(msg))
    elif mtype == "LOG_REQUEST_DATA":
        v.out.extend(v.logs.on_request_data(msg))
    else:
        v.out.extend(v.logs.on_request_end())


def on_terrain_data(v: VehicleState, msg: Any, partner: tuple[int, int], now: float, wall: float) -> None:
    if v.params["TERRAIN_ENABLE"]:
        v.terrain.on_data(msg)


def on_terrain_check(v: VehicleState, msg: Any, partner: tuple[int, int], now: float, wall: float) -> None:
    """Answered at once for that point (AP_Terrain::handle_terrain_check); a new block starts loading."""
    if v.flavour.name != "ardupilot":
        return  # PX4 has no terrain protocol (and refuses terrain frames)
    lat, lon = int(msg.lat), int(msg.lon)
    if not v.params["TERRAIN_ENABLE"]:  # no cache allocated: no data, nothing pending
        send(v, mavlink2.MAVLink_terrain_report_message(lat, lon, 0, 0.0, 0.0, 0, 0))
        return
    v.terrain_in_use = True
    send(v, v.terrain.report(lat, lon, home=health.terrain_home(v), rel_alt_m=v.alt_m))


def mission_committed(v: VehicleState) -> None:
    if MISSION in v.missions.changed:
        v.missions.changed.discard(MISSION)
        v.mission_seq = 1
        v.item_started = False
        v.terrain.set_points(mission_view(v)[1:])
        # AP_Arming::terrain_database_required: the mission holds terrain-frame items.
        v.terrain_required = any(int(it.frame) in TERRAIN_FRAMES for it in mission_view(v)[1:])
        v.terrain_in_use = v.terrain_in_use or not v.terrain.points_done
        v.mission_state = R.MISSION_STATE_NOT_STARTED if len(mission_view(v)) > 1 else R.MISSION_STATE_NO_MISSION
        if v.fmode.behaviour == "auto" and len(mission_view(v)) <= 1:
            control.enter_mode(v, mode_named(v, v.flavour.hold), "mission_cleared")
    v.missions.changed.discard(FENCE)


def _fence_total(items: list[SimMissionItem]) -> int:
    """FENCE_TOTAL as ArduPilot's fence store counts it: one header per polygon, its vertices, one per
    circle, and an end marker (a 4-vertex inclusion polygon and one circle read FENCE_TOTAL 7)."""
    if not items:
        return 0
    polygons = 0
    left = 0
    for it in items:
        if it.command in (R.MAV_CMD_NAV_FENCE_POLYGON_VERTEX_INCLUSION, R.MAV_CMD_NAV_FENCE_POLYGON_VERTEX_EXCLUSION):
            if left <= 0:
                polygons += 1
                left = max(round(it.param1), 1)
            left -= 1
    return len(items) + polygons + 1


def _param_name(raw: Any) -> str:
    if isinstance(raw, bytes):
        raw = raw.decode("ascii", "replace")
    return str(raw).split("\0", 1)[0]


def _raw_id(raw: Any) -> bytes:
    return (raw if isinstance(raw, bytes) else str(raw).encode("ascii", "replace")).split(b"\0", 1)[0]
