"""What a vehicle says unasked or on request: streamed telemetry, home, identity, parameter values.

Step functions over `mavjet.sim.state.VehicleState` that put messages in its
outbox: `mavjet.sim.streams.Schedule` decides when each stream is due and
`emit(s, msg_id)` produces it. Hot streams go out as `(Packer, values)` for
`mavjet.sim.encoder`; the rest as pymavlink messages. HEARTBEAT's base_mode
and system_status follow ArduCopter's GCS_MAVLINK_Copter and PX4's
mode_util as recorded. Also PARAM_VALUE (ArduPilot's and PX4's index and
type rules) and the link-level inputs that only touch telemetry (HEARTBEAT,
TIMESYNC, REQUEST_DATA_STREAM). The lowest of the step modules: it reads
the state and the checks' verdicts (`mavjet.sim.health`) and changes
nothing but home and the outbox.
"""

from __future__ import annotations

import math
from typing import Any, Final

from mavjet.sim import encoder as enc
from mavjet.sim import health, params, streams
from mavjet.sim.consts import PX4_MAIN_AUTO, R
from mavjet.sim.missionitem import SimMissionItem
from mavjet.sim.state import VehicleState, mission_view, send, seq_offset

NO_INDEX: Final = 65535  # PARAM_VALUE.param_index ArduPilot sends for reads by name, sets and broadcasts

# ArduCopter's HEARTBEAT sets GUIDED_ENABLED while its horizontal position controller runs: always in
# GUIDED and LAND (seen after a LAND's disarm too), in the other position modes only while armed (RTL
# reads 0x51 once it has landed and disarmed), and during BOOT (0x59 before "ArduPilot Ready").
_AP_GUIDED_ALWAYS: Final = frozenset({"GUIDED", "LAND"})
_AP_GUIDED_ARMED: Final = frozenset({"AUTO", "RTL", "LOITER", "POSHOLD", "BRAKE", "SMART_RTL"})
_AP_BOOT_BASE_MODE: Final = 0x59
_PX4_MANUAL_MAINS: Final = frozenset({1, 2, 3, 7})  # MANUAL, ALTCTL, POSCTL, STABILIZED

_SENSORS: Final[int] = (
    R.MAV_SYS_STATUS_SENSOR_3D_GYRO
    | R.MAV_SYS_STATUS_SENSOR_3D_ACCEL
    | R.MAV_SYS_STATUS_SENSOR_3D_MAG
    | R.MAV_SYS_STATUS_SENSOR_ABSOLUTE_PRESSURE
    | R.MAV_SYS_STATUS_SENSOR_GPS
    | R.MAV_SYS_STATUS_SENSOR_ANGULAR_RATE_CONTROL
    | R.MAV_SYS_STATUS_SENSOR_ATTITUDE_STABILIZATION
    | R.MAV_SYS_STATUS_SENSOR_YAW_POSITION
    | R.MAV_SYS_STATUS_SENSOR_Z_ALTITUDE_CONTROL
    | R.MAV_SYS_STATUS_SENSOR_XY_POSITION_CONTROL
    | R.MAV_SYS_STATUS_SENSOR_MOTOR_OUTPUTS
    | R.MAV_SYS_STATUS_AHRS
    | R.MAV_SYS_STATUS_SENSOR_BATTERY
    | R.MAV_SYS_STATUS_PREARM_CHECK
)


def on_heartbeat(v: VehicleState, msg: Any, partner: tuple[int, int], now: float, wall: float) -> None:
    return None  # ground stations' heartbeats need no answer


def on_timesync(v: VehicleState, msg: Any, partner: tuple[int, int], now: float, wall: float) -> None:
    if msg.tc1 == 0:
        send(v, R.MAVLink_timesync_message(int((now - v.boot_at) * 1e9), msg.ts1))


def on_request_data_stream(v: VehicleState, msg: Any, partner: tuple[int, int], now: float, wall: float) -> None:
    v.schedule.request_stream(int(msg.req_stream_id), float(msg.req_message_rate), bool(msg.start_stop), now)


def set_home(v: VehicleState, lat: float, lon: float, amsl: float) -> None:
    v.home = (lat, lon, amsl)
    v.missions.home_item = SimMissionItem(
        seq=0, frame=R.MAV_FRAME_GLOBAL, command=R.MAV_CMD_NAV_WAYPOINT, x=round(lat * 1e7), y=round(lon * 1e7), z=amsl
    )
    send(v, home_position(v))


def send_origin(v: VehicleState) -> None:
    if v.flavour.name == "ardupilot":
        send(v, R.MAVLink_gps_global_origin_message(
            round(v.lat_deg * 1e7), round(v.lon_deg * 1e7), round(v.alt_amsl_m * 1000), unix_us(v),
        ))  # fmt: skip


def home_position(v: VehicleState) -> Any:
    h = v.home or (0.0, 0.0, 0.0)
    return R.MAVLink_home_position_message(
        round(h[0] * 1e7), round(h[1] * 1e7), round(h[2] * 1000), 0.0, 0.0, 0.0, [1.0, 0.0, 0.0, 0.0], 0.0, 0.0, 0.0,
        unix_us(v),
    )  # fmt: skip


def unix_us(v: VehicleState) -> int:
    return int((v.opts.epoch_unix_s + v.now) * 1e6) if v.gps_fix else 0


def send_param(v: VehicleState, idx: int, wire_index: int | None = None) -> None:
    spec = params.SPECS[idx]
    index = idx if wire_index is None else wire_index
    value, ptype = v.params[spec.name], spec.type
    if not v.is_ap:
        # PX4's MavlinkParametersManager::send_param: always the param's own index, INT32 or REAL32 only,
        # an INT32's bytes copied into the float (MAV_PROTOCOL_CAPABILITY_PARAM_ENCODE_BYTEWISE)
        index = idx
        if ptype != params.REAL32:
            value, ptype = params.to_bytewise(value), params.INT32
    send(v, R.MAVLink_param_value_message(spec.name.encode(), value, ptype, len(params.SPECS), index))


def notify_param(v: VehicleState, name: str, value: float) -> None:
    """An unsolicited PARAM_VALUE (index 65535) when the vehicle changes a parameter itself."""
    if v.params.get(name) != value:
        v.params[name] = value
        send_param(v, params.INDEX[name], NO_INDEX)


def send_mission_current(v: VehicleState) -> None:
    emit(v, streams.MISSION_CURRENT)


def send_requested(v: VehicleState, msg_id: int) -> None:
    if msg_id == R.MAVLINK_MSG_ID_AUTOPILOT_VERSION:
        send(v, autopilot_version(v))
    else:
        emit(v, msg_id, force=True)


def firmware_string(v: VehicleState) -> str:
    """The version text both autopilots print at boot."""
    maj, mnr, pat = v.flavour.version
    name = "ArduCopter" if v.flavour.name == "ardupilot" else "PX4"
    dev = "-dev" if v.flavour.name == "ardupilot" else ""
    return f"{name} V{maj}.{mnr}.{pat}{dev} (mavjet sim)"


def autopilot_version(v: VehicleState) -> Any:
    maj, mnr, pat = v.flavour.version
    caps = (
        R.MAV_PROTOCOL_CAPABILITY_MISSION_FLOAT
        | R.MAV_PROTOCOL_CAPABILITY_PARAM_FLOAT
        | R.MAV_PROTOCOL_CAPABILITY_MISSION_INT
        | R.MAV_PROTOCOL_CAPABILITY_COMMAND_INT
        | R.MAV_PROTOCOL_CAPABILITY_SET_POSITION_TARGET_GLOBAL_INT
        | R.MAV_PROTOCOL_CAPABILITY_MAVLINK2
        | R.MAV_PROTOCOL_CAPABILITY_MISSION_FENCE
        | R.MAV_PROTOCOL_CAPABILITY_MISSION_RALLY
    )
    # the recorded ArduCopter master reports type DEV (0): flight_sw_version 0x04070000
    kind = R.FIRMWARE_VERSION_TYPE_DEV if v.flavour.name == "ardupilot" else R.FIRMWARE_VERSION_TYPE_OFFICIAL
    sw = (maj << 24) | (mnr << 16) | (pat << 8) | kind
    uid = 0x4D4A_5349_0000_0000 | (v.opts.sysid & 0xFFFF_FFFF)
    uid2 = list(f"mavjet-sim-{v.opts.sysid:07d}".encode()[:18].ljust(18, b"\0"))
    return R.MAVLink_autopilot_version_message(
        caps, sw, 0, 0, 0, list(b"6d0b0a1c"), [0] * 8, [0] * 8, 0x1209, 0x5740, uid, uid2
    )


def emit(v: VehicleState, msg_id: int, *, force: bool = False) -> None:
    emitter = _EMITTERS.get(msg_id)
    if emitter is not None:
        emitter(v, force)


# One function per streamed message: the tick loop calls these tens of thousands of
# times a second at load-test sizes, so they avoid properties and module lookups.
def _e_global_position_int(v: VehicleState, force: bool) -> None:
    alt = v.alt_m
    v.out.append((_P_GPI, (
        int((v.now - v.boot_at) * 1000), round(v.lat_deg * 1e7), round(v.lon_deg * 1e7),
        round((v.ground_amsl_m + alt) * 1000), round(alt * 1000), round(v.vn * 100), round(v.ve * 100),
        round(v.vd * 100), round(v.heading_deg * 100) % 36000,
    )))  # fmt: skip


def _e_attitude(v: VehicleState, force: bool) -> None:
    gs = math.hypot(v.vn, v.ve)
    pitch = -0.02 * (gs if gs < 15.0 else 15.0)  # nose down when moving, roughly
    yaw = math.radians(v.heading_deg)
    if yaw > math.pi:
        yaw -= 2 * math.pi
    v.out.append((_P_ATT, (int((v.now - v.boot_at) * 1000), v.roll, pitch, yaw, 0.0, 0.0, 0.0)))


def _e_heartbeat(v: VehicleState, force: bool) -> None:
    v.out.append((enc.HEARTBEAT, _heartbeat_values(v)))


def _e_sys_status(v: VehicleState, force: bool) -> None:
    health = _SENSORS
    if not v.gps_fix:
        health &= ~R.MAV_SYS_STATUS_SENSOR_GPS
    if not v.ekf_ok:
        health &= ~(R.MAV_SYS_STATUS_AHRS | R.MAV_SYS_STATUS_PREARM_CHECK)
    if v.battery_fs:
        health &= ~R.MAV_SYS_STATUS_SENSOR_BATTERY
    v.out.append((enc.SYS_STATUS, (
        _SENSORS, _SENSORS, health, 180, round(v.battery_v * 1000), round(v.current_a * 100),
        round(v.battery_pct), 0, v.stats.bad_frames_in & 0xFFFF, 0, 0, 0, 0, 0, 0, 0,
    )))  # fmt: skip


def _e_gps_raw_int(v: VehicleState, force: bool) -> None:
    fix = v.gps_fix
    amsl_mm = round((v.ground_amsl_m + v.alt_m) * 1000)
    v.out.append((enc.GPS_RAW_INT, (
        unix_us(v), 3 if fix else 1, round(v.lat_deg * 1e7), round(v.lon_deg * 1e7), amsl_mm,
        121 if fix else 9999, 200 if fix else 9999, round(math.hypot(v.vn, v.ve) * 100),
        round(v.heading_deg * 100) % 36000, 12 if fix else 0, amsl_mm + 22_000, 300, 500, 200, 0, 0,
    )))  # fmt: skip


def _e_vfr_hud(v: VehicleState, force: bool) -> None:
    gs = math.hypot(v.vn, v.ve)
    throttle = 0 if not v.armed else (12 if v.landed else 48)
    v.out.append((enc.VFR_HUD, (
        gs, gs, round(v.heading_deg) % 360, throttle, v.ground_amsl_m + v.alt_m, -v.vd,
    )))  # fmt: skip


def _e_extended_sys_state(v: VehicleState, force: bool) -> None:
    # ArduCopter reports vtol_state MAV_VTOL_STATE_MC (3); PX4 leaves a non-VTOL UNDEFINED (0)
    v.out.append((enc.EXTENDED_SYS_STATE, (v.vtol_state, v.landed_state)))


def _e_terrain_request(v: VehicleState, force: bool) -> None:
    if v.params["TERRAIN_ENABLE"] and v.flavour.name == "ardupilot":
        v.terrain_in_use = True
        msg = v.terrain.request(health.terrain_position(v), v.now)
        if msg is not None:
            v.out.append(msg)


def _e_terrain_report(v: VehicleState, force: bool) -> None:
    pos = health.terrain_position(v)
    if v.params["TERRAIN_ENABLE"] and pos is not None and v.flavour.name == "ardupilot":
        v.terrain_in_use = True
        v.out.append(v.terrain.report(*pos, home=health.terrain_home(v), rel_alt_m=v.alt_m))


def _e_system_time(v: VehicleState, force: bool) -> None:
    v.out.append((enc.SYSTEM_TIME, (unix_us(v), int((v.now - v.boot_at) * 1000))))


def _e_battery_status(v: VehicleState, force: bool) -> None:
    mv = round(v.battery_v * 1000)
    charge = (
        R.MAV_BATTERY_CHARGE_STATE_OK,
        R.MAV_BATTERY_CHARGE_STATE_LOW,
        R.MAV_BATTERY_CHARGE_STATE_CRITICAL,
    )[health.battery_level(v)]
    v.out.append(R.MAVLink_battery_status_message(
        0, R.MAV_BATTERY_FUNCTION_ALL, R.MAV_BATTERY_TYPE_LIPO, 32767, [mv] + [65535] * 9,
        round(v.current_a * 100), round(v.consumed_mah), round(v.consumed_mah * v.battery_v * 0.036),
        round(v.battery_pct), 0, charge, [0, 0, 0, 0], 0, 0,
    ))  # fmt: skip


def _e_home_position(v: VehicleState, force: bool) -> None:
    if v.home is not None:
        v.out.append(home_position(v))


def _e_mission_current(v: VehicleState, force: bool) -> None:
    n = len(mission_view(v))  # with the home (or PX4's placeholder)
    state = v.mission_state if n > 1 else R.MISSION_STATE_NO_MISSION
    in_mission = 1 if v.fmode.behaviour == "auto" else 2
    v.out.append((enc.MISSION_CURRENT, (v.mission_seq - seq_offset(v), n - 1, state, in_mission)))


def _e_fence_status(v: VehicleState, force: bool) -> None:
    f = v.fence
    if v.params["FENCE_ENABLE"] or force or f.breach_count:
        v.out.append((enc.FENCE_STATUS, (
            1 if f.breach_type else 0, f.breach_count, f.breach_type, f.breach_time_ms, R.FENCE_MITIGATE_NONE,
        )))  # fmt: skip


def _heartbeat_values(v: VehicleState) -> tuple[int, ...]:
    if v.flavour.name == "ardupilot":
        return _heartbeat_ardupilot(v)
    # PX4's HEARTBEAT stream from vehicle_control_mode (mode_util::getVehicleControlMode, multicopter):
    # manual modes manual+attitude, AUTO.* auto (with stabilize and guided), OFFBOARD none without setpoints;
    # system_status from the arming state only: ACTIVE (CRITICAL in failsafe) armed, STANDBY disarmed.
    base = R.MAV_MODE_FLAG_CUSTOM_MODE_ENABLED
    main = (v.fmode.custom_mode >> 16) & 0xFF
    if main in _PX4_MANUAL_MAINS:
        base |= R.MAV_MODE_FLAG_MANUAL_INPUT_ENABLED | R.MAV_MODE_FLAG_STABILIZE_ENABLED
    elif main == PX4_MAIN_AUTO:
        base |= R.MAV_MODE_FLAG_AUTO_ENABLED | R.MAV_MODE_FLAG_STABILIZE_ENABLED | R.MAV_MODE_FLAG_GUIDED_ENABLED
    if v.armed:
        base |= R.MAV_MODE_FLAG_SAFETY_ARMED
        status = R.MAV_STATE_CRITICAL if v.failsafe else R.MAV_STATE_ACTIVE
    else:
        status = R.MAV_STATE_STANDBY
    return (R.MAV_TYPE_QUADROTOR, v.flavour.autopilot, base, v.fmode.custom_mode, status, 3)


def _heartbeat_ardupilot(v: VehicleState) -> tuple[int, ...]:
    """GCS_MAVLINK_Copter::base_mode and vehicle_system_status, as a real ArduCopter reports them."""
    name = v.fmode.name
    if not v.initialised:
        base, status = _AP_BOOT_BASE_MODE, R.MAV_STATE_BOOT
    else:
        base = (R.MAV_MODE_FLAG_CUSTOM_MODE_ENABLED | R.MAV_MODE_FLAG_STABILIZE_ENABLED
                | R.MAV_MODE_FLAG_MANUAL_INPUT_ENABLED)  # fmt: skip
        if name in _AP_GUIDED_ALWAYS or (v.armed and name in _AP_GUIDED_ARMED):
            base |= R.MAV_MODE_FLAG_GUIDED_ENABLED
        if v.armed:
            base |= R.MAV_MODE_FLAG_SAFETY_ARMED
        # failsafe first, then land_complete: armed on the ground is still STANDBY, ACTIVE once flying
        if v.failsafe:
            status = R.MAV_STATE_CRITICAL
        elif v.landed:
            status = R.MAV_STATE_STANDBY
        else:
            status = R.MAV_STATE_ACTIVE
    return (R.MAV_TYPE_QUADROTOR, v.flavour.autopilot, base, v.fmode.custom_mode, status, 3)


_P_GPI: Final = enc.GLOBAL_POSITION_INT
_P_ATT: Final = enc.ATTITUDE

_EMITTERS: Final[dict[int, Any]] = {
    streams.GLOBAL_POSITION_INT: _e_global_position_int,
    streams.ATTITUDE: _e_attitude,
    streams.HEARTBEAT: _e_heartbeat,
    streams.SYS_STATUS: _e_sys_status,
    streams.GPS_RAW_INT: _e_gps_raw_int,
    streams.VFR_HUD: _e_vfr_hud,
    streams.EXTENDED_SYS_STATE: _e_extended_sys_state,
    streams.SYSTEM_TIME: _e_system_time,
    streams.TERRAIN_REQUEST: _e_terrain_request,
    streams.TERRAIN_REPORT: _e_terrain_report,
    streams.BATTERY_STATUS: _e_battery_status,
    streams.HOME_POSITION: _e_home_position,
    streams.MISSION_CURRENT: _e_mission_current,
    streams.FENCE_STATUS: _e_fence_status,
}
