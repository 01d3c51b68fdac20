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
from mavjet.analytics.charts import Mark
from mavjet.analytics.report import CSS, _e, _num, table
from mavjet.contract.events import EventType

EARTH_RADIUS_M = 6_371_000.0
# Next to report.html; not `flights/`, which holds the flights job's Parquet.
PAGES_DIR = "flight-pages"


def project_m(
    points: Sequence[tuple[float, float]], origin: tuple[float, float] | None = None
) -> list[tuple[float, float]]:
    """(lat, lon) degrees -> (east, north) metres from `origin` (default: the points' centre), equirectangular."""
    if not points:
        return []
    lat0, lon0 = origin or centre(points)
    k = math.cos(math.radians(lat0))
    return [
        (EARTH_RADIUS_M * math.radians(lon - lon0) * k, EARTH_RADIUS_M * math.radians(lat - lat0))
        for lat, lon in points
    ]


def centre(points: Sequence[tuple[float, float]]) -> tuple[float, float]:
    return sum(p[0] for p in points) / len(points), sum(p[1] for p in points) / len(points)


# Event type -> the kind of mark it is on the track and the altitude chart.
MARK_KINDS = {
    EventType.FAILSAFE.value: "failsafe",
    EventType.MODE_CHANGED.value: "mode",
    EventType.CMD_RESULT.value: "command",
}


def event_marks(events: Sequence[Mapping[str, Any]], t0: Any) -> tuple[list[Mark], list[Mark], list[tuple[float, float]]]:
    """The flight's failsafes, mode changes and commands as marks: (over time, on the track, their lat/lon).

    Over time every such event is marked (x: seconds since armed); on the
    track those whose snapshot carries a position (the list of lat/lon, to be
    projected with the track; the track marks' x/y are filled in by track_svg).
    """
    timed: list[Mark] = []
    placed: list[Mark] = []
    where: list[tuple[float, float]] = []
    for e in events:
        kind = MARK_KINDS.get(str(e.get("type")))
        if kind is None:
            continue
        t = e.get("time")
        text = f"{_iso(t)} {e.get('summary') or e.get('type')}"
        if isinstance(t, dt.datetime) and isinstance(t0, dt.datetime):
            timed.append(Mark(kind=kind, x=(t - t0).total_seconds(), text=text))
        lat, lon = e.get("lat_deg"), e.get("lon_deg")
        if isinstance(lat, int | float) and isinstance(lon, int | float):
            placed.append(Mark(kind=kind, x=0.0, text=text))
            where.append((float(lat), float(lon)))
    return timed, placed, where


def track_svg(
    points: Sequence[tuple[float, float]],
    marks: Sequence[Mark] = (),
    mark_points: Sequence[tuple[float, float]] = (),
) -> str:
    """The track in metres east/north of its centre, north up, the same scale on both axes, with its marks."""
    if not points:
        return charts.empty_html("track", "no positions in this flight's data")
    origin = centre(points)
    placed = [
        Mark(kind=m.kind, x=x, y=y, text=m.text)
        for m, (x, y) in zip(marks, project_m(mark_points, origin), strict=True)
    ]
    fig = charts.track_figure(project_m(points, origin), marks=placed)
    titles = {"track-start": "start", "track-end": "end", **charts.mark_titles(placed)}
    return charts.figure_html(fig, f"track ({positions_text(len(points))}, north up, to scale)", titles=titles)


def positions_text(n: int) -> str:
    return f"{n:,} position{'' if n == 1 else 's'}"


def time_series_svg(
    samples: Sequence[tuple[float, float]],
    *,
    title: str,
    y_label: str,
    y_range: tuple[float, float] | None = None,
    marks: Sequence[Mark] = (),
) -> str:
    """A line over time: (seconds since the flight started, value); x in minutes; marks as vertical lines."""
    if not samples:
        return charts.empty_html(title)
    fig = charts.time_series_figure(samples, y_label=y_label, y_range=y_range, marks=marks)
    return charts.figure_html(fig, title, titles=charts.mark_titles(marks))


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
    ("commands_accepted", "commands accepted"),
)


def flight_page(
    flight: Mapping[str, Any], samples: Sequence[Mapping[str, Any]], events: Sequence[Mapping[str, Any]]
) -> str:
    """One flight: its numbers, track, altitude and battery over time, commands and events."""
    vid, no = flight["vid"], flight["flight_no"]
    t0 = flight.get("start")
    samples = sorted(samples, key=lambda s: s["time"])
    located = [s for s in samples if s.get("lat_deg") is not None and s.get("lon_deg") is not None]
    positions = [(s["lat_deg"], s["lon_deg"]) for s in located]
    # one count of positions on the page: the track's, split by where they came from
    recorded = sum(1 for s in located if s.get("source") == "track")
    from_events = len(located) - recorded
    timed, placed, where = event_marks(events, t0)

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
    facts += (f"<dt>positions on the track</dt><dd data-key=positions>{_e(positions_text(len(positions)))} "
              f"({recorded:,} from the flight recorder, TWIN_TRACKS; {from_events:,} from events)</dd>")
    modes = " → ".join(flight.get("modes") or [])
    types = ", ".join(flight.get("failsafe_types") or [])
    return "".join([
        "<!doctype html><html lang=en><head><meta charset=utf-8>",
        f"<title>{_e(vid)} flight {_e(no)}</title><style>{CSS}</style></head><body>",
        '<p><a href="../report.html">← report</a></p>',
        f"<h1>{_e(vid)} · flight {_e(no)}</h1>",
        f"<dl class=flight>{facts}<dt>modes</dt><dd>{_e(modes)}</dd><dt>failsafe types</dt><dd>{_e(types or '-')}</dd></dl>",
        "<h2>Track</h2>",
        track_svg(positions, placed, where),
        "<h2>Altitude and battery</h2>",
        time_series_svg(alt, title="altitude above home", y_label="altitude (m)", marks=timed),
        time_series_svg(batt, title="battery remaining", y_label="battery (%)", y_range=(0.0, 100.0)),
        "<h2>Commands</h2>",
        table(cmds, ["time", "name", "result", "latency_ms"]),
        "<h2>Events</h2>",
        table(evs, ["time", "type", "mode", "alt_m", "battery_pct", "summary"]),
        "</body></html>\n",
    ])
