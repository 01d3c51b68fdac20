"""A geofence as the shadow's `desired.geofence` describes it ⇄ FENCE items + params.

ArduPilot keeps a geofence in two places: the zones (inclusion/exclusion
polygons and circles) are a FENCE-type mission uploaded with the mission
protocol, while the altitude ceiling, the breach action and the switch are
parameters (FENCE_ALT_MAX, FENCE_ACTION, FENCE_TYPE, FENCE_ENABLE). This
module is the pure conversion, so the reconciler can apply both and verify
each by reading back (mission download + digest, PARAM_VALUE).

Document (JSON, all fields optional except at least one zone or max_alt_m):
    {"polygons": [{"inclusion": true, "points": [[lat, lon], ...]}],
     "circles":  [{"inclusion": false, "center": [lat, lon], "radius_m": 50}],
     "max_alt_m": 120, "action": "rtl"}
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from mavjet.drivers.mavlink.dialect import mavlink2
from mavjet.drivers.mavlink.mission import FENCE, MissionItem
from mavjet.drivers.mavlink.plan import (
    FENCE_CIRCLE_EXCLUSION,
    FENCE_CIRCLE_INCLUSION,
    FENCE_POLY_EXCLUSION,
    FENCE_POLY_INCLUSION,
    PlanError,
    digest,
)

#: ArduPilot FENCE_ACTION values.
FENCE_ACTIONS: dict[str, int] = {
    "report": 0,
    "rtl": 1,  # RTL or land
    "land": 2,
    "smart_rtl": 3,  # SmartRTL or RTL or land
    "brake": 4,  # brake or land
    "smart_rtl_land": 5,
}
FENCE_TYPE_ALT_MAX = 1
FENCE_TYPE_POLYGON = 4  # inclusion/exclusion zones uploaded as a FENCE mission
MAX_ALT_LIMIT_M = 10_000.0


class GeofenceError(PlanError):
    """`desired.geofence` is invalid; `path` names the field (e.g. `geofence.circles[0].radius_m`)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Polygon:
    inclusion: bool
    points: tuple[tuple[float, float], ...]  # (lat_deg, lon_deg)


@dataclass(frozen=True, kw_only=True, slots=True)
class Circle:
    inclusion: bool
    center: tuple[float, float]  # (lat_deg, lon_deg)
    radius_m: float


@dataclass(frozen=True, kw_only=True, slots=True)
class Geofence:
    polygons: tuple[Polygon, ...] = ()
    circles: tuple[Circle, ...] = ()
    max_alt_m: float | None = None
    action: str = "rtl"

    def __post_init__(self) -> None:
        if self.action not in FENCE_ACTIONS:
            raise GeofenceError("geofence.action", f"unknown action {self.action!r}; one of {sorted(FENCE_ACTIONS)}")
        if self.max_alt_m is not None and not (0 < self.max_alt_m <= MAX_ALT_LIMIT_M):
            raise GeofenceError("geofence.max_alt_m", f"must be in (0, {MAX_ALT_LIMIT_M}], got {self.max_alt_m}")
        if not self.polygons and not self.circles and self.max_alt_m is None:
            raise GeofenceError("geofence", "needs at least one polygon, circle or max_alt_m")

    def items(self) -> tuple[MissionItem, ...]:
        """The FENCE mission: polygon vertices (param1 = vertex count), then circles (param1 = radius)."""
        out: list[MissionItem] = []
        for poly in self.polygons:
            cmd = FENCE_POLY_INCLUSION if poly.inclusion else FENCE_POLY_EXCLUSION
            for lat, lon in poly.points:
                out.append(
                    MissionItem(
                        seq=len(out), frame=mavlink2.MAV_FRAME_GLOBAL, command=cmd, param1=float(len(poly.points)),
                        x=round(lat * 1e7), y=round(lon * 1e7), mission_type=FENCE,
                    )
                )  # fmt: skip
        for c in self.circles:
            cmd = FENCE_CIRCLE_INCLUSION if c.inclusion else FENCE_CIRCLE_EXCLUSION
            out.append(
                MissionItem(
                    seq=len(out), frame=mavlink2.MAV_FRAME_GLOBAL, command=cmd, param1=c.radius_m,
                    x=round(c.center[0] * 1e7), y=round(c.center[1] * 1e7), mission_type=FENCE,
                )
            )  # fmt: skip
        return tuple(out)

    def params(self) -> dict[str, float]:
        """ArduPilot parameters that make this fence active."""
        fence_type = (FENCE_TYPE_ALT_MAX if self.max_alt_m is not None else 0) | (
            FENCE_TYPE_POLYGON if self.polygons or self.circles else 0
        )
        out: dict[str, float] = {
            "FENCE_ENABLE": 1.0,
            "FENCE_TYPE": float(fence_type),
            "FENCE_ACTION": float(FENCE_ACTIONS[self.action]),
        }
        if self.max_alt_m is not None:
            out["FENCE_ALT_MAX"] = float(self.max_alt_m)
        return out

    @property
    def digest(self) -> str:
        return digest(self.items())


def _latlon(value: Any, path: str) -> tuple[float, float]:
    if not isinstance(value, list | tuple) or len(value) != 2:
        raise GeofenceError(path, "expected [lat, lon]")
    lat, lon = value
    for v in (lat, lon):
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            raise GeofenceError(path, f"expected numbers, got {value!r}")
    if not (-90 <= lat <= 90):
        raise GeofenceError(path, f"latitude {lat} outside [-90, 90]")
    if not (-180 <= lon <= 180):
        raise GeofenceError(path, f"longitude {lon} outside [-180, 180]")
    return float(lat), float(lon)


def _inclusion(obj: Mapping[str, Any], path: str) -> bool:
    inc = obj.get("inclusion", True)
    if not isinstance(inc, bool):
        raise GeofenceError(f"{path}.inclusion", "expected true/false")
    return inc


def _objects(doc: Mapping[str, Any], key: str) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """`doc[key]` as (path, object) pairs, each checked to be an object inside a list.

    A generator, so each item is checked just before the caller validates it:
    the first error in document order is the one reported.
    """
    raw_list = doc.get(key, [])
    if not isinstance(raw_list, list):
        raise GeofenceError(f"geofence.{key}", "expected a list")
    for i, raw in enumerate(raw_list):
        path = f"geofence.{key}[{i}]"
        if not isinstance(raw, Mapping):
            raise GeofenceError(path, "expected an object")
        yield path, raw


def geofence_from_dict(doc: Any) -> Geofence:
    """Validate and convert `desired.geofence`; raises GeofenceError with the field's path."""
    if not isinstance(doc, Mapping):
        raise GeofenceError("geofence", "expected an object")
    unknown = set(doc) - {"polygons", "circles", "max_alt_m", "action"}
    if unknown:
        raise GeofenceError("geofence", f"unknown fields {sorted(unknown)}")
    polygons: list[Polygon] = []
    for path, raw in _objects(doc, "polygons"):
        pts = raw.get("points")
        if not isinstance(pts, list) or len(pts) < 3:
            raise GeofenceError(f"{path}.points", "a polygon needs at least 3 [lat, lon] points")
        polygons.append(
            Polygon(
                inclusion=_inclusion(raw, path),
                points=tuple(_latlon(p, f"{path}.points[{k}]") for k, p in enumerate(pts)),
            )
        )
    circles: list[Circle] = []
    for path, raw in _objects(doc, "circles"):
        radius = raw.get("radius_m")
        if isinstance(radius, bool) or not isinstance(radius, int | float) or not (0 < radius < 1e6):
            raise GeofenceError(f"{path}.radius_m", f"must be a positive number of metres, got {radius!r}")
        circles.append(
            Circle(inclusion=_inclusion(raw, path), center=_latlon(raw.get("center"), f"{path}.center"), radius_m=float(radius))
        )
    max_alt = doc.get("max_alt_m")
    if max_alt is not None and (isinstance(max_alt, bool) or not isinstance(max_alt, int | float)):
        raise GeofenceError("geofence.max_alt_m", f"expected a number, got {max_alt!r}")
    action = doc.get("action", "rtl")
    if not isinstance(action, str):
        raise GeofenceError("geofence.action", "expected a string")
    return Geofence(
        polygons=tuple(polygons),
        circles=tuple(circles),
        max_alt_m=None if max_alt is None else float(max_alt),
        action=action,
    )
