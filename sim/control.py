"""Arming and flight modes: the flight API of a vehicle model.

Part of `mavjet.sim.model.VehicleModel` (which keeps the state and exposes `arm`,
`disarm`, `set_mode`, `takeoff` and `goto` to ground-station commands and the
built-in sortie): ArduCopter's and PX4's pre-arm checks and the texts they
print, mode-entry rules (ArduCopter accepts any mode while disarmed; PX4's
Commander checks a mode's requirements either way), DO_SET_MODE/SET_MODE
decoding for both flavours, and what entering a mode starts (RTL, AUTO).
Functions over the model, not a mixin: see `mavjet.sim.commands`.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Final

from mavjet.sim import failsafe, flight, stores, telemetry
from mavjet.sim.consts import (
    ACCEPTED,
    DENIED,
    FAILED,
    NAV_CMDS_MAX,
    PREARM_DISPLAY_S,
    PX4_MAIN_AUTO,
    TIMESYNC_S,
    UNSUPPORTED,
    R,
)
from mavjet.sim.modes import Mode, px4_custom

if TYPE_CHECKING:
    from mavjet.sim.model import VehicleModel

BATTERY_CHECK_S: Final = 0.5  # sim seconds between battery failsafe checks


def checks(v: VehicleModel) -> None:
    """The autopilot's periodic work at each physics step: the end of the boot window, TIMESYNC
    requests, GPS fix and EKF origin (home), battery and fence failsafes, pre-arm display, idle disarm."""
    since_boot = v.now - v.boot_at
    if not v.initialised:
        if since_boot < v.opts.boot_s:
            return
        v.initialised = True
        if v.fmode.name != v.flavour.initial:  # a mode set during BOOT does not survive it
            enter_mode(v, v._mode_or_die(v.flavour.initial), "boot")
        v._text(R.MAV_SEVERITY_INFO, "ArduPilot Ready")
    if v.now >= v._next_timesync and v.flavour.name == "ardupilot":
        v._next_timesync = v.now + TIMESYNC_S
        v._send(R.MAVLink_timesync_message(0, int(since_boot * 1e6) * 1000 + v.sysid))
    if not v.gps_fix and since_boot >= v.opts.gps_fix_s:
        v.gps_fix = True
        v._text(R.MAV_SEVERITY_INFO, "GPS 1: detected u-blox, 3D fix")
    if v.gps_fix and not v.ekf_ok and since_boot >= max(v.opts.ekf_settle_s, v.opts.gps_fix_s):
        v.ekf_ok = True
        v._text(R.MAV_SEVERITY_INFO, "EKF3 IMU0 is using GPS")
        if v.home is None:
            telemetry.send_origin(v)
            telemetry.set_home(v, v.lat_deg, v.lon_deg, v.alt_amsl_m)
            if v._is_ap and v.params["MIS_TOTAL"] < 1:
                stores.notify_param(v, "MIS_TOTAL", 1.0)  # AP_Mission writes home as item 0
    if v.now >= v._next_battery_check:  # ArduPilot filters too (BATT_LOW_TIMER)
        v._next_battery_check = v.now + BATTERY_CHECK_S
        failsafe.battery_check(v)
    if v.armed and v.params["FENCE_ENABLE"]:
        failsafe.fence_check(v)
    if v.now >= v._next_prearm_check:
        prearm_update(v)
    delay = v.params["DISARM_DELAY"]
    if v.armed and v.landed and delay > 0 and v.now - v.landed_since >= delay:
        disarm_now(v, "auto")


def arm(v: VehicleModel, *, force: bool = False) -> int:
    if v.armed:
        return ACCEPTED
    if not v.initialised:  # the one refusal whose text ArduPilot sends before the ACK
        v._text(R.MAV_SEVERITY_CRITICAL, "Arm: System not initialised")
        return FAILED
    if not force and v.params["ARMING_CHECK"] != 0:
        reason = prearm_failure(v)
        if reason is not None:
            if v.flavour.name == "ardupilot":
                # ArduPilot's arming checks report "Arm: <reason>" after the COMMAND_ACK goes out
                # (the "PreArm: " form is only the periodic display, see `prearm_update`).
                arm_text = "Arm: " + reason.removeprefix("PreArm: ").removeprefix("Arm: ")
                v.statustexts.append((R.MAV_SEVERITY_CRITICAL, arm_text))
                v._after_ack.append(
                    R.MAVLink_statustext_message(R.MAV_SEVERITY_CRITICAL, arm_text.encode()[:50], 0, 0)
                )
            else:
                v._text(R.MAV_SEVERITY_CRITICAL, reason)
            return FAILED
    v.armed = True
    v.landed = v.alt_m <= 0.05
    v.landed_since = v.now
    if v.position_ok:  # ArduPilot re-sets home (and re-sends the EKF origin) at every arming
        telemetry.send_origin(v)
        telemetry.set_home(v, v.lat_deg, v.lon_deg, v.alt_amsl_m)
    v._text(R.MAV_SEVERITY_INFO, "Arming motors")
    return ACCEPTED


def prearm_failure(v: VehicleModel) -> str | None:
    if not v.fmode.armable and not (
        v.fmode.behaviour == "auto" and int(v.params["AUTO_OPTIONS"]) & 1 and v.flavour.name == "ardupilot"
    ):
        return "Arm: Mode not armable"
    if v.fmode.needs_position and v.flavour.name == "ardupilot" and not v.position_ok:
        return "PreArm: Need Position Estimate"  # what ArduCopter says in GUIDED before the EKF uses GPS
    if not v.gps_fix:
        return "PreArm: Need 3D Fix"
    if not v.ekf_ok:
        return "PreArm: EKF3 still initialising"
    if v.battery_fs or failsafe.battery_level(v):
        return "PreArm: Battery 1 low voltage failsafe"
    arm_volt = v.params["BATT_ARM_VOLT"]
    if arm_volt > 0 and v.battery_v < arm_volt:
        return "PreArm: Battery 1 below minimum arming voltage"
    if v.params["FENCE_ENABLE"] and failsafe.fence_breach(v) != 0:
        return "PreArm: Fence: vehicle outside fence"
    if v._terrain_required:
        if not v.params["TERRAIN_ENABLE"]:
            return "PreArm: terrain disabled"
        if not v.terrain.prearm_ok(stores.terrain_position(v), stores.terrain_home(v)):
            return "PreArm: waiting for terrain data"
    return None


def prearm_update(v: VehicleModel) -> None:
    """ArduPilot's 1 Hz pre-arm pass: print a failing check every PREARM_DISPLAY_S, or at once when it starts failing.

    Also AP_Terrain's 1 Hz update (disk reads, home, surroundings, mission
    points); its TERRAIN_REQUEST goes out from the stream scheduler instead.
    """
    v._next_prearm_check = v.now + 1.0
    failing = None if v.armed or v.params["ARMING_CHECK"] == 0 else prearm_failure(v)
    failing = failing if failing is not None and failing.startswith("PreArm: ") else None
    if failing is not None and (v._prearm_ok or v.now >= v._next_prearm_text):
        v._next_prearm_text = v.now + PREARM_DISPLAY_S
        v._text(R.MAV_SEVERITY_CRITICAL, failing)
    v._prearm_ok = failing is None
    if v._terrain_in_use and v.params["TERRAIN_ENABLE"]:
        v.terrain.tick(stores.terrain_position(v), stores.terrain_home(v))


def disarm(v: VehicleModel, *, force: bool = False) -> int:
    if not v.armed:
        return ACCEPTED
    if not v.landed and not force:
        if v.flavour.name == "px4":  # Commander::disarm
            v._text(R.MAV_SEVERITY_CRITICAL, "Disarming denied: not landed")
        return FAILED
    disarm_now(v, "gcs")
    return ACCEPTED


def disarm_now(v: VehicleModel, why: str) -> None:
    v.armed = False
    v.takeoff_alt_m = None
    v.vn = v.ve = v.vd = 0.0
    v._text(R.MAV_SEVERITY_INFO, "Disarming motors")
    v.stats.extra[f"disarm_{why}"] = v.stats.extra.get(f"disarm_{why}", 0) + 1


def set_mode(v: VehicleModel, name: str, *, reason: str = "gcs") -> int:
    mode = v.flavour.by_name(name)
    if mode is None:
        return FAILED
    return try_mode(v, mode, reason)


def set_mode_raw(v: VehicleModel, base_mode: float, custom: int, sub: int | None) -> int:
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


def set_mode_px4(v: VehicleModel, base: int, main: int, sub: int) -> int:
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
                v._text(R.MAV_SEVERITY_CRITICAL, "Unsupported auto mode")
                return FAILED
            return ACCEPTED
    elif base & R.MAV_MODE_FLAG_AUTO_ENABLED:
        mode = v._mode_or_die("AUTO.MISSION")
    elif base & R.MAV_MODE_FLAG_MANUAL_INPUT_ENABLED:
        name = ("POSCTL" if base & R.MAV_MODE_FLAG_GUIDED_ENABLED
                else "STABILIZED" if base & R.MAV_MODE_FLAG_STABILIZE_ENABLED else "MANUAL")  # fmt: skip
        mode = v._mode_or_die(name)
    else:
        return ACCEPTED
    return try_mode(v, mode, "gcs")


def try_mode(v: VehicleModel, mode: Mode, reason: str) -> int:
    if mode is v.fmode:
        return ACCEPTED
    # ArduCopter's Copter::set_mode: `ignore_checks = !motors->armed()` — disarmed, any mode
    # is accepted (the arming checks guard the flight); the position and mission checks apply
    # only to an armed vehicle. PX4's commander checks a mode's requirements either way.
    if v.flavour.name == "ardupilot" and not v.armed:
        enter_mode(v, mode, reason)
        return ACCEPTED
    if mode.needs_position and not v.position_ok:
        v._text(R.MAV_SEVERITY_WARNING, f"Mode change to {mode.name} failed: requires position")
        return FAILED
    if mode.behaviour == "auto":
        items = v._mission()
        if len(items) <= 1:
            v._text(R.MAV_SEVERITY_WARNING, f"Mode change to {mode.name} failed: no mission")
            return FAILED
        first_nav = next((it for it in items[1:] if it.command < NAV_CMDS_MAX), None)
        if (
            v.flavour.name == "ardupilot"
            and v.armed
            and v.landed
            and (first_nav is None or first_nav.command != R.MAV_CMD_NAV_TAKEOFF)
        ):
            v._text(R.MAV_SEVERITY_CRITICAL, "Auto: Missing Takeoff Cmd")
            return FAILED
    enter_mode(v, mode, reason)
    return ACCEPTED


def enter_mode(v: VehicleModel, mode: Mode, reason: str) -> None:
    v.fmode = mode
    v.mode_reason = reason
    if mode.behaviour != "guided" and not (mode.behaviour == "hold" and mode.user_takeoff):
        abort_takeoff(v)
    v.target = None
    if mode.behaviour == "rtl":
        flight.rtl_start(v)
    elif mode.behaviour == "auto":
        if v.mission_state != R.MISSION_STATE_ACTIVE or v.mission_seq >= len(v._mission()):
            flight.auto_start(v, 1)
        v.item_started = False
        telemetry.send_mission_current(v)


def takeoff(v: VehicleModel, alt_m: float) -> int:
    if not v.armed or not v.landed or not math.isfinite(alt_m) or alt_m <= 0:
        return FAILED
    if v.flavour.takeoff is not None:
        if try_mode(v, v._mode_or_die(v.flavour.takeoff), "takeoff") != ACCEPTED:
            return FAILED
    elif not v.fmode.user_takeoff:
        return FAILED
    v.takeoff_alt_m = float(alt_m)
    v.landed = False
    return ACCEPTED


def goto(v: VehicleModel, lat_deg: float, lon_deg: float, alt_m: float) -> int:
    if v.fmode.behaviour != "guided":
        return DENIED
    v.target = (lat_deg, lon_deg, max(alt_m, 1.0))
    return ACCEPTED


def abort_takeoff(v: VehicleModel) -> None:
    v.takeoff_alt_m = None
