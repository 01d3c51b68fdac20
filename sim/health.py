"""What the autopilot's checks conclude from a vehicle's state: battery level, fence breach, pre-arm failure.

Pure queries over `mavjet.sim.state.VehicleState` (nothing here changes the
state or sends anything): the step modules that act on a verdict
(`mavjet.sim.failsafe`, `control`, `lifecycle`) and the telemetry that reports
one (`mavjet.sim.telemetry`) ask here, so none of them has to import another
to learn it. Thresholds are ArduCopter's BATT_* and FENCE_* parameters.
"""

from __future__ import annotations

from mavjet.sim import geo
from mavjet.sim.consts import R
from mavjet.sim.missions import FENCE
from mavjet.sim.state import VehicleState


def battery_level(s: VehicleState) -> int:
    """0 fine, 1 low, 2 critical, from BATT_* thresholds (voltage and/or mAh remaining)."""
    volt = s.battery_v
    remaining = s.capacity_mah - s.consumed_mah
    p = s.params
    if (p["BATT_CRT_VOLT"] > 0 and volt < p["BATT_CRT_VOLT"]) or (p["BATT_CRT_MAH"] > 0 and remaining < p["BATT_CRT_MAH"]):
        return 2
    if (p["BATT_LOW_VOLT"] > 0 and volt < p["BATT_LOW_VOLT"]) or (p["BATT_LOW_MAH"] > 0 and remaining < p["BATT_LOW_MAH"]):
        return 1
    return 0


def fence_polygons(s: VehicleState) -> list[list[tuple[float, float]]]:
    polys: list[list[tuple[float, float]]] = []
    current: list[tuple[float, float]] = []
    want = 0
    for it in s.missions.items(FENCE):
        if it.command != R.MAV_CMD_NAV_FENCE_POLYGON_VERTEX_INCLUSION:
            continue
        if not current:
            want = max(round(it.param1), 0)
        current.append((it.lat_deg, it.lon_deg))
        if len(current) >= want:
            polys.append(current)
            current = []
    return polys


def fence_breach(s: VehicleState) -> int:
    p = s.params
    ftype = int(p["FENCE_TYPE"])
    if ftype & 1 and s.alt_m > p["FENCE_ALT_MAX"]:
        return int(R.FENCE_BREACH_MAXALT)
    home = s.home
    if ftype & 2 and home is not None and geo.distance_m(home[0], home[1], s.lat_deg, s.lon_deg) > p["FENCE_RADIUS"]:
        return int(R.FENCE_BREACH_BOUNDARY)
    if ftype & 4:
        for poly in fence_polygons(s):
            if not geo.inside_polygon(s.lat_deg, s.lon_deg, poly):
                return int(R.FENCE_BREACH_BOUNDARY)
    return int(R.FENCE_BREACH_NONE)


def terrain_position(s: VehicleState) -> tuple[int, int] | None:
    return (round(s.lat_deg * 1e7), round(s.lon_deg * 1e7)) if s.position_ok else None


def terrain_home(s: VehicleState) -> tuple[int, int] | None:
    return None if s.home is None else (round(s.home[0] * 1e7), round(s.home[1] * 1e7))


def prearm_failure(s: VehicleState) -> str | None:
    """The first failing arming check's text, as ArduCopter words it (None: it would arm)."""
    if not s.fmode.armable and not (
        s.fmode.behaviour == "auto" and int(s.params["AUTO_OPTIONS"]) & 1 and s.flavour.name == "ardupilot"
    ):
        return "Arm: Mode not armable"
    if s.fmode.needs_position and s.flavour.name == "ardupilot" and not s.position_ok:
        return "PreArm: Need Position Estimate"  # what ArduCopter says in GUIDED before the EKF uses GPS
    if not s.gps_fix:
        return "PreArm: Need 3D Fix"
    if not s.ekf_ok:
        return "PreArm: EKF3 still initialising"
    if s.battery_fs or battery_level(s):
        return "PreArm: Battery 1 low voltage failsafe"
    arm_volt = s.params["BATT_ARM_VOLT"]
    if arm_volt > 0 and s.battery_v < arm_volt:
        return "PreArm: Battery 1 below minimum arming voltage"
    if s.params["FENCE_ENABLE"] and fence_breach(s) != 0:
        return "PreArm: Fence: vehicle outside fence"
    if s.terrain_required:
        if not s.params["TERRAIN_ENABLE"]:
            return "PreArm: terrain disabled"
        if not s.terrain.prearm_ok(terrain_position(s), terrain_home(s)):
            return "PreArm: waiting for terrain data"
    return None
