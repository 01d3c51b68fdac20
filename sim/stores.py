"""What a ground station reads from and writes to a vehicle model's storage.

Part of `mavjet.sim.model.VehicleModel`, which keeps the state and dispatches the
messages here: parameters (PARAM_*, with ArduPilot's and PX4's differing
index and type rules), the mission/fence/rally lists (the transfer protocol
itself is `mavjet.sim.missions.MissionServer`; this is what ArduPilot does around
it: MIS_TOTAL/FENCE_TOTAL/RALLY_TOTAL broadcasts, texts, re-arming AUTO),
terrain data (`mavjet.sim.terrain`) and dataflash logs (`mavjet.sim.logs`). Functions over
the model, not a mixin: see `mavjet.sim.commands`.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Final

from pymavlink.dialects.v20 import ardupilotmega as mavlink2

from mavjet.sim import control, flight, params, telemetry
from mavjet.sim.consts import R
from mavjet.sim.logs import DISARM_TEXT
from mavjet.sim.missions import FENCE, MISSION, RALLY, SimMissionItem
from mavjet.sim.terrain import TERRAIN_FRAMES

if TYPE_CHECKING:
    from mavjet.sim.model import VehicleModel

NO_INDEX: Final = 65535  # PARAM_VALUE.param_index ArduPilot sends for reads by name, sets and broadcasts


def on_param_request_list(v: VehicleModel, msg: Any, partner: tuple[int, int], now: float, wall: float) -> None:
    for i in range(len(params.SPECS)):
        send_param(v, i)


def on_param_request_read(v: VehicleModel, msg: Any, partner: tuple[int, int], now: float, wall: float) -> None:
    idx = int(msg.param_index)
    if idx < 0:
        idx = params.INDEX.get(_param_name(msg.param_id), -1)
    if 0 <= idx < len(params.SPECS):
        # ArduPilot echoes the request's index: -1 (65535 on the wire) for a read by name
        send_param(v, idx, NO_INDEX if int(msg.param_index) < 0 and v._is_ap else idx)


def on_param_set(v: VehicleModel, msg: Any, partner: tuple[int, int], now: float, wall: float) -> None:
    name = _param_name(msg.param_id)
    spec = params.BY_NAME.get(name)
    if spec is None:
        return  # ArduPilot ignores unknown names
    value = float(msg.param_value)
    if not v._is_ap:
        # PX4's mavlink_parameters.cpp: the declared type must be the param's own (else "param types
        # mismatch", no answer); an INT32 gets the float's bytes copied in
        if int(msg.param_type) != (params.REAL32 if spec.type == params.REAL32 else params.INT32):
            return
        if spec.type != params.REAL32:
            value = params.from_bytewise(value)
    if not math.isfinite(value):
        return
    v.params[name] = params.coerce(spec, value)
    send_param(v, params.INDEX[name], NO_INDEX)  # to every link, as ArduPilot broadcasts a change


def send_param(v: VehicleModel, idx: int, wire_index: int | None = None) -> None:
    spec = params.SPECS[idx]
    index = idx if wire_index is None else wire_index
    value, ptype = v.params[spec.name], spec.type
    if not v._is_ap:
        # PX4's MavlinkParametersManager::send_param: always the param's own index, INT32 or REAL32 only,
        # an INT32's bytes copied into the float (MAV_PROTOCOL_CAPABILITY_PARAM_ENCODE_BYTEWISE)
        index = idx
        if ptype != params.REAL32:
            value, ptype = params.to_bytewise(value), params.INT32
    v._send(R.MAVLink_param_value_message(spec.name.encode(), value, ptype, len(params.SPECS), index))


def notify_param(v: VehicleModel, name: str, value: float) -> None:
    """An unsolicited PARAM_VALUE (index 65535) when the vehicle changes a parameter itself."""
    if v.params.get(name) != value:
        v.params[name] = value
        send_param(v, params.INDEX[name], NO_INDEX)


def on_mission_count(v: VehicleModel, msg: Any, partner: tuple[int, int], now: float, wall: float) -> None:
    v.out.extend(v.missions.on_count(msg, partner, now))
    up = v.missions.upload
    if v._is_ap and up is not None and up.mission_type == MISSION and v.params["MIS_TOTAL"] > up.count:
        notify_param(v, "MIS_TOTAL", float(up.count))  # AP_Mission truncates at MISSION_COUNT


def on_mission_item(v: VehicleModel, msg: Any, partner: tuple[int, int], now: float, wall: float) -> None:
    replies = v.missions.on_item(msg, partner, now)
    v.out.extend(replies)
    up = v.missions.upload
    if v._is_ap and up is not None and up.mission_type == MISSION and len(up.items) > v.params["MIS_TOTAL"]:
        notify_param(v, "MIS_TOTAL", float(len(up.items)))  # each stored item grows the total
    mission_committed(v)
    if v._is_ap:
        after_upload(v, replies)


def after_upload(v: VehicleModel, replies: list[Any]) -> None:
    """What ArduPilot says after a completed upload: a text and the list's *_TOTAL parameter."""
    for r in replies:
        if r.get_type() != "MISSION_ACK":
            continue
        mtype = int(r.mission_type)
        if mtype == MISSION:
            notify_param(v, "MIS_TOTAL", float(v.missions.count(MISSION)))
            if r.type == R.MAV_MISSION_ACCEPTED:
                v._text(R.MAV_SEVERITY_INFO, "Flight plan received")
        elif mtype == FENCE and r.type == R.MAV_MISSION_ACCEPTED:
            v._text(R.MAV_SEVERITY_DEBUG, "Fence Indexed OK")
            notify_param(v, "FENCE_TOTAL", float(_fence_total(v.missions.items(FENCE))))
        elif mtype == RALLY and r.type == R.MAV_MISSION_ACCEPTED:
            notify_param(v, "RALLY_TOTAL", float(len(v.missions.items(RALLY))))


def on_mission_request_list(v: VehicleModel, msg: Any, partner: tuple[int, int], now: float, wall: float) -> None:
    v.out.extend(v.missions.on_request_list(msg, partner))


def on_mission_request(v: VehicleModel, msg: Any, partner: tuple[int, int], now: float, wall: float) -> None:
    v.out.extend(v.missions.on_request(msg, partner))


def on_mission_clear_all(v: VehicleModel, msg: Any, partner: tuple[int, int], now: float, wall: float) -> None:
    v.out.extend(v.missions.on_clear(msg, partner))
    mission_committed(v)


def on_mission_set_current(v: VehicleModel, msg: Any, partner: tuple[int, int], now: float, wall: float) -> None:
    if flight.set_mission_current(v, int(msg.seq) + v._seq_offset):
        telemetry.send_mission_current(v)


def on_mission_ack(v: VehicleModel, msg: Any, partner: tuple[int, int], now: float, wall: float) -> None:
    return None  # ends a download; nothing is tracked for downloads


def on_log_message(v: VehicleModel, msg: Any, partner: tuple[int, int], now: float, wall: float) -> None:
    if v.armed:  # ArduPilot: one STATUSTEXT, then silence until disarmed
        if v.logs.warn_armed(True):
            v._text(3, DISARM_TEXT)
        return
    v.logs.warn_armed(False)
    mtype = msg.get_type()
    if mtype == "LOG_REQUEST_LIST":
        v.out.extend(v.logs.on_request_list(msg))
    elif mtype == "LOG_REQUEST_DATA":
        v.out.extend(v.logs.on_request_data(msg))
    else:
        v.out.extend(v.logs.on_request_end())


def on_terrain_data(v: VehicleModel, msg: Any, partner: tuple[int, int], now: float, wall: float) -> None:
    if v.params["TERRAIN_ENABLE"]:
        v.terrain.on_data(msg)


def on_terrain_check(v: VehicleModel, msg: Any, partner: tuple[int, int], now: float, wall: float) -> None:
    """Answered at once for that point (AP_Terrain::handle_terrain_check); a new block starts loading."""
    if v.flavour.name != "ardupilot":
        return  # PX4 has no terrain protocol (and refuses terrain frames)
    lat, lon = int(msg.lat), int(msg.lon)
    if not v.params["TERRAIN_ENABLE"]:  # no cache allocated: no data, nothing pending
        v._send(mavlink2.MAVLink_terrain_report_message(lat, lon, 0, 0.0, 0.0, 0, 0))
        return
    v._terrain_in_use = True
    v._send(v.terrain.report(lat, lon, home=terrain_home(v), rel_alt_m=v.alt_m))


def terrain_position(v: VehicleModel) -> tuple[int, int] | None:
    return (round(v.lat_deg * 1e7), round(v.lon_deg * 1e7)) if v.position_ok else None


def terrain_home(v: VehicleModel) -> tuple[int, int] | None:
    return None if v.home is None else (round(v.home[0] * 1e7), round(v.home[1] * 1e7))


def mission_committed(v: VehicleModel) -> None:
    if MISSION in v.missions.changed:
        v.missions.changed.discard(MISSION)
        v.mission_seq = 1
        v.item_started = False
        v.terrain.set_points(v._mission()[1:])
        # AP_Arming::terrain_database_required: the mission holds terrain-frame items.
        v._terrain_required = any(int(it.frame) in TERRAIN_FRAMES for it in v._mission()[1:])
        v._terrain_in_use = v._terrain_in_use or not v.terrain.points_done
        v.mission_state = R.MISSION_STATE_NOT_STARTED if len(v._mission()) > 1 else R.MISSION_STATE_NO_MISSION
        if v.fmode.behaviour == "auto" and len(v._mission()) <= 1:
            control.enter_mode(v, v._mode_or_die(v.flavour.hold), "mission_cleared")
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
