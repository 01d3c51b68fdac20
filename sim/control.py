"""Arming and flight modes: the flight API of a vehicle.

Step functions over `mavjet.sim.state.VehicleState` (the model exposes them
as `arm`, `disarm`, `set_mode`, `takeoff` and `goto` to ground-station
commands and the built-in sortie): ArduCopter's and PX4's arming rules and
the texts they print (the checks themselves are `mavjet.sim.health`),
mode-entry rules (ArduCopter accepts any mode while disarmed; PX4's
Commander checks a mode's requirements either way), DO_SET_MODE/SET_MODE
decoding for both flavours, and what entering a mode starts (RTL, AUTO).
"""

from __future__ import annotations

import math

from mavjet.sim import flight, health, telemetry
from mavjet.sim.consts import ACCEPTED, DENIED, FAILED, NAV_CMDS_MAX, PX4_MAIN_AUTO, UNSUPPORTED, R
from mavjet.sim.modes import Mode, px4_custom
from mavjet.sim.state import VehicleState, mission_view, mode_named, text


def arm(v: VehicleState, *, force: bool = False) -> int:
    if v.armed:
        return ACCEPTED
    if not v.initialised:  # the one refusal whose text ArduPilot sends before the ACK
        text(v, R.MAV_SEVERITY_CRITICAL, "Arm: System not initialised")
        return FAILED
    if not force and v.params["ARMING_CHECK"] != 0:
        reason = health.prearm_failure(v)
        if reason is not None:
            if v.flavour.name == "ardupilot":
                # ArduPilot's arming checks report "Arm: <reason>" after the COMMAND_ACK goes out
                # (the "PreArm: " form is only the periodic display, see `mavjet.sim.lifecycle.prearm_update`).
                arm_text = "Arm: " + reason.removeprefix("PreArm: ").removeprefix("Arm: ")
                v.statustexts.append((R.MAV_SEVERITY_CRITICAL, arm_text))
                v.desk.after_ack.append(
                    R.MAVLink_statustext_message(R.MAV_SEVERITY_CRITICAL, arm_text.encode()[:50], 0, 0)
                )
            else:
                text(v, R.MAV_SEVERITY_CRITICAL, reason)
            return FAILED
    v.armed = True
    v.landed = v.alt_m <= 0.05
    v.landed_since = v.now
    if v.position_ok:  # ArduPilot re-sets home (and re-sends the EKF origin) at every arming
        telemetry.send_origin(v)
        telemetry.set_home(v, v.lat_deg, v.lon_deg, v.alt_amsl_m)
    text(v, R.MAV_SEVERITY_INFO, "Arming motors")
    return ACCEPTED


def disarm(v: VehicleState, *, force: bool = False) -> int:
    if not v.armed:
        return ACCEPTED
    if not v.landed and not force:
        if v.flavour.name == "px4":  # Commander::disarm
            text(v, R.MAV_SEVERITY_CRITICAL, "Disarming denied: not landed")
        return FAILED
    flight.disarm_now(v, "gcs")
    return ACCEPTED


def set_mode(v: VehicleState, name: str, *, reason: str = "gcs") -> int:
    mode = v.flavour.by_name(name)
    if mode is None:
        return FAILED
    return try_mode(v, mode, reason)


def set_mode_raw(v: VehicleState, base_mode: float, custom: int, sub: int | None) -> int:
    if v.flavour.name == "px4":
        if sub is None:  # SET_MODE: PX4's receiver unpacks custom_mode into main and sub mode
            custom, sub = (custom >> 16) & 0xFF, (custom >> 24) & 0xFF
        return set_mode_px4(v, int(base_mode), custom, sub)
    if not int(base_mode) & R.MAV_MODE_FLAG_CUSTOM_MODE_ENABLED:
        return UNSUPPORTED
    mode = v.flavour.by_custom(custom)
    if mode is None:
        return FAILED
    return try_mode(v, mode, "gcs")


def set_mode_px4(v: VehicleState, base: int, main: int, sub: int) -> int:
    """Commander::handle_command(DO_SET_MODE): AUTO with sub 0 is AUTO.MISSION; a main mode it does not know,
    or no custom flag and no base flag it maps, changes nothing and is ACCEPTED; an unknown AUTO sub mode and
    a refused switch are TEMPORARILY_REJECTED (the sim's FAILED, mapped in `mavjet.sim.commands.command`)."""
    if base & R.MAV_MODE_FLAG_CUSTOM_MODE_ENABLED:
        if main == PX4_MAIN_AUTO and sub == 0:
            sub = 4
        elif main != PX4_MAIN_AUTO:
            sub = 0
        mode = v.flavour.by_custom(px4_custom(main & 0xFF, sub & 0xFF))
        if mode is None:
            if main == PX4_MAIN_AUTO:
                text(v, R.MAV_SEVERITY_CRITICAL, "Unsupported auto mode")
                return FAILED
            return ACCEPTED
    elif base & R.MAV_MODE_FLAG_AUTO_ENABLED:
        mode = mode_named(v, "AUTO.MISSION")
    elif base & R.MAV_MODE_FLAG_MANUAL_INPUT_ENABLED:
        name = ("POSCTL" if base & R.MAV_MODE_FLAG_GUIDED_ENABLED
                else "STABILIZED" if base & R.MAV_MODE_FLAG_STABILIZE_ENABLED else "MANUAL")  # fmt: skip
        mode = mode_named(v, name)
    else:
        return ACCEPTED
    return try_mode(v, mode, "gcs")


def try_mode(v: VehicleState, mode: Mode, reason: str) -> int:
    if mode is v.fmode:
        return ACCEPTED
    # ArduCopter's Copter::set_mode: `ignore_checks = !motors->armed()` — disarmed, any mode
    # is accepted (the arming checks guard the flight); the position and mission checks apply
    # only to an armed vehicle. PX4's commander checks a mode's requirements either way.
    if v.flavour.name == "ardupilot" and not v.armed:
        enter_mode(v, mode, reason)
        return ACCEPTED
    if mode.needs_position and not v.position_ok:
        text(v, R.MAV_SEVERITY_WARNING, f"Mode change to {mode.name} failed: requires position")
        return FAILED
    if mode.behaviour == "auto":
        items = mission_view(v)
        if len(items) <= 1:
            text(v, R.MAV_SEVERITY_WARNING, f"Mode change to {mode.name} failed: no mission")
            return FAILED
        first_nav = next((it for it in items[1:] if it.command < NAV_CMDS_MAX), None)
        if (
            v.flavour.name == "ardupilot"
            and v.armed
            and v.landed
            and (first_nav is None or first_nav.command != R.MAV_CMD_NAV_TAKEOFF)
        ):
            text(v, R.MAV_SEVERITY_CRITICAL, "Auto: Missing Takeoff Cmd")
            return FAILED
    enter_mode(v, mode, reason)
    return ACCEPTED


def enter_mode(v: VehicleState, mode: Mode, reason: str) -> None:
    v.fmode = mode
    v.mode_reason = reason
    if mode.behaviour != "guided" and not (mode.behaviour == "hold" and mode.user_takeoff):
        abort_takeoff(v)
    v.target = None
    if mode.behaviour == "rtl":
        flight.rtl_start(v)
    elif mode.behaviour == "auto":
        if v.mission_state != R.MISSION_STATE_ACTIVE or v.mission_seq >= len(mission_view(v)):
            flight.auto_start(v, 1)
        v.item_started = False
        telemetry.send_mission_current(v)


def takeoff(v: VehicleState, alt_m: float) -> int:
    if not v.armed or not v.landed or not math.isfinite(alt_m) or alt_m <= 0:
        return FAILED
    if v.flavour.takeoff is not None:
        if try_mode(v, mode_named(v, v.flavour.takeoff), "takeoff") != ACCEPTED:
            return FAILED
    elif not v.fmode.user_takeoff:
        return FAILED
    v.takeoff_alt_m = float(alt_m)
    v.landed = False
    return ACCEPTED


# PX4's MIS_TAKEOFF_ALT default (navigator/mission_params.yaml): the climb of a NAV_TAKEOFF without param7.
PX4_MIS_TAKEOFF_ALT_M = 2.5


def takeoff_px4(v: VehicleState, alt_amsl_m: float) -> int:
    """PX4's NAV_TAKEOFF: param7 is an altitude above mean sea level (navigator/takeoff.cpp).

    NaN climbs MIS_TAKEOFF_ALT. A target below the vehicle is accepted, switches to AUTO.TAKEOFF and ends there
    at once ("Already higher than takeoff altitude", CRITICAL, after the ACK) back in AUTO.LOITER, on the ground:
    what the real PX4 does with a relative 10 (capture tests/fixtures/px4/takeoff_and_reposition).
    """
    base = v.home[2] if v.home is not None else v.ground_amsl_m
    rel = PX4_MIS_TAKEOFF_ALT_M if not math.isfinite(alt_amsl_m) else alt_amsl_m - base
    if not v.armed or not v.landed or v.flavour.takeoff is None:
        return FAILED
    if rel > v.alt_m:
        return takeoff(v, rel)
    if try_mode(v, mode_named(v, v.flavour.takeoff), "takeoff") != ACCEPTED:
        return FAILED
    if v.flavour.after_takeoff is not None:
        v.fmode = mode_named(v, v.flavour.after_takeoff)
    msg = "Already higher than takeoff altitude"
    v.statustexts.append((R.MAV_SEVERITY_CRITICAL, msg))
    v.desk.after_ack.append(R.MAVLink_statustext_message(R.MAV_SEVERITY_CRITICAL, msg.encode(), 0, 0))
    return ACCEPTED


def goto(v: VehicleState, lat_deg: float, lon_deg: float, alt_m: float) -> int:
    if v.fmode.behaviour != "guided":
        return DENIED
    v.target = (lat_deg, lon_deg, max(alt_m, 1.0))
    return ACCEPTED


def abort_takeoff(v: VehicleState) -> None:
    v.takeoff_alt_m = None
