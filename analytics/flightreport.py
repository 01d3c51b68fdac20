"""The report's per-flight page: the track drawn to scale, altitude and battery over time, the events.

Pure, like mavjet.analytics.report: input is plain Python data (one flight's row,
its samples and its events, collected by mavjet.analytics.flightpages), output is
one self-contained HTML page with inline SVG drawn by matplotlib
(mavjet.analytics.charts; no scripts, no map tiles).

The track uses an equirectangular projection around the flight's mean
latitude, in metres: x = R * dlon * cos(lat0), y = R * dlat. Over a flight's
few kilometres the error against a true local tangent plane is far below a
pixel; the axes are in metres with an equal aspect, so a square on the ground
is a square on the page.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Mapping, Sequence
from typing import Any

from mavjet.analytics import charts
from mavjet.analytics.report import CSS, _e, _num, table

EARTH_RADIUS_M = 6_371_000.0
# Next to report.html; not `flights/`, which holds the flights job's Parquet.
PAGES_DIR = "flight-pages"


def project_m(points: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """(lat, lon) degrees -> (east, north) metres from the points' centre, equirectangular."""
    if not points:
        return []
    lat0 = sum(p[0] for p in points) / len(points)
    lon0 = sum(p[1] for p in points) / len(points)
    k = math.cos(math.radians(lat0))
    return [
        (EARTH_RADIUS_M * math.radians(lon - lon0) * k, EARTH_RADIUS_M * math.radians(lat - lat0))
        for lat, lon in points
    ]


def track_svg(points: Sequence[tuple[float, float]]) -> str:
    """The track in metres east/north of its centre, north up, the same scale on both axes."""
    if not points:
        return charts.empty_html("track", "no positions in this flight's data")
    fig = charts.track_figure(project_m(points))
    return charts.figure_html(fig, f"track ({len(points)} positions, north up, to scale)",
                              titles={"track-start": "start", "track-end": "end"})


def time_series_svg(
    samples: Sequence[tuple[float, float]], *, title: str, y_label: str, y_range: tuple[float, float] | None = None
) -> str:
    """A line over time: (seconds since the flight started, value); x in minutes."""
    if not samples:
        return charts.empty_html(title)
    return charts.figure_html(charts.time_series_figure(samples, y_label=y_label, y_range=y_range), title)


def _iso(v: Any) -> str:
    return v.isoformat(sep=" ", timespec="seconds") if isinstance(v, dt.datetime) else _num(v)


def flight_file(vid: str, flight_no: int) -> str:
    """The page's path relative to the report's directory."""
    return f"{PAGES_DIR}/{vid}-{flight_no}.html"


FLIGHT_FIELDS = (
    ("start", "armed"), ("takeoff_time", "takeoff"), ("landing_time", "landed"), ("end", "disarmed"),
    ("duration_s", "armed for (s)"), ("air_s", "in the air (s)"), ("distance_m", "distance (m)"),
    ("max_alt_m", "max altitude (m)"), ("max_speed_mps", "max ground speed (m/s)"),
    ("battery_used_pct", "battery used (%)"), ("failsafes", "failsafes"), ("command_count", "commands"),
    ("commands_accepted", "commands accepted"), ("track_samples", "positions recorded (TWIN_TRACKS)"),
)


def flight_page(
    flight: Mapping[str, Any], samples: Sequence[Mapping[str, Any]], events: Sequence[Mapping[str, Any]]
) -> str:
    """One flight: its numbers, track, altitude and battery over time, commands and events."""
    vid, no = flight["vid"], flight["flight_no"]
    t0 = flight.get("start")
    samples = sorted(samples, key=lambda s: s["time"])
    positions = [(s["lat_deg"], s["lon_deg"]) for s in samples if s.get("lat_deg") is not None and s.get("lon_deg") is not None]

    def since(s: Mapping[str, Any]) -> float:
        return (s["time"] - t0).total_seconds() if isinstance(t0, dt.datetime) else 0.0

    alt = [(since(s), float(s["alt_m"])) for s in samples if s.get("alt_m") is not None]
    batt = [(since(s), float(s["battery_pct"])) for s in samples if s.get("battery_pct") is not None]
    cmds = [
        {"time": _iso(c["time"]), "name": c["name"], "result": c["result"], "latency_ms": c.get("latency_ms")}
        for c in flight.get("commands") or []
    ]
    evs = [{**e, "time": _iso(e["time"])} for e in events]
    facts = "".join(f"<dt>{_e(label)}</dt><dd>{_e(_iso(flight.get(k)))}</dd>" for k, label in FLIGHT_FIELDS)
    modes = " → ".join(flight.get("modes") or [])
    types = ", ".join(flight.get("failsafe_types") or [])
    return "".join([
        "<!doctype html><html lang=en><head><meta charset=utf-8>",
        f"<title>{_e(vid)} flight {_e(no)}</title><style>{CSS}</style></head><body>",
        '<p><a href="../report.html">← report</a></p>',
        f"<h1>{_e(vid)} · flight {_e(no)}</h1>",
        f"<dl class=flight>{facts}<dt>modes</dt><dd>{_e(modes)}</dd><dt>failsafe types</dt><dd>{_e(types or '-')}</dd></dl>",
        "<h2>Track</h2>",
        track_svg(positions),
        "<h2>Altitude and battery</h2>",
        time_series_svg(alt, title="altitude above home", y_label="altitude (m)"),
        time_series_svg(batt, title="battery remaining", y_label="battery (%)", y_range=(0.0, 100.0)),
        "<h2>Commands</h2>",
        table(cmds, ["time", "name", "result", "latency_ms"]),
        "<h2>Events</h2>",
        table(evs, ["time", "type", "mode", "alt_m", "battery_pct", "summary"]),
        "</body></html>\n",
    ])
