"""Battery and fence failsafes of a vehicle model, with ArduCopter's thresholds and actions.

Part of `mavjet.sim.model.VehicleModel`, which keeps the state and runs these checks
from `mavjet.sim.control.checks`. Battery levels come from BATT_* voltage and mAh
thresholds (BATT_FS_*_ACT numbering for the action); the fence from
FENCE_TYPE (altitude, home circle, uploaded inclusion polygons) and
FENCE_ACTION. Functions over the model, not a mixin: see `mavjet.sim.commands`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from mavjet.sim import control, geo, streams, telemetry
from mavjet.sim.consts import R
from mavjet.sim.missions import FENCE

if TYPE_CHECKING:
    from mavjet.sim.model import VehicleModel


@dataclass(slots=True)
class FenceState:
    breach_type: int = 0  # FENCE_BREACH_*
    breach_count: int = 0
    breach_time_ms: int = 0


def battery_level(v: VehicleModel) -> int:
    """0 fine, 1 low, 2 critical, from BATT_* thresholds (voltage and/or mAh remaining)."""
    volt = v.battery_v
    remaining = v.capacity_mah - v.consumed_mah
    p = v.params
    if (p["BATT_CRT_VOLT"] > 0 and volt < p["BATT_CRT_VOLT"]) or (p["BATT_CRT_MAH"] > 0 and remaining < p["BATT_CRT_MAH"]):
        return 2
    if (p["BATT_LOW_VOLT"] > 0 and volt < p["BATT_LOW_VOLT"]) or (p["BATT_LOW_MAH"] > 0 and remaining < p["BATT_LOW_MAH"]):
        return 1
    return 0


def battery_check(v: VehicleModel) -> None:
    level = battery_level(v)
    if level <= v.battery_fs:
        return
    v.battery_fs = level
    word = "critical" if level == 2 else "low"
    v._text(
        R.MAV_SEVERITY_CRITICAL,
        f"Battery failsafe: {word} {v.battery_v:.2f}V used {v.consumed_mah:.0f} mAh",
    )
    if not v.armed:
        return
    if v.landed:
        control.disarm_now(v, "battery_failsafe")
        return
    action = int(v.params["BATT_FS_CRT_ACT" if level == 2 else "BATT_FS_LOW_ACT"])
    failsafe_action(v, action, "battery_failsafe")


def failsafe_action(v: VehicleModel, action: int, reason: str) -> None:
    """BATT_FS_*_ACT numbering: 0 none, 1 land, 2 RTL, 3 SmartRTL/RTL, 4 SmartRTL/land, 5 terminate."""
    if action == 0:
        return
    if action == 5:
        control.disarm_now(v, reason)
        return
    want = v.flavour.land if action in (1, 4) else v.flavour.rtl
    if want == v.flavour.rtl and (v.home is None or not v.position_ok):
        want = v.flavour.land
    if v.fmode.behaviour == "land" or (v.fmode.behaviour == "rtl" and want == v.flavour.rtl):
        return
    control.enter_mode(v, v._mode_or_die(want), reason)


def fence_polygons(v: VehicleModel) -> list[list[tuple[float, float]]]:
    polys: list[list[tuple[float, float]]] = []
    current: list[tuple[float, float]] = []
    want = 0
    for it in v.missions.items(FENCE):
        if it.command != R.MAV_CMD_NAV_FENCE_POLYGON_VERTEX_INCLUSION:
            continue
        if not current:
            want = max(round(it.param1), 0)
        current.append((it.lat_deg, it.lon_deg))
        if len(current) >= want:
            polys.append(current)
            current = []
    return polys


def fence_breach(v: VehicleModel) -> int:
    p = v.params
    ftype = int(p["FENCE_TYPE"])
    if ftype & 1 and v.alt_m > p["FENCE_ALT_MAX"]:
        return int(R.FENCE_BREACH_MAXALT)
    home = v.home
    if ftype & 2 and home is not None and geo.distance_m(home[0], home[1], v.lat_deg, v.lon_deg) > p["FENCE_RADIUS"]:
        return int(R.FENCE_BREACH_BOUNDARY)
    if ftype & 4:
        for poly in fence_polygons(v):
            if not geo.inside_polygon(v.lat_deg, v.lon_deg, poly):
                return int(R.FENCE_BREACH_BOUNDARY)
    return int(R.FENCE_BREACH_NONE)


def fence_check(v: VehicleModel) -> None:
    breach = fence_breach(v)
    f = v.fence
    if breach == f.breach_type:
        return
    f.breach_type = breach
    if breach:
        f.breach_count += 1
        f.breach_time_ms = v.boot_ms
        v._text(R.MAV_SEVERITY_CRITICAL, "Fence breached")
        if not v.landed:
            action = int(v.params["FENCE_ACTION"])
            if action in (1, 3, 6):
                failsafe_action(v, 2, "fence_breach")
            elif action in (2, 4, 5):
                failsafe_action(v, 1, "fence_breach")
    telemetry.emit(v, streams.FENCE_STATUS)
