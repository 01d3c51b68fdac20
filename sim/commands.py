"""Commands a vehicle answers: COMMAND_LONG, COMMAND_INT and SET_MODE.

Step functions over `mavjet.sim.state.VehicleState`, the vehicle's command
desk: recognising retransmissions (answered again, not acted on twice),
results forced by `reject_next`, IN_PROGRESS answers and their final ACK
(the desk's memory is `state.CommandDesk`), and one function per MAV_CMD
returning the MAV_RESULT ArduPilot (or PX4's Commander) gives for the same
request, by way of the flight API (`mavjet.sim.control`).
"""

from __future__ import annotations

import math
from typing import Any, Final

from mavjet.sim import control, flight, streams, telemetry
from mavjet.sim.consts import ACCEPTED, DENIED, FAILED, IN_PROGRESS, TEMP_REJECTED, UNSUPPORTED, R
from mavjet.sim.state import ExecutedCommand, Pending, Sent, VehicleState, ack, send, seq_offset

__all__ = ["COMMANDS", "FLIGHT_COMMANDS", "ExecutedCommand", "command", "flush_after_ack", "poll_pending"]

FORCE_MAGIC: Final = 21196  # COMPONENT_ARM_DISARM param2 that skips checks
MAX_EXECUTIONS: Final = 10_000  # the record keeps at least this many recent commands
# commands PX4's Commander answers TEMPORARILY_REJECTED when it denies the transition they ask for
_PX4_TRANSITIONS: Final = frozenset({
    R.MAV_CMD_COMPONENT_ARM_DISARM, R.MAV_CMD_DO_SET_MODE, R.MAV_CMD_NAV_RETURN_TO_LAUNCH, R.MAV_CMD_NAV_TAKEOFF,
    R.MAV_CMD_DO_REPOSITION,
})  # fmt: skip


def on_set_mode(v: VehicleState, msg: Any, partner: tuple[int, int], now: float, wall: float) -> None:
    v.external_control = True
    result = control.set_mode_raw(v, float(msg.base_mode), int(msg.custom_mode), None)
    ack(v, R.MAVLINK_MSG_ID_SET_MODE, result, partner)


def on_command_long(v: VehicleState, msg: Any, partner: tuple[int, int], now: float, wall: float) -> None:
    if msg.target_component not in (0, v.compid):
        return
    p = (msg.param1, msg.param2, msg.param3, msg.param4, msg.param5, msg.param6, msg.param7)
    command(v, int(msg.command), p=p, frame=None, confirmation=int(msg.confirmation), partner=partner, now=now, wall=wall)


def on_command_int(v: VehicleState, msg: Any, partner: tuple[int, int], now: float, wall: float) -> None:
    if msg.target_component not in (0, v.compid):
        return
    p = (msg.param1, msg.param2, msg.param3, msg.param4, float(msg.x), float(msg.y), msg.z)
    command(v, int(msg.command), p=p, frame=int(msg.frame), confirmation=0, partner=partner, now=now, wall=wall)


def command(
    v: VehicleState,
    cmd: int,
    *,
    p: tuple[float, ...],
    frame: int | None,
    confirmation: int,
    partner: tuple[int, int],
    now: float,
    wall: float,
) -> None:
    v.stats.commands += 1
    prior = v.desk.sent.get(cmd)
    if (
        confirmation > 0
        and prior is not None
        and prior.params == p
        and wall - prior.wall <= v.opts.confirmation_window_s
    ):
        # a retransmission of a command already acted on: answer again, do not act twice
        v.stats.retransmits_recognised += 1
        prior.wall = wall
        ack(v, cmd, prior.result, partner, prior.progress)
        return
    forced = v.desk.forced.get(cmd)
    if forced:
        result = forced.popleft()
        if not forced:
            del v.desk.forced[cmd]
        v.stats.forced_results += 1
        v.desk.sent[cmd] = Sent(params=p, wall=wall, result=result)
        record(v,
            ExecutedCommand(command=cmd, params=p, time=now, result=result, confirmation=confirmation, frame=frame,
                            source=partner, executed=False)
        )  # fmt: skip
        ack(v, cmd, result, partner)
        return
    handler = COMMANDS.get(cmd)
    if handler is None:
        v.stats.unknown_commands += 1
        result = UNSUPPORTED
    else:
        if cmd in FLIGHT_COMMANDS:
            v.external_control = True
        result = handler(v, p, frame, partner, now)
        if result == FAILED and cmd in _PX4_TRANSITIONS and v.flavour.name == "px4":
            result = TEMP_REJECTED  # PX4's Commander answers a denied mode/arming transition this way
    slow = result == ACCEPTED and cmd in v.opts.in_progress_commands
    if slow:
        due = None if cmd == R.MAV_CMD_NAV_TAKEOFF else now + v.opts.in_progress_delay_s
        v.desk.pending.append(Pending(command=cmd, partner=partner, due=due, last_progress=now))
        result = IN_PROGRESS
    v.desk.sent[cmd] = Sent(params=p, wall=wall, result=result)
    record(v,
        ExecutedCommand(command=cmd, params=p, time=now, result=result, confirmation=confirmation, frame=frame, source=partner)
    )
    ack(v, cmd, result, partner)
    flush_after_ack(v)
    if cmd == R.MAV_CMD_REQUEST_MESSAGE and result == ACCEPTED:
        telemetry.send_requested(v, int(p[0]))
    elif cmd == R.MAV_CMD_REQUEST_AUTOPILOT_CAPABILITIES and result == ACCEPTED:
        send(v, telemetry.autopilot_version(v))
    elif cmd == R.MAV_CMD_GET_MESSAGE_INTERVAL and result == ACCEPTED:
        iv = v.schedule.interval(int(p[0]))
        send(v, R.MAVLink_message_interval_message(int(p[0]), -1 if iv is None else int(iv * 1e6)))
    elif cmd == R.MAV_CMD_PREFLIGHT_REBOOT_SHUTDOWN and result == ACCEPTED:
        v.reboot_pending = True


def flush_after_ack(v: VehicleState) -> None:
    if v.desk.after_ack:
        v.out.extend(v.desk.after_ack)
        v.desk.after_ack.clear()


def record(v: VehicleState, ex: ExecutedCommand) -> None:
    v.executions.append(ex)
    if len(v.executions) > 2 * MAX_EXECUTIONS:
        del v.executions[:-MAX_EXECUTIONS]


def finish_pending(v: VehicleState, pend: Pending, result: int) -> None:
    v.desk.pending.remove(pend)
    sent = v.desk.sent.get(pend.command)
    if sent is not None and sent.result == IN_PROGRESS:
        sent.result = result
        sent.progress = 100 if result == ACCEPTED else 0
    ack(v, pend.command, result, pend.partner, 100 if result == ACCEPTED else 0)


def poll_pending(v: VehicleState, now: float) -> None:
    for pend in list(v.desk.pending):
        if pend.due is not None:
            if now >= pend.due:
                finish_pending(v, pend, pend.result)
            continue
        # takeoff: done when the climb is over, failed when it was abandoned
        if v.takeoff_alt_m is None:
            ok = v.armed and not v.landed
            finish_pending(v, pend, ACCEPTED if ok else FAILED)
        elif now - pend.last_progress >= 1.0:
            pend.last_progress = now
            progress = int(100 * v.alt_m / max(v.takeoff_alt_m, 0.1))
            sent = v.desk.sent.get(pend.command)
            if sent is not None:
                sent.progress = progress
            ack(v, pend.command, IN_PROGRESS, pend.partner, max(0, min(progress, 99)))


# --- one function per command: (v, params, frame, partner, now) -> MAV_RESULT
def cmd_arm_disarm(v: VehicleState, p: tuple[float, ...], frame: int | None, partner: tuple[int, int], now: float) -> int:
    force = round(p[1]) == FORCE_MAGIC
    if p[0] == 1.0:
        return control.arm(v, force=force)
    if p[0] == 0.0:
        return control.disarm(v, force=force)
    return DENIED


def cmd_takeoff(v: VehicleState, p: tuple[float, ...], frame: int | None, partner: tuple[int, int], now: float) -> int:
    if v.flavour.name == "px4":
        return control.takeoff_px4(v, float(p[6]))  # param7 above mean sea level
    return control.takeoff(v, float(p[6]))  # ArduPilot: param7 above home


def cmd_land(v: VehicleState, p: tuple[float, ...], frame: int | None, partner: tuple[int, int], now: float) -> int:
    return control.set_mode(v, v.flavour.land, reason="gcs_land")


def cmd_rtl(v: VehicleState, p: tuple[float, ...], frame: int | None, partner: tuple[int, int], now: float) -> int:
    return control.set_mode(v, v.flavour.rtl, reason="gcs_rtl")


def cmd_do_set_mode(v: VehicleState, p: tuple[float, ...], frame: int | None, partner: tuple[int, int], now: float) -> int:
    return control.set_mode_raw(v, p[0], round(p[1]), round(p[2]))


def cmd_reposition(v: VehicleState, p: tuple[float, ...], frame: int | None, partner: tuple[int, int], now: float) -> int:
    if frame is None:  # COMMAND_LONG: degrees in param5/6, altitude relative to home
        lat, lon, frame = p[4], p[5], R.MAV_FRAME_GLOBAL_RELATIVE_ALT
    else:
        lat, lon = p[4] / 1e7, p[5] / 1e7
    if not (-90.0 <= lat <= 90.0 and -180.0 <= lon <= 180.0) or (lat == 0.0 and lon == 0.0):
        return DENIED
    change_mode = int(p[1]) & R.MAV_DO_REPOSITION_FLAGS_CHANGE_MODE
    if v.flavour.name == "px4" and (not change_mode or int(p[1]) & ~1):
        return UNSUPPORTED  # PX4's commander: a reposition must ask for the mode switch, and only that
    if v.fmode.behaviour != "guided":
        if not change_mode and v.flavour.name == "ardupilot":
            return DENIED
        r = control.set_mode(v, v.flavour.guided, reason="gcs_reposition")
        if r != ACCEPTED:
            return FAILED
    # PX4's navigator takes z as an altitude above mean sea level whatever the frame (capture
    # tests/fixtures/px4/takeoff_and_reposition, navigator_main.cpp); ArduPilot honours the frame.
    alt = flight.rel_alt(v, float(p[6]), R.MAV_FRAME_GLOBAL if v.flavour.name == "px4" else frame)
    if not math.isfinite(alt):
        alt = v.alt_m
    if p[0] > 0:
        v.speed_m_s = float(p[0])
    return control.goto(v, lat, lon, alt)


def cmd_mission_start(v: VehicleState, p: tuple[float, ...], frame: int | None, partner: tuple[int, int], now: float) -> int:
    first = round(p[0])
    start = first + seq_offset(v) if first > 0 else 1  # the first item after the home
    result = control.set_mode(v, v.flavour.auto, reason="gcs_mission_start")
    if result != ACCEPTED:
        return result
    if first > 0 and not flight.set_mission_current(v, start):
        return FAILED
    if v.mission_state != R.MISSION_STATE_ACTIVE:
        flight.auto_start(v, start)
    return ACCEPTED


def cmd_reboot(v: VehicleState, p: tuple[float, ...], frame: int | None, partner: tuple[int, int], now: float) -> int:
    if round(p[0]) not in (1, 3):
        return UNSUPPORTED if round(p[0]) != 0 else ACCEPTED
    if v.armed:
        return FAILED
    return ACCEPTED  # the reboot happens once the ACK is out (reboot_pending)


def cmd_set_message_interval(v: VehicleState, p: tuple[float, ...], frame: int | None, partner: tuple[int, int], now: float) -> int:
    return ACCEPTED if v.schedule.set_interval(round(p[0]), float(p[1]), now) else FAILED


def cmd_get_message_interval(v: VehicleState, p: tuple[float, ...], frame: int | None, partner: tuple[int, int], now: float) -> int:
    return ACCEPTED if round(p[0]) in streams.STREAMABLE else FAILED


def cmd_request_message(v: VehicleState, p: tuple[float, ...], frame: int | None, partner: tuple[int, int], now: float) -> int:
    msg_id = round(p[0])
    if msg_id == R.MAVLINK_MSG_ID_AUTOPILOT_VERSION:
        return ACCEPTED
    if msg_id == streams.HOME_POSITION and v.home is None:
        return FAILED
    return ACCEPTED if msg_id in streams.STREAMABLE else FAILED


def cmd_capabilities(v: VehicleState, p: tuple[float, ...], frame: int | None, partner: tuple[int, int], now: float) -> int:
    return ACCEPTED


def cmd_set_mission_current(v: VehicleState, p: tuple[float, ...], frame: int | None, partner: tuple[int, int], now: float) -> int:
    if not flight.set_mission_current(v, round(p[0]) + seq_offset(v)):
        return FAILED
    telemetry.send_mission_current(v)
    return ACCEPTED


def cmd_change_speed(v: VehicleState, p: tuple[float, ...], frame: int | None, partner: tuple[int, int], now: float) -> int:
    if p[1] > 0:
        v.speed_m_s = float(p[1])
    return ACCEPTED


def cmd_set_home(v: VehicleState, p: tuple[float, ...], frame: int | None, partner: tuple[int, int], now: float) -> int:
    if round(p[0]) == 1:
        if not v.position_ok:
            return FAILED
        telemetry.set_home(v, v.lat_deg, v.lon_deg, v.alt_amsl_m)
        return ACCEPTED
    lat, lon = (p[4], p[5]) if frame is None else (p[4] / 1e7, p[5] / 1e7)
    if not (-90.0 <= lat <= 90.0 and -180.0 <= lon <= 180.0) or (lat == 0.0 and lon == 0.0):
        return DENIED
    telemetry.set_home(v, lat, lon, float(p[6]))
    return ACCEPTED


def cmd_fence_enable(v: VehicleState, p: tuple[float, ...], frame: int | None, partner: tuple[int, int], now: float) -> int:
    if round(p[0]) not in (0, 1):
        return UNSUPPORTED
    v.params["FENCE_ENABLE"] = float(round(p[0]))
    return ACCEPTED


def cmd_get_home(v: VehicleState, p: tuple[float, ...], frame: int | None, partner: tuple[int, int], now: float) -> int:
    if v.home is None:
        return FAILED
    send(v, telemetry.home_position(v))
    return ACCEPTED


COMMANDS: Final[dict[int, Any]] = {
    R.MAV_CMD_COMPONENT_ARM_DISARM: cmd_arm_disarm,
    R.MAV_CMD_NAV_TAKEOFF: cmd_takeoff,
    R.MAV_CMD_NAV_LAND: cmd_land,
    R.MAV_CMD_NAV_RETURN_TO_LAUNCH: cmd_rtl,
    R.MAV_CMD_DO_SET_MODE: cmd_do_set_mode,
    R.MAV_CMD_DO_REPOSITION: cmd_reposition,
    R.MAV_CMD_MISSION_START: cmd_mission_start,
    R.MAV_CMD_PREFLIGHT_REBOOT_SHUTDOWN: cmd_reboot,
    R.MAV_CMD_SET_MESSAGE_INTERVAL: cmd_set_message_interval,
    R.MAV_CMD_GET_MESSAGE_INTERVAL: cmd_get_message_interval,
    R.MAV_CMD_REQUEST_MESSAGE: cmd_request_message,
    R.MAV_CMD_REQUEST_AUTOPILOT_CAPABILITIES: cmd_capabilities,
    R.MAV_CMD_DO_SET_MISSION_CURRENT: cmd_set_mission_current,
    R.MAV_CMD_DO_CHANGE_SPEED: cmd_change_speed,
    R.MAV_CMD_DO_SET_HOME: cmd_set_home,
    R.MAV_CMD_DO_FENCE_ENABLE: cmd_fence_enable,
    R.MAV_CMD_GET_HOME_POSITION: cmd_get_home,
}

# commands that take the vehicle out of the built-in sortie's hands
FLIGHT_COMMANDS: Final = frozenset(
    {
        R.MAV_CMD_COMPONENT_ARM_DISARM,
        R.MAV_CMD_NAV_TAKEOFF,
        R.MAV_CMD_NAV_LAND,
        R.MAV_CMD_NAV_RETURN_TO_LAUNCH,
        R.MAV_CMD_DO_SET_MODE,
        R.MAV_CMD_DO_REPOSITION,
        R.MAV_CMD_MISSION_START,
    }
)
