"""The ground side of MAVLink terrain, sans-IO: does the vehicle hold terrain data for a plan?

A mission item in a terrain frame (GLOBAL_TERRAIN_ALT 10, or its _INT 11)
flies at a height above the ground, so the autopilot needs the ground height
under it. mavjet serves no terrain (it sends no TERRAIN_DATA); the vehicle
may hold it all the same (terrain files on its SD card, or a ground station
routed through mavjet that answers its TERRAIN_REQUEST). So the gateway asks
the vehicle before uploading such a plan, and refuses the plan, naming the
item, unless the vehicle says its terrain data there is healthy.

How ArduPilot answers (libraries/AP_Terrain, TerrainGCS.cpp):

- TERRAIN_CHECK(lat, lon) is answered at once with a TERRAIN_REPORT carrying
  that same lat/lon (handle_terrain_check -> send_terrain_report).
  `spacing` is non-zero only when it has terrain heights both at that point
  and at home; `pending` counts the 4x4 blocks its cache still waits for
  (from disk or from a ground station), `loaded` those in memory.
- Asking about a point whose grid is not in its cache makes it load the
  grid (a disk read, or TERRAIN_REQUEST to a ground station), so a first
  answer can say spacing 0 and a later one the real spacing: the check is
  repeated a few times before it is believed.
- It refuses to arm while any block is pending when its mission holds
  terrain items ("waiting for terrain data", AP_Terrain::pre_arm_checks).
- TERRAIN_REPORT is also streamed for the vehicle's own position (MSG_TERRAIN
  in the EXTRA3 stream); those count here only when they happen to be for a
  point asked about.

Healthy for a plan: every terrain item's location answered with spacing != 0,
and nothing pending, in reports received after the question (fresh). A
vehicle that never answers (TERRAIN_ENABLE=0, or PX4, which refuses terrain
frames anyway) is unhealthy. Items with no position (lat = lon = 0: "here")
are not asked about: they use the vehicle's own position.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from mavjet.drivers.mavlink.dialect import MavMessage, mavlink2
from mavjet.drivers.mavlink.mission import MissionItem
from mavjet.drivers.mavlink.normalise import command_name

TERRAIN_FRAMES = frozenset({mavlink2.MAV_FRAME_GLOBAL_TERRAIN_ALT, mavlink2.MAV_FRAME_GLOBAL_TERRAIN_ALT_INT})

Point = tuple[int, int]  # lat, lon in degrees * 1e7


@dataclass(frozen=True, kw_only=True, slots=True)
class TerrainReport:
    """One TERRAIN_REPORT."""

    lat: int
    lon: int
    spacing_m: int  # 0: no terrain data at this point (or at home)
    terrain_height_m: float
    current_height_m: float
    pending: int  # 4x4 blocks still awaited by the vehicle
    loaded: int

    @classmethod
    def from_message(cls, msg: MavMessage) -> TerrainReport:
        return cls(lat=int(msg.lat), lon=int(msg.lon), spacing_m=int(msg.spacing),
                   terrain_height_m=float(msg.terrain_height), current_height_m=float(msg.current_height),
                   pending=int(msg.pending), loaded=int(msg.loaded))  # fmt: skip

    @property
    def healthy(self) -> bool:
        return self.spacing_m != 0 and self.pending == 0


@dataclass(frozen=True, kw_only=True, slots=True)
class TerrainCheckConfig:
    interval_s: float = 0.5  # between rounds of TERRAIN_CHECK for the points not yet healthy
    rounds: int = 6  # times each point is asked before its answer is believed (a disk read takes a round or two)
    # TERRAIN_CHECKs sent per round: a plan with hundreds of terrain items is asked in slices rather than
    # in one burst that floods a radio link (and the vehicle's reply queue).
    max_checks_per_round: int = 32


DEFAULT_TERRAIN_CHECK = TerrainCheckConfig()


def terrain_points(items: Iterable[MissionItem]) -> list[Point]:
    """The distinct locations of terrain-frame items, in plan order."""
    out: dict[Point, None] = {}
    for it in items:
        if it.frame in TERRAIN_FRAMES and (it.x, it.y) != (0, 0):
            out[(it.x, it.y)] = None
    return list(out)


@dataclass(kw_only=True)
class TerrainCheck:
    """TERRAIN_CHECK for each point, re-asked each round until healthy or out of rounds.

    Only reports from the target system received after the machine started
    count; the latest one per point is kept (`reports`).
    """

    points: Sequence[Point]
    target_system: int
    config: TerrainCheckConfig = DEFAULT_TERRAIN_CHECK
    reports: dict[Point, TerrainReport] = field(default_factory=dict)
    rounds_sent: int = 0
    asked: dict[Point, int] = field(default_factory=dict)  # TERRAIN_CHECKs sent per point
    next_deadline: float | None = None
    finished: bool = False

    @property
    def done(self) -> bool:
        return self.finished

    def _healthy(self, p: Point) -> bool:
        r = self.reports.get(p)
        return r is not None and r.healthy

    def _round(self, now: float) -> list[MavMessage]:
        todo = [p for p in self.points if not self._healthy(p) and self.asked.get(p, 0) < self.config.rounds]
        if not todo:
            self.finished, self.next_deadline = True, None
            return []
        # The least-asked points first (stable: plan order among equals), at most a slice per round.
        todo.sort(key=lambda p: self.asked.get(p, 0))
        todo = todo[: max(1, self.config.max_checks_per_round)]
        for p in todo:
            self.asked[p] = self.asked.get(p, 0) + 1
        self.rounds_sent += 1
        self.next_deadline = now + self.config.interval_s
        return [mavlink2.MAVLink_terrain_check_message(lat, lon) for lat, lon in todo]

    def start(self, now: float) -> list[MavMessage]:
        return self._round(now)

    def on_message(self, msg: MavMessage, now: float) -> list[MavMessage]:
        if self.finished or msg.get_type() != "TERRAIN_REPORT" or msg.get_srcSystem() != self.target_system:
            return []
        report = TerrainReport.from_message(msg)
        point = (report.lat, report.lon)
        if point in self.points:
            self.reports[point] = report
            if all(self._healthy(p) for p in self.points):
                self.finished, self.next_deadline = True, None
        return []

    def on_tick(self, now: float) -> list[MavMessage]:
        if self.finished or self.next_deadline is None or now < self.next_deadline:
            return []
        return self._round(now)


def terrain_refusals(items: Sequence[MissionItem], reports: dict[Point, TerrainReport]) -> list[str]:
    """Why each terrain-frame item cannot be flown, named by its plan index (`mission.items[i]`; seq 0 is home)."""
    out: list[str] = []
    for it in items:
        if it.frame not in TERRAIN_FRAMES or (it.x, it.y) == (0, 0):
            continue
        where = f"mission.items[{it.seq - 1}]: {command_name(it.command)} in a terrain frame ({it.frame})"
        r = reports.get((it.x, it.y))
        if r is None:
            out.append(f"{where}: the vehicle did not answer TERRAIN_CHECK (terrain disabled or unsupported)")
        elif r.spacing_m == 0:
            out.append(f"{where}: the vehicle has no terrain data there "
                       f"(TERRAIN_REPORT spacing 0, {r.pending} blocks pending)")  # fmt: skip
        elif r.pending:
            out.append(f"{where}: the vehicle is still loading terrain data ({r.pending} blocks pending)")
    return out

