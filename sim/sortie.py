"""The built-in sortie: a vehicle that flies on its own so a demo has something to show.

Each vehicle, independently: wait for GPS and EKF, GUIDED, arm, take off,
fly a few waypoints around its start point, RTL, land (the autopilot
disarms), pause with a fresh battery, repeat. Vehicles start at different
times and fly different-sized loops, so a fleet table never shows them in
lockstep.

The sortie drives the vehicle through the same calls a ground station's
commands end in (`set_mode`, `arm`, `takeoff`, `goto`), and steps aside for
good as soon as a ground station commands flight itself
(`VehicleModel.external_control`). A failsafe taking over (RTL or LAND) is
respected: the sortie waits for the landing and starts again.
"""

from __future__ import annotations

import math
import random
from typing import TYPE_CHECKING, Final

from mavjet.sim import geo

if TYPE_CHECKING:
    from mavjet.sim.model import VehicleModel

RETRY_S: Final = 3.0
ACCEPTED: Final = 0


class Sortie:
    def __init__(self, *, index: int, seed: int = 0) -> None:
        rng = random.Random(seed)
        self.index = index
        self.start_at = 2.0 + 4.0 * (index % 10) + rng.uniform(0.0, 2.0)
        self.alt_m = 15.0 + 5.0 * (index % 4)
        self.radius_m = 40.0 + 15.0 * (index % 5)
        self.pause_s = 8.0 + rng.uniform(0.0, 6.0)
        self.turn = (index * 37.0) % 360.0
        self.phase = "wait"
        self.next_at = self.start_at
        self.waypoints: list[tuple[float, float]] = []
        self.leg = 0
        self.flights = 0

    def _plan(self, v: VehicleModel) -> None:
        self.waypoints = []
        for k in range(4):
            ang = math.radians(self.turn + 90.0 * k)
            n, e = self.radius_m * math.cos(ang), self.radius_m * math.sin(ang)
            self.waypoints.append(geo.offset(v.lat_deg, v.lon_deg, n, e))

    def step(self, v: VehicleModel, now: float) -> None:
        if now < self.next_at:
            return
        phase = self.phase
        if phase == "wait":
            if not v.position_ok:
                return
            if v.set_mode(v.flavour.guided, reason="sortie") != ACCEPTED or v.arm() != ACCEPTED:
                self.next_at = now + RETRY_S
                return
            self._plan(v)
            if v.takeoff(self.alt_m) != ACCEPTED:
                self.next_at = now + RETRY_S
                return
            self.phase = "climb"
        elif phase == "climb":
            if self._interrupted(v):
                return
            if v.takeoff_alt_m is None and v.alt_m >= self.alt_m - 0.5:
                self.leg = 0
                self._goto(v)
                self.phase = "legs"
        elif phase == "legs":
            if self._interrupted(v):
                return
            lat, lon = self.waypoints[self.leg]
            if geo.distance_m(v.lat_deg, v.lon_deg, lat, lon) < 1.0:
                self.leg += 1
                if self.leg >= len(self.waypoints):
                    v.set_mode(v.flavour.rtl, reason="sortie")
                    self.phase = "landing"
                else:
                    self._goto(v)
        elif phase == "landing":
            if not v.armed:
                self.flights += 1
                self.phase = "pause"
                self.next_at = now + self.pause_s
        elif phase == "pause":
            if v.battery_pct < 60.0:
                v.set_battery_pct(100.0)  # the ground crew swaps the pack
            self.phase = "wait"

    def _goto(self, v: VehicleModel) -> None:
        lat, lon = self.waypoints[self.leg]
        v.goto(lat, lon, self.alt_m)

    def _interrupted(self, v: VehicleModel) -> bool:
        """Disarmed or taken over by a failsafe: wait for the ground, then start again."""
        if not v.armed or v.fmode.behaviour != "guided":
            self.phase = "landing"
            return True
        return False
