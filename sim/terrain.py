"""The vehicle side of MAVLink terrain, sans-IO, like ArduPilot with TERRAIN_ENABLE=1 and no terrain files.

A mission item in a terrain frame (GLOBAL_TERRAIN_ALT 10 or its _INT 11)
needs the ground height under it. ArduPilot asks the ground station for it
with TERRAIN_REQUEST (one grid: its south-west corner, the spacing, and a
56-bit mask of the 4x4 blocks it still lacks); the ground station answers one
TERRAIN_DATA per block (`gridbit` 0..55). Until every block of every needed
grid has arrived the vehicle refuses to arm ("waiting for terrain data"), as
a real ArduCopter did in recording mission_roundtrip (section 5).

Simplification: a grid here is the item's position snapped down to
GRID_DEG; the heights sent are stored nowhere (the sim flies terrain
items at their altitude above home). A ground station that echoes the
request's lat/lon/spacing, as the protocol asks, satisfies it.
"""

from __future__ import annotations

from typing import Any, Final

from pymavlink.dialects.v20 import ardupilotmega as mavlink2

TERRAIN_FRAMES: Final = frozenset({mavlink2.MAV_FRAME_GLOBAL_TERRAIN_ALT, mavlink2.MAV_FRAME_GLOBAL_TERRAIN_ALT_INT})
GRID_SPACING_M: Final = 100  # ArduPilot's TERRAIN_SPACING default
GRID_DEG_E7: Final = 100_000  # 0.01 degree
FULL_MASK: Final = (1 << 56) - 1  # 56 blocks of 4x4 points per grid


def _grid_of(lat_e7: int, lon_e7: int) -> tuple[int, int]:
    return (lat_e7 // GRID_DEG_E7) * GRID_DEG_E7, (lon_e7 // GRID_DEG_E7) * GRID_DEG_E7


class TerrainServer:
    """Which terrain grids the vehicle waits for, and what it has received."""

    def __init__(self) -> None:
        self._have: dict[tuple[int, int], int] = {}  # grid -> blocks received (bitmask); survives re-uploads
        self._needed: set[tuple[int, int]] = set()
        self.requests_sent = 0

    def need_for(self, items: list[Any]) -> None:
        """The grids the MISSION `items` (anything with frame, x, y) need; replaces what was needed before."""
        self._needed = {_grid_of(int(it.x), int(it.y)) for it in items if int(it.frame) in TERRAIN_FRAMES}

    @property
    def pending(self) -> list[tuple[int, int]]:
        """Needed grids that still lack blocks, in a stable order."""
        return sorted(g for g in self._needed if self._have.get(g, 0) != FULL_MASK)

    def request(self) -> Any | None:
        """The TERRAIN_REQUEST for the first incomplete grid (None when nothing is missing)."""
        pending = self.pending
        if not pending:
            return None
        lat, lon = pending[0]
        missing = FULL_MASK & ~self._have.get((lat, lon), 0)
        self.requests_sent += 1
        return mavlink2.MAVLink_terrain_request_message(lat, lon, GRID_SPACING_M, missing)

    def on_data(self, msg: Any) -> None:
        """One TERRAIN_DATA block; a block of a grid never requested is kept all the same (like a cache)."""
        bit = int(msg.gridbit)
        if int(msg.grid_spacing) != GRID_SPACING_M or not 0 <= bit < 56:
            return
        key = (int(msg.lat), int(msg.lon))
        self._have[key] = self._have.get(key, 0) | (1 << bit)
