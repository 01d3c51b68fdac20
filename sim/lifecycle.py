"""The autopilot's own time: power-on, and the periodic work it does between messages.

Step functions over `mavjet.sim.state.VehicleState`: `power_on` sets what a
boot (or a reboot) resets; `checks` runs at each physics step (the end of
ArduPilot's BOOT window, TIMESYNC requests, GPS fix and EKF origin, the
battery and fence failsafes, the pre-arm display, the idle disarm) and
`prearm_update` is ArduPilot's 1 Hz pre-arm pass. The highest of the step
modules the tick calls: it runs the others' steps (`control`, `failsafe`,
`flight`, `telemetry`) and none of them calls it.
"""

from __future__ import annotations

from typing import Final

from mavjet.sim import control, failsafe, flight, health, telemetry
from mavjet.sim.consts import PREARM_DISPLAY_S, TIMESYNC_S, R
from mavjet.sim.state import FenceState, VehicleState, mode_named, send, text

BATTERY_CHECK_S: Final = 0.5  # sim seconds between battery failsafe checks


def power_on(v: VehicleState, now: float) -> None:
    """Power-on state; params, missions, position and battery charge survive a reboot."""
    v.sysid = int(v.params["MAV_SYSID"])
    v.now = now
    v.boot_at = now
    # ArduPilot reports system_status BOOT until its init is over; a mode set meanwhile is
    # overridden by the boot mode, and arming is refused ("Arm: System not initialised").
    v.initialised = v.flavour.name != "ardupilot" or v.opts.boot_s <= 0
    v.next_timesync = now + TIMESYNC_S
    v.armed = False
    v.fmode = mode_named(v, v.flavour.initial)
    v.mode_reason = "boot"
    v.landed = v.alt_m <= 0.0
    v.alt_m = max(v.alt_m, 0.0)
    v.vn = v.ve = v.vd = 0.0
    v.roll = v.pitch = 0.0
    v.home = None
    v.missions.home_item = None
    v.missions.reset_transfers()
    v.gps_fix = False
    v.ekf_ok = False
    v.takeoff_alt_m = None
    v.target = None
    v.speed_m_s = None
    v.rtl_phase = ""
    v.rtl_alt_m = 0.0
    v.rtl_wait_until = 0.0
    v.mission_seq = 1
    v.mission_state = R.MISSION_STATE_NOT_STARTED
    v.item_started = False
    v.item_hold_until = None
    v.battery_fs = 0
    v.next_battery_check = now
    v.fence = FenceState()
    v.landed_since = now
    v.next_prearm_text = now + PREARM_DISPLAY_S
    v.prearm_ok = False
    v.next_prearm_check = now
    v.desk.sent = {}
    v.desk.pending = []
    v.schedule.reset(now)
    v.reboot_pending = False
    text(v, R.MAV_SEVERITY_INFO, telemetry.firmware_string(v))


def checks(v: VehicleState) -> None:
    """The autopilot's periodic work at each physics step: the end of the boot window, TIMESYNC
    requests, GPS fix and EKF origin (home), battery and fence failsafes, pre-arm display, idle disarm."""
    since_boot = v.now - v.boot_at
    if not v.initialised:
        if since_boot < v.opts.boot_s:
            return
        v.initialised = True
        if v.fmode.name != v.flavour.initial:  # a mode set during BOOT does not survive it
            control.enter_mode(v, mode_named(v, v.flavour.initial), "boot")
        text(v, R.MAV_SEVERITY_INFO, "ArduPilot Ready")
    if v.now >= v.next_timesync and v.flavour.name == "ardupilot":
        v.next_timesync = v.now + TIMESYNC_S
        send(v, R.MAVLink_timesync_message(0, int(since_boot * 1e6) * 1000 + v.sysid))
    if not v.gps_fix and since_boot >= v.opts.gps_fix_s:
        v.gps_fix = True
        text(v, R.MAV_SEVERITY_INFO, "GPS 1: detected u-blox, 3D fix")
    if v.gps_fix and not v.ekf_ok and since_boot >= max(v.opts.ekf_settle_s, v.opts.gps_fix_s):
        v.ekf_ok = True
        text(v, R.MAV_SEVERITY_INFO, "EKF3 IMU0 is using GPS")
        if v.home is None:
            telemetry.send_origin(v)
            telemetry.set_home(v, v.lat_deg, v.lon_deg, v.alt_amsl_m)
            if v.is_ap and v.params["MIS_TOTAL"] < 1:
                telemetry.notify_param(v, "MIS_TOTAL", 1.0)  # AP_Mission writes home as item 0
    if v.now >= v.next_battery_check:  # ArduPilot filters too (BATT_LOW_TIMER)
        v.next_battery_check = v.now + BATTERY_CHECK_S
        failsafe.battery_check(v)
    if v.armed and v.params["FENCE_ENABLE"]:
        failsafe.fence_check(v)
    if v.now >= v.next_prearm_check:
        prearm_update(v)
    delay = v.params["DISARM_DELAY"]
    if v.armed and v.landed and delay > 0 and v.now - v.landed_since >= delay:
        flight.disarm_now(v, "auto")


def prearm_update(v: VehicleState) -> None:
    """ArduPilot's 1 Hz pre-arm pass: print a failing check every PREARM_DISPLAY_S, or at once when it starts failing.

    Also AP_Terrain's 1 Hz update (disk reads, home, surroundings, mission
    points); its TERRAIN_REQUEST goes out from the stream scheduler instead.
    """
    v.next_prearm_check = v.now + 1.0
    failing = None if v.armed or v.params["ARMING_CHECK"] == 0 else health.prearm_failure(v)
    failing = failing if failing is not None and failing.startswith("PreArm: ") else None
    if failing is not None and (v.prearm_ok or v.now >= v.next_prearm_text):
        v.next_prearm_text = v.now + PREARM_DISPLAY_S
        text(v, R.MAV_SEVERITY_CRITICAL, failing)
    v.prearm_ok = failing is None
    if v.terrain_in_use and v.params["TERRAIN_ENABLE"]:
        v.terrain.tick(health.terrain_position(v), health.terrain_home(v))
