"""The vehicle side of MAVLink terrain, sans-IO, as ArduPilot's AP_Terrain does it.

ArduPilot (libraries/AP_Terrain) keeps terrain heights in grid blocks of
28 x 32 points at TERRAIN_SPACING (100 m); a block is 56 sub-blocks of 4x4
points, one bit each in its bitmap. Blocks start on whole degrees and
overlap by one row/column (`grid_of`, AP's calculate_grid_info; checked
against a real TERRAIN_REQUEST in tests/sim/test_terrain.py).

What this module reproduces:

- The cache. A block enters it when a height is looked up there: home, the
  vehicle's position and the 8 blocks around it (update_surrounding_tiles),
  the mission's NAV_WAYPOINT/SPLINE_WAYPOINT items (any frame) and 4 points
  1 km around each (update_mission_data: one point at a time, and only when
  nothing is pending), rally points, and every TERRAIN_CHECK. A new block
  first waits for a disk read (`tick`): with `preloaded` (terrain files on
  the SD card covering the area) it comes back full, otherwise empty.
- TERRAIN_REQUEST (`request`): sent from the stream scheduler (MSG_TERRAIN_REQUEST
  in the EXTRA3 stream, or SET_MESSAGE_INTERVAL 133), never more than once
  per 2 s, for the first incomplete block: the vehicle's own, then the 8
  around it, then any other cached block (mission, rally, TERRAIN_CHECK).
- TERRAIN_DATA (`on_data`): kept only for a block in the cache with the same
  spacing (AP ignores the rest).
- TERRAIN_REPORT (`report`): spacing != 0 only when heights are known at the
  point and at home; pending/loaded count 4x4 sub-blocks over the cache (a
  block waiting for its disk read counts 56 pending). Sent for the vehicle's
  position from the stream scheduler (MSG_TERRAIN_REPORT, id 136), and for a
  TERRAIN_CHECK's point at once.
- The pre-arm check (`prearm_ok`): nothing pending, heights at home and at the
  vehicle, and every mission/rally point looked up; applied by the model only
  when the mission holds terrain-frame items.

Simplifications: the cache holds up to `MAX_BLOCKS` blocks, the oldest looked-up
first out (ArduPilot keeps 12 blocks in RAM and swaps to disk); a preloaded block is flat at the vehicle's ground height.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any, Final

from pymavlink.dialects.v20 import ardupilotmega as mavlink2

TERRAIN_FRAMES: Final = frozenset({mavlink2.MAV_FRAME_GLOBAL_TERRAIN_ALT, mavlink2.MAV_FRAME_GLOBAL_TERRAIN_ALT_INT})
GRID_SPACING_M: Final = 100  # TERRAIN_SPACING default
FULL_MASK: Final = (1 << 56) - 1  # 56 sub-blocks of 4x4 points per block
MAVLINK_SIZE: Final = 4
MUL_X, MUL_Y = 7, 8
BLOCK_SPACING_X: Final = (MUL_X - 1) * MAVLINK_SIZE  # 24: one row of overlap between blocks
BLOCK_SPACING_Y: Final = (MUL_Y - 1) * MAVLINK_SIZE  # 28
REQUEST_GAP_S: Final = 2.0  # AP_Terrain::send_request: "too soon to request again"
MISSION_OFFSET_SPACINGS: Final = 10  # points checked around a waypoint, in grid spacings
MAX_BLOCKS: Final = 1024  # the cache bound (a block is ~1.8 x 2.5 km at 100 m spacing: far more than one flight)
_SCALE: Final = 0.011131884502145034  # metres per 1e-7 degree of latitude (LOCATION_SCALING_FACTOR)
NAV_POINTS: Final = frozenset({mavlink2.MAV_CMD_NAV_WAYPOINT, mavlink2.MAV_CMD_NAV_SPLINE_WAYPOINT})

Block = tuple[int, int]  # south-west corner, degrees * 1e7


def _lon_scale(lat_e7: float) -> float:
    return max(0.01, min(1.0, math.cos(math.radians(lat_e7 * 1e-7))))


def offset(lat: int, lon: int, north_m: float, east_m: float) -> tuple[int, int]:
    """Location::offset (offset_latlng): move a point by metres north/east."""
    dlat = int(north_m / _SCALE)
    dlon = int(east_m / _SCALE / _lon_scale(lat + dlat / 2))
    return lat + dlat, lon + dlon


def grid_info(lat: int, lon: int, spacing_m: int = GRID_SPACING_M) -> tuple[Block, int, int, float, float]:
    """AP_Terrain::calculate_grid_info: the block, the point's index in it and its fractions."""
    lat_deg = int((lat - 9999999 if lat < 0 else lat) / 1e7)
    lon_deg = int((lon - 9999999 if lon < 0 else lon) / 1e7)
    ref_lat, ref_lon = lat_deg * 10**7, lon_deg * 10**7
    north = (lat - ref_lat) * _SCALE
    east = (lon - ref_lon) * _SCALE * _lon_scale((ref_lat + lat) / 2)
    idx_x, idx_y = int(north / spacing_m), int(east / spacing_m)
    gx, gy = idx_x // BLOCK_SPACING_X, idx_y // BLOCK_SPACING_Y
    corner = offset(ref_lat, ref_lon, gx * BLOCK_SPACING_X * spacing_m, gy * BLOCK_SPACING_Y * spacing_m)
    frac_x, frac_y = north / spacing_m - idx_x, east / spacing_m - idx_y
    return corner, idx_x % BLOCK_SPACING_X, idx_y % BLOCK_SPACING_Y, frac_x, frac_y


def grid_of(lat: int, lon: int) -> Block:
    return grid_info(lat, lon)[0]


def _bit(idx_x: int, idx_y: int) -> int:
    return idx_y // MAVLINK_SIZE + MUL_Y * (idx_x // MAVLINK_SIZE)


class _Block:
    __slots__ = ("bitmap", "diskwait", "heights")

    def __init__(self) -> None:
        self.bitmap = 0
        self.diskwait = True  # a new block waits for its disk read first
        self.heights: dict[tuple[int, int], int] = {}  # (x, y) -> metres AMSL


class TerrainServer:
    """One vehicle's terrain cache; the model calls `tick` at 1 Hz and the handlers per message."""

    def __init__(self, *, preloaded: bool = False, ground_amsl_m: float = 0.0) -> None:
        self.preloaded = preloaded  # terrain files for the area on the "SD card"
        self.ground_amsl_m = ground_amsl_m
        self.blocks: dict[Block, _Block] = {}
        self.requests_sent = 0
        self._last_request: float | None = None
        self._points: list[tuple[int, int]] = []  # mission and rally points still to look up, in order
        self._points_pos = 0

    # -- lookups --------------------------------------------------------------
    def _block(self, corner: Block) -> _Block:
        b = self.blocks.get(corner)
        if b is None:
            if len(self.blocks) >= MAX_BLOCKS:  # a long flight or a stream of TERRAIN_CHECKs: oldest first out
                del self.blocks[next(iter(self.blocks))]
            b = self.blocks[corner] = _Block()
        return b

    def height(self, lat: int, lon: int) -> float | None:
        """AP_Terrain::height_amsl: bilinear over the 4 points around; caches the block on a miss."""
        corner, x, y, fx, fy = grid_info(lat, lon)
        b = self._block(corner)
        if b.diskwait or any(not b.bitmap >> _bit(x + dx, y + dy) & 1 for dx in (0, 1) for dy in (0, 1)):
            return None
        h = {(dx, dy): b.heights.get((x + dx, y + dy), round(self.ground_amsl_m)) for dx in (0, 1) for dy in (0, 1)}
        a1 = (1 - fx) * h[0, 0] + fx * h[1, 0]
        a2 = (1 - fx) * h[0, 1] + fx * h[1, 1]
        return (1 - fy) * a1 + fy * a2

    def stats(self) -> tuple[int, int]:
        """(pending, loaded) 4x4 sub-blocks, as get_statistics counts them."""
        pending = loaded = 0
        for b in self.blocks.values():
            if b.diskwait:
                pending += 56
                continue
            n = b.bitmap.bit_count()
            pending += 56 - n
            loaded += n
        return pending, loaded

    # -- the 1 Hz update --------------------------------------------------------
    def set_points(self, items: Iterable[Any], rally: Iterable[Any] = ()) -> None:
        """The mission (NAV_WAYPOINT/SPLINE, any frame, with a position) and rally points: looked up again from the start."""
        pts: list[tuple[int, int]] = []
        for it in items:
            if int(it.command) in NAV_POINTS and (int(it.x), int(it.y)) != (0, 0):
                lat, lon = int(it.x), int(it.y)
                for k in range(4):  # 4 points at 45, 135, 225, 315 degrees, then the point itself
                    bearing = math.radians(45 + 90 * k)
                    d = MISSION_OFFSET_SPACINGS * GRID_SPACING_M
                    pts.append(offset(lat, lon, d * math.cos(bearing), d * math.sin(bearing)))
                pts.append((lat, lon))
        pts.extend((int(r.x), int(r.y)) for r in rally)
        self._points, self._points_pos = pts, 0

    @property
    def points_done(self) -> bool:
        return self._points_pos >= len(self._points)

    def tick(self, position: tuple[int, int] | None, home: tuple[int, int] | None) -> None:
        """Disk reads finish; home, the vehicle's surroundings and the next mission points are looked up."""
        for b in self.blocks.values():
            if b.diskwait:
                b.diskwait = False
                if self.preloaded:
                    b.bitmap = FULL_MASK
        if home is not None:
            self.height(*home)
        if position is not None:
            for x in (-1, 0, 1):
                for y in (-1, 0, 1):
                    self.height(*offset(*position, x * MUL_X * MAVLINK_SIZE * 0.7 * GRID_SPACING_M,
                                        y * MUL_Y * MAVLINK_SIZE * 0.7 * GRID_SPACING_M))  # fmt: skip
        if self.stats()[0] and position is not None:
            return  # update_mission_data: wait until what is cached is filled
        for _ in range(20):
            if self.points_done or self.height(*self._points[self._points_pos]) is None:
                return
            self._points_pos += 1

    def prearm_ok(self, position: tuple[int, int] | None, home: tuple[int, int] | None) -> bool:
        """AP_Terrain::pre_arm_checks."""
        have_here = position is not None and self.height(*position) is not None
        have_home = home is not None and self.height(*home) is not None
        return self.stats()[0] == 0 and have_here and have_home and self.points_done

    # -- messages ---------------------------------------------------------------
    def request(self, position: tuple[int, int] | None, now: float) -> Any | None:
        """MSG_TERRAIN_REQUEST's turn in the stream: the first incomplete block, at most every 2 s."""
        if position is None or (self._last_request is not None and now - self._last_request < REQUEST_GAP_S):
            return None
        here = grid_of(*position)
        around = [grid_of(*offset(*position, x * MUL_X * MAVLINK_SIZE * 0.7 * GRID_SPACING_M,
                                  y * MUL_Y * MAVLINK_SIZE * 0.7 * GRID_SPACING_M))
                  for x in (-1, 0, 1) for y in (-1, 0, 1)]  # fmt: skip
        for corner in [here, *around, *self.blocks]:
            b = self._block(corner)
            if b.diskwait or b.bitmap == FULL_MASK:
                continue
            self._last_request = now
            self.requests_sent += 1
            return mavlink2.MAVLink_terrain_request_message(corner[0], corner[1], GRID_SPACING_M, FULL_MASK & ~b.bitmap)
        return None

    def on_data(self, msg: Any) -> None:
        """One TERRAIN_DATA sub-block; ignored unless its block is cached with this spacing."""
        bit, key = int(msg.gridbit), (int(msg.lat), int(msg.lon))
        b = self.blocks.get(key)
        if b is None or int(msg.grid_spacing) != GRID_SPACING_M or not 0 <= bit < 56:
            return
        x0, y0 = (bit // MUL_Y) * MAVLINK_SIZE, (bit % MUL_Y) * MAVLINK_SIZE
        for i, h in enumerate(msg.data):
            b.heights[(x0 + i // MAVLINK_SIZE, y0 + i % MAVLINK_SIZE)] = int(h)
        b.bitmap |= 1 << bit

    def report(self, lat: int, lon: int, *, home: tuple[int, int] | None, rel_alt_m: float) -> Any:
        """TERRAIN_REPORT for a point (send_terrain_report without extrapolation)."""
        here = self.height(lat, lon)
        home_h = self.height(*home) if home is not None else None
        pending, loaded = self.stats()
        if here is None or home_h is None:
            return mavlink2.MAVLink_terrain_report_message(lat, lon, 0, 0.0, 0.0, pending, loaded)
        return mavlink2.MAVLink_terrain_report_message(
            lat, lon, GRID_SPACING_M, here, rel_alt_m + home_h - here, pending, loaded)
