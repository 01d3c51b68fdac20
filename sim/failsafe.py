"""Battery and fence failsafes of a vehicle, with ArduCopter's thresholds and actions.

Step functions over `mavjet.sim.state.VehicleState`, run by
`mavjet.sim.lifecycle.checks`. The verdicts (battery level from the BATT_*
voltage and mAh thresholds, a fence breach from FENCE_TYPE: altitude, home
circle, uploaded inclusion polygons) are `mavjet.sim.health`'s; this is what
the autopilot does about them: a text, and the BATT_FS_*_ACT or
FENCE_ACTION (land, RTL, disarm).
"""

from __future__ import annotations

from mavjet.sim import control, flight, health, streams, telemetry
from mavjet.sim.consts import R
from mavjet.sim.state import VehicleState, mode_named, text


def battery_check(v: VehicleState) -> None:
    level = health.battery_level(v)
    if level <= v.battery_fs:
        return
    v.battery_fs = level
    word = "critical" if level == 2 else "low"
    text(v,
        R.MAV_SEVERITY_CRITICAL,
        f"Battery failsafe: {word} {v.battery_v:.2f}V used {v.consumed_mah:.0f} mAh",
    )
    if not v.armed:
        return
    if v.landed:
        flight.disarm_now(v, "battery_failsafe")
        return
    action = int(v.params["BATT_FS_CRT_ACT" if level == 2 else "BATT_FS_LOW_ACT"])
    failsafe_action(v, action, "battery_failsafe")


def failsafe_action(v: VehicleState, action: int, reason: str) -> None:
    """BATT_FS_*_ACT numbering: 0 none, 1 land, 2 RTL, 3 SmartRTL/RTL, 4 SmartRTL/land, 5 terminate."""
    if action == 0:
        return
    if action == 5:
        flight.disarm_now(v, reason)
        return
    want = v.flavour.land if action in (1, 4) else v.flavour.rtl
    if want == v.flavour.rtl and (v.home is None or not v.position_ok):
        want = v.flavour.land
    if v.fmode.behaviour == "land" or (v.fmode.behaviour == "rtl" and want == v.flavour.rtl):
        return
    control.enter_mode(v, mode_named(v, want), reason)


def fence_check(v: VehicleState) -> None:
    breach = health.fence_breach(v)
    f = v.fence
    if breach == f.breach_type:
        return
    f.breach_type = breach
    if breach:
        f.breach_count += 1
        f.breach_time_ms = v.boot_ms
        text(v, R.MAV_SEVERITY_CRITICAL, "Fence breached")
        if not v.landed:
            action = int(v.params["FENCE_ACTION"])
            if action in (1, 3, 6):
                failsafe_action(v, 2, "fence_breach")
            elif action in (2, 4, 5):
                failsafe_action(v, 1, "fence_breach")
    telemetry.emit(v, streams.FENCE_STATUS)
