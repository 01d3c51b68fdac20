"""The flight recorder's samples for a synthetic flight (`mavjet synth --track-hz`).

`mavjet.analytics.synth` moves a vehicle in steps: at every event of a flight it
has a position, altitude and battery (the event's snapshot). A `FlightPath`
keeps those states from `armed` to `disarmed` and samples them the way the
gateway's recorder (gateway/stores/recorder.py) samples a real vehicle: one sample
at the armed event, one every `1 / track_hz` seconds after it, one at the
disarmed event (armed = false), nothing while the link is lost (the recorder
has no new position then). Between two events the vehicle flies straight and
level-changes linearly, so every sample lies between the states of the
events around it and the dense track agrees with the sparse one the events
draw. Payloads come from `mavjet.contract.tracks`, the recorder's own
packing, so a reader cannot tell a synthetic track from a recorded one.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

from mavjet.contract.events import EventType
from mavjet.contract.tracks import track_sample
from mavjet.contract.units import haversine_m

HOME_ALT_MSL_M = 488.0  # the synthetic homes' ground level above sea level
MOVING_M = 0.5  # below this horizontal step a heading means nothing: left out


class Key(NamedTuple):
    """The vehicle's state at one event of a flight."""

    time_ns: int
    lat_deg: float
    lon_deg: float
    alt_m: float
    battery_pct: float
    type: str


def bearing_deg(lat1: float, lon1: float, lat2: float, lon2: float) -> float:
    p1, p2 = math.radians(lat1), math.radians(lat2)
    dl = math.radians(lon2 - lon1)
    y = math.sin(dl) * math.cos(p2)
    x = math.cos(p1) * math.sin(p2) - math.sin(p1) * math.cos(p2) * math.cos(dl)
    return math.degrees(math.atan2(y, x)) % 360.0


def period_ns(track_hz: float) -> int:
    if not 0 < track_hz <= 50:
        raise ValueError("track_hz must be > 0 and <= 50")
    return max(1, round(1e9 / track_hz))


@dataclass(frozen=True, slots=True)
class FlightPath:
    """One synthetic flight's states, `armed` first and `disarmed` last, in time order."""

    vid: str
    keys: tuple[Key, ...]

    @property
    def start_ns(self) -> int:
        return self.keys[0].time_ns

    @property
    def end_ns(self) -> int:
        return self.keys[-1].time_ns

    def outages(self) -> list[tuple[int, int]]:
        """(link_lost, link_restored) spans: the recorder has no new position inside them."""
        spans: list[tuple[int, int]] = []
        lost: int | None = None
        for k in self.keys:
            if k.type == EventType.LINK_LOST:
                lost = k.time_ns
            elif k.type == EventType.LINK_RESTORED and lost is not None:
                spans.append((lost, k.time_ns))
                lost = None
        return spans

    def sample_times(self, every_ns: int) -> Iterator[int]:
        """The armed time, then every `every_ns` after it, then the disarmed time; none inside an outage."""
        gaps = self.outages()
        t = self.start_ns
        while t < self.end_ns:
            if not any(lo < t < hi for lo, hi in gaps):
                yield t
            t += every_ns
        yield self.end_ns

    def state_at(self, t_ns: int, times: list[int] | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
        """The position and battery channels (the twin's names) at `t_ns`, between the events around it."""
        if times is None:
            times = [k.time_ns for k in self.keys]
        i = min(max(bisect.bisect_right(times, t_ns), 1), len(self.keys) - 1)
        a, b = self.keys[i - 1], self.keys[i]
        span = b.time_ns - a.time_ns
        f = 0.0 if span <= 0 else min(1.0, max(0.0, (t_ns - a.time_ns) / span))
        alt_m = a.alt_m + (b.alt_m - a.alt_m) * f
        position: dict[str, Any] = {
            "lat_deg": a.lat_deg + (b.lat_deg - a.lat_deg) * f,
            "lon_deg": a.lon_deg + (b.lon_deg - a.lon_deg) * f,
            "alt_m": alt_m,
            "alt_msl_m": alt_m + HOME_ALT_MSL_M,
            "groundspeed_m_s": 0.0,
        }
        step_m = haversine_m(a.lat_deg, a.lon_deg, b.lat_deg, b.lon_deg)
        if span > 0 and step_m >= MOVING_M:
            position["groundspeed_m_s"] = step_m / (span / 1e9)
            position["heading_deg"] = bearing_deg(a.lat_deg, a.lon_deg, b.lat_deg, b.lon_deg)
        battery = {"remaining_pct": a.battery_pct + (b.battery_pct - a.battery_pct) * f}
        return position, battery

    def samples(self, every_ns: int) -> Iterator[tuple[int, dict[str, Any]]]:
        """(time_ns, track sample data) for the whole flight, in time order."""
        times = [k.time_ns for k in self.keys]
        for t in self.sample_times(every_ns):
            position, battery = self.state_at(t, times)
            yield t, track_sample(position, battery, armed=t != self.end_ns)
