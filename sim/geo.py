"""Flat-earth geometry for a simulator whose flights span a few kilometres.

An equirectangular projection around the point of interest is accurate to
centimetres over the distances a sortie covers, and is a handful of float
operations: the tick loop calls these for every flying vehicle, 20 times a
second, for up to a thousand vehicles.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

M_PER_DEG_LAT = 111_319.49  # WGS84 equatorial circumference / 360, as ArduPilot's LATLON_TO_M


def m_per_deg_lon(lat_deg: float) -> float:
    return M_PER_DEG_LAT * max(math.cos(math.radians(lat_deg)), 1e-6)


def offset(lat_deg: float, lon_deg: float, north_m: float, east_m: float) -> tuple[float, float]:
    """The point `north_m`/`east_m` away from (lat, lon)."""
    return lat_deg + north_m / M_PER_DEG_LAT, lon_deg + east_m / m_per_deg_lon(lat_deg)


def north_east(lat_deg: float, lon_deg: float, to_lat_deg: float, to_lon_deg: float) -> tuple[float, float]:
    """Metres north and east from the first point to the second."""
    return (to_lat_deg - lat_deg) * M_PER_DEG_LAT, (to_lon_deg - lon_deg) * m_per_deg_lon(lat_deg)


def distance_m(lat_deg: float, lon_deg: float, to_lat_deg: float, to_lon_deg: float) -> float:
    n, e = north_east(lat_deg, lon_deg, to_lat_deg, to_lon_deg)
    return math.hypot(n, e)


def bearing_deg(north_m: float, east_m: float) -> float:
    """Compass bearing (0 = north, clockwise) of a north/east vector, in [0, 360)."""
    return math.degrees(math.atan2(east_m, north_m)) % 360.0


def inside_polygon(lat_deg: float, lon_deg: float, polygon: Sequence[tuple[float, float]]) -> bool:
    """Ray casting point-in-polygon on (lat, lon) vertices; fewer than 3 vertices contain nothing."""
    n = len(polygon)
    if n < 3:
        return False
    inside = False
    j = n - 1
    for i in range(n):
        yi, xi = polygon[i]
        yj, xj = polygon[j]
        if (yi > lat_deg) != (yj > lat_deg):
            x_cross = xi + (lat_deg - yi) * (xj - xi) / (yj - yi)
            if lon_deg < x_cross:
                inside = not inside
        j = i
    return inside
