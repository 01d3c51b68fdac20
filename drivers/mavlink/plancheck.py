"""A plan checked as QGroundControl and the autopilots check it, before any vehicle is asked to fly it.

`mavjet mission put` and the gateway's `mission_upload` both call
`check_plan`: pure, on a parsed `Plan`, returning typed findings. A
`refusal` stops the plan (put stores nothing, the upload sends nothing); a
`warning` is printed and carried in the result, and the plan goes on.

| check | severity | why |
|---|---|---|
| copter plan whose first navigation item is not a takeoff | warning | ArduCopter will not start it from the ground ("Auto: Missing Takeoff Cmd"); from the air it flies |
| item below home (height above home < 0; terrain frames: below the ground) | refusal | the vehicle would fly into the ground |
| item above the ceiling (`PlanLimits.ceiling_m` above home) | refusal | a configured limit |
| waypoint outside the plan's own geofence | refusal | the vehicle would breach its own fence mid-mission |
| a land item that is not the last item | warning | ArduPilot disarms after landing in AUTO: what follows never runs |
| DO_CHANGE_SPEED outside (0, `max_speed_m_s`] (-1 and -2: "no change", "default") | refusal | the autopilot ignores or clamps it |
| first waypoint further than `max_leg_m` from home, or two consecutive ones further apart | warning | most often a typo in a coordinate; PX4 refuses such a mission (MIS_DIST_1WP) |

The geofence rule is ArduPilot's (AC_PolyFence_loader): a position must be
inside every inclusion zone and outside every exclusion zone. Items without
a position (lat = lon = 0: "here") are not checked against the fence or for
distances.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum

from mavjet.contract.commands import ALT_RANGE_M
from mavjet.contract.modes import VehicleClass, vehicle_class_of
from mavjet.drivers.mavlink.dialect import mavlink2
from mavjet.drivers.mavlink.fence import Circle, Polygon
from mavjet.drivers.mavlink.mission import GLOBAL_FRAMES, MissionItem
from mavjet.drivers.mavlink.normalise import command_name, is_positional
from mavjet.drivers.mavlink.plan import (
    FENCE_CIRCLE_EXCLUSION,
    FENCE_CIRCLE_INCLUSION,
    FENCE_POLY_EXCLUSION,
    FENCE_POLY_INCLUSION,
    Plan,
)
from mavjet.drivers.mavlink.terrain import TERRAIN_FRAMES

TAKEOFF_COMMANDS = frozenset({mavlink2.MAV_CMD_NAV_TAKEOFF, mavlink2.MAV_CMD_NAV_VTOL_TAKEOFF})
LAND_COMMANDS = frozenset({mavlink2.MAV_CMD_NAV_LAND, mavlink2.MAV_CMD_NAV_VTOL_LAND})
CHANGE_SPEED = mavlink2.MAV_CMD_DO_CHANGE_SPEED
SPEED_KEEP = (-1.0, -2.0)  # DO_CHANGE_SPEED param2: "no change", "back to the default"
RELATIVE_FRAMES = frozenset({mavlink2.MAV_FRAME_GLOBAL_RELATIVE_ALT, mavlink2.MAV_FRAME_GLOBAL_RELATIVE_ALT_INT})
AMSL_FRAMES = frozenset({mavlink2.MAV_FRAME_GLOBAL, mavlink2.MAV_FRAME_GLOBAL_INT})
_NAV_LAST = 95  # MAV_CMD 16..94 are navigation commands; DO_/CONDITION_ ones come after
EARTH_RADIUS_M = 6_371_008.8


class Severity(StrEnum):
    WARNING = "warning"  # printed and passed on; the plan goes on
    REFUSAL = "refusal"  # the plan is not stored / not uploaded


class Check(StrEnum):
    TAKEOFF = "takeoff"
    BELOW_HOME = "below_home"
    CEILING = "ceiling"
    GEOFENCE = "geofence"
    LAND_NOT_LAST = "land_not_last"
    SPEED = "speed"
    DISTANCE = "distance"


@dataclass(frozen=True, kw_only=True, slots=True)
class PlanLimits:
    """The configured limits: ceiling above home, the largest speed, the longest leg."""

    ceiling_m: float = ALT_RANGE_M[1]  # the command catalogue's own altitude limit
    max_speed_m_s: float = 30.0
    max_leg_m: float = 900.0  # PX4's MIS_DIST_1WP default


@dataclass(frozen=True, kw_only=True, slots=True)
class Finding:
    severity: Severity
    check: Check
    where: str  # the item in the file's own numbering (`mission.items[3]`), or "" for the whole plan
    message: str
    seq: int | None = None

    def __str__(self) -> str:
        return f"{self.where}: {self.message}" if self.where else self.message

    def as_dict(self) -> dict[str, object]:
        return {"severity": str(self.severity), "check": str(self.check), "where": self.where,
                "message": self.message, "seq": self.seq}


Label = Callable[[int], str]


def plan_label(seq: int) -> str:
    """A `.plan` names its items from 0 after the home: seq k is `mission.items[k-1]`."""
    return f"mission.items[{seq - 1}]"


def refusals(findings: Iterable[Finding]) -> list[Finding]:
    return [f for f in findings if f.severity is Severity.REFUSAL]


def warnings(findings: Iterable[Finding]) -> list[Finding]:
    return [f for f in findings if f.severity is Severity.WARNING]


# ---------------------------------------------------------------------------
# geometry (small distances: haversine, and a local planar projection for polygons)


def distance_m(a: tuple[float, float], b: tuple[float, float]) -> float:
    lat1, lon1, lat2, lon2 = map(math.radians, (a[0], a[1], b[0], b[1]))
    h = math.sin((lat2 - lat1) / 2) ** 2 + math.cos(lat1) * math.cos(lat2) * math.sin((lon2 - lon1) / 2) ** 2
    return 2 * EARTH_RADIUS_M * math.asin(min(1.0, math.sqrt(h)))


def inside_polygon(point: tuple[float, float], polygon: Sequence[tuple[float, float]]) -> bool:
    """Ray casting in a plane tangent at `point` (x east, y north, metres)."""
    lat0, lon0 = point
    k = math.cos(math.radians(lat0))
    pts = [((lon - lon0) * k, lat - lat0) for lat, lon in polygon]
    inside = False
    j = len(pts) - 1
    for i in range(len(pts)):
        xi, yi = pts[i]
        xj, yj = pts[j]
        if (yi > 0) != (yj > 0) and xi - yi * (xj - xi) / (yj - yi) > 0:
            inside = not inside
        j = i
    return inside


def fence_zones(items: Sequence[MissionItem]) -> tuple[list[Polygon], list[Circle]]:
    """The zones of a FENCE mission: polygons (consecutive vertices, param1 = count) and circles."""
    polygons: list[Polygon] = []
    circles: list[Circle] = []
    k = 0
    while k < len(items):
        it = items[k]
        if it.command in (FENCE_POLY_INCLUSION, FENCE_POLY_EXCLUSION):
            n = max(1, int(it.param1))
            verts = items[k : k + n]
            polygons.append(Polygon(inclusion=it.command == FENCE_POLY_INCLUSION,
                                    points=tuple((v.x / 1e7, v.y / 1e7) for v in verts)))
            k += n
            continue
        if it.command in (FENCE_CIRCLE_INCLUSION, FENCE_CIRCLE_EXCLUSION):
            circles.append(Circle(inclusion=it.command == FENCE_CIRCLE_INCLUSION,
                                  center=(it.x / 1e7, it.y / 1e7), radius_m=it.param1))
        k += 1
    return polygons, circles


def fence_breach(point: tuple[float, float], polygons: Sequence[Polygon], circles: Sequence[Circle]) -> str | None:
    """Why `point` breaches the zones (ArduPilot's rule), or None when it is inside the fence."""
    for i, poly in enumerate(polygons):
        inside = inside_polygon(point, poly.points)
        if poly.inclusion and not inside:
            return f"outside inclusion polygon geoFence.polygons[{i}]"
        if not poly.inclusion and inside:
            return f"inside exclusion polygon geoFence.polygons[{i}]"
    for i, c in enumerate(circles):
        d = distance_m(point, c.center)
        if c.inclusion and d > c.radius_m:
            return f"outside inclusion circle geoFence.circles[{i}] ({d:.0f} m from its centre, radius {c.radius_m:g} m)"
        if not c.inclusion and d <= c.radius_m:
            return f"inside exclusion circle geoFence.circles[{i}] ({d:.0f} m from its centre, radius {c.radius_m:g} m)"
    return None


# ---------------------------------------------------------------------------
# the checks


def _is_nav(item: MissionItem) -> bool:
    return item.command < _NAV_LAST


def _position(item: MissionItem) -> tuple[float, float] | None:
    """lat/lon of a navigation item that names a place (None for "here" and non-positional items)."""
    if not (_is_nav(item) and is_positional(item.command) and item.frame in GLOBAL_FRAMES):
        return None
    if item.x == 0 and item.y == 0:
        return None
    return item.x / 1e7, item.y / 1e7


def _height_above_home(item: MissionItem, home_alt: float | None) -> float | None:
    """Height above home (terrain frames: above the ground), None when the item has no altitude to check."""
    if not (_is_nav(item) and is_positional(item.command)) or math.isnan(item.z):
        return None
    if item.frame in RELATIVE_FRAMES or item.frame in TERRAIN_FRAMES:
        return item.z
    if item.frame in AMSL_FRAMES and home_alt is not None:
        return item.z - home_alt
    return None


def check_plan(
    plan: Plan,
    limits: PlanLimits | None = None,
    *,
    vehicle_class: str | None = None,
    label: Label = plan_label,
) -> list[Finding]:
    """Every finding for `plan`, in item order. `vehicle_class` (copter/plane/rover) beats the plan's vehicleType."""
    limits = limits or PlanLimits()
    items = [it for it in plan.mission if it.seq != 0]
    out: list[Finding] = []
    out += _takeoff(items, _vehicle_class(plan, vehicle_class), label)
    polygons, circles = fence_zones(plan.fence)
    # A home at 0, 0 is "not known" (Mission Planner writes one before the vehicle has a position).
    home_pos = (plan.home[0], plan.home[1]) if plan.home is not None and plan.home[:2] != (0.0, 0.0) else None
    home_alt = plan.home[2] if plan.home is not None and home_pos is not None else None
    previous = home_pos
    for n, it in enumerate(items):
        where, name = label(it.seq), command_name(it.command)
        height = _height_above_home(it, home_alt)
        if height is not None and height < 0:
            ref = "the ground (terrain frame)" if it.frame in TERRAIN_FRAMES else "home"
            out.append(Finding(severity=Severity.REFUSAL, check=Check.BELOW_HOME, where=where, seq=it.seq,
                               message=f"{name} at {height:.1f} m is below {ref}"))
        if height is not None and height > limits.ceiling_m:
            out.append(Finding(severity=Severity.REFUSAL, check=Check.CEILING, where=where, seq=it.seq,
                               message=f"{name} at {height:.1f} m above home is above the ceiling of {limits.ceiling_m:g} m"))
        if it.command in LAND_COMMANDS and n < len(items) - 1:
            rest = len(items) - 1 - n
            after = "the item after it runs" if rest == 1 else f"the {rest} items after it run"
            out.append(Finding(severity=Severity.WARNING, check=Check.LAND_NOT_LAST, where=where, seq=it.seq,
                               message=f"{name} is not the last item: {after} only if the vehicle takes off again "
                                       "(ArduPilot disarms after landing in AUTO)"))
        if it.command == CHANGE_SPEED:
            out += _speed(it, where, limits)
        pos = _position(it)
        if pos is None:
            continue
        if polygons or circles:
            why = fence_breach(pos, polygons, circles)
            if why is not None:
                out.append(Finding(severity=Severity.REFUSAL, check=Check.GEOFENCE, where=where, seq=it.seq,
                                   message=f"{name} at {pos[0]:.7f}, {pos[1]:.7f} is {why} of the plan's own geofence"))
        if previous is not None:
            d = distance_m(previous, pos)
            if d > limits.max_leg_m:
                what = "from home" if previous is home_pos else "from the previous waypoint"
                out.append(Finding(severity=Severity.WARNING, check=Check.DISTANCE, where=where, seq=it.seq,
                                   message=f"{name} is {d:,.0f} m {what} (limit {limits.max_leg_m:g} m)"))
        previous = pos
    return out


def _vehicle_class(plan: Plan, given: str | None) -> str | None:
    if given in set(VehicleClass):
        return given
    return None if plan.vehicle_type is None else vehicle_class_of(plan.vehicle_type).value


def _takeoff(items: Sequence[MissionItem], vclass: str | None, label: Label) -> list[Finding]:
    if vclass not in (None, VehicleClass.COPTER):
        return []
    who = "a copter" if vclass == VehicleClass.COPTER else "a copter (the plan does not say which vehicle)"
    nav = [it for it in items if _is_nav(it)]
    if not nav:
        return []
    first = nav[0]
    if first.command in TAKEOFF_COMMANDS:
        return []
    if not any(it.command in TAKEOFF_COMMANDS for it in nav):
        return [Finding(severity=Severity.WARNING, check=Check.TAKEOFF, where="",
                        message=f"no takeoff item: {who} will not start this mission from the ground "
                                "(ArduCopter: \"Auto: Missing Takeoff Cmd\"); it flies only when started in the air")]
    return [Finding(severity=Severity.WARNING, check=Check.TAKEOFF, where=label(first.seq), seq=first.seq,
                    message=f"the first navigation item is {command_name(first.command)}, not a takeoff: {who} will "
                            "not start this mission from the ground")]


def _speed(it: MissionItem, where: str, limits: PlanLimits) -> list[Finding]:
    speed = it.param2
    if speed in SPEED_KEEP:
        return []
    if math.isnan(speed) or not (0 < speed <= limits.max_speed_m_s):
        return [Finding(severity=Severity.REFUSAL, check=Check.SPEED, where=where, seq=it.seq,
                        message=f"DO_CHANGE_SPEED to {speed:g} m/s is outside (0, {limits.max_speed_m_s:g}] m/s "
                                "(-1: no change)")]
    return []


def describe(findings: Sequence[Finding]) -> str:
    """One line: the refusals (or else the warnings) joined, for a command's detail."""
    return "; ".join(str(f) for f in findings)
