"""The report's per-flight page: the track drawn to scale, altitude and battery over time, the events.

Pure, like analytics.report: input is plain Python data (one flight's row,
its samples and its events, collected by analytics.flightpages), output is
one self-contained HTML page with inline SVG (no scripts, no map tiles).

The track uses an equirectangular projection around the flight's mean
latitude, in metres: x = R * dlon * cos(lat0), y = R * dlat. Over a flight's
few kilometres the error against a true local tangent plane is far below a
pixel, and one scale serves both axes, so a square on the ground is a square
on the page.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Mapping, Sequence
from typing import Any

from analytics.report import CSS, PALETTE, _e, _num, _tick_text, nice_ticks, table

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


def _scale_bar_m(max_m: float) -> float:
    """The largest 1/2/5 x 10^k metres not longer than max_m."""
    if max_m <= 0:
        return 1.0
    mag = 10.0 ** math.floor(math.log10(max_m))
    return max(m * mag for m in (1.0, 2.0, 5.0) if m * mag <= max_m)


def track_svg(points: Sequence[tuple[float, float]], *, size_px: int = 480, pad_px: int = 30) -> str:
    """The track as a polyline, north up, one metre the same length on both axes, with a scale bar."""
    if not points:
        return "<figure><figcaption>track</figcaption><p class=empty>no positions in this flight's data</p></figure>"
    xy = project_m(points)
    xs, ys = [p[0] for p in xy], [p[1] for p in xy]
    span_m = max(max(xs) - min(xs), max(ys) - min(ys), 10.0)
    m_per_px = span_m / (size_px - 2 * pad_px)
    cx, cy = (max(xs) + min(xs)) / 2, (max(ys) + min(ys)) / 2

    def px(p: tuple[float, float]) -> tuple[float, float]:
        return size_px / 2 + (p[0] - cx) / m_per_px, size_px / 2 - (p[1] - cy) / m_per_px

    pts = [px(p) for p in xy]
    line = " ".join(f"{x:.1f},{y:.1f}" for x, y in pts)
    bar_m = _scale_bar_m(span_m / 3)
    bar_px = bar_m / m_per_px
    label = f"{bar_m / 1000:g} km" if bar_m >= 1000 else f"{bar_m:g} m"
    (x0, y0), (x1, y1) = pts[0], pts[-1]
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{size_px}" height="{size_px}" role="img" '
        f'data-m-per-px="{m_per_px:.6g}">',
        f'<rect x="0" y="0" width="{size_px}" height="{size_px}" fill="#fafafa" stroke="#ccc"/>',
        f'<polyline class="track" points="{line}" fill="none" stroke="{PALETTE[0]}" stroke-width="2"/>',
        f'<circle class="start" cx="{x0:.1f}" cy="{y0:.1f}" r="5" fill="{PALETTE[2]}"><title>start</title></circle>',
        f'<circle class="end" cx="{x1:.1f}" cy="{y1:.1f}" r="5" fill="{PALETTE[1]}"><title>end</title></circle>',
        f'<line class="scale-bar" x1="10" x2="{10 + bar_px:.1f}" y1="{size_px - 12}" y2="{size_px - 12}" '
        f'stroke="#222" stroke-width="3"/>',
        f'<text class="scale-label" x="10" y="{size_px - 18}" font-size="11">{_e(label)}</text>',
        f'<text x="{size_px - 16}" y="18" font-size="13" font-weight="bold" text-anchor="middle">N</text>',
        f'<line x1="{size_px - 16}" x2="{size_px - 16}" y1="22" y2="40" stroke="#222" stroke-width="2"/>',
        "</svg>",
    ]
    return (
        f"<figure><figcaption>track ({len(points)} positions, north up, to scale)</figcaption>"
        f"{''.join(parts)}</figure>"
    )


def time_series_svg(
    samples: Sequence[tuple[float, float]], *, title: str, y_label: str, width: int = 720, height: int = 200
) -> str:
    """A line over time: (seconds since the flight started, value); x in minutes."""
    if not samples:
        return f"<figure><figcaption>{_e(title)}</figcaption><p class=empty>no data</p></figure>"
    left, right, top, bottom = 56, 10, 10, 40
    plot_w, plot_h = width - left - right, height - top - bottom
    t_max_min = max(max(t for t, _ in samples) / 60.0, 1.0)
    xt = nice_ticks(t_max_min, integer=True, max_ticks=8)
    lo = min(0.0, *(v for _, v in samples))
    yt = nice_ticks(max(v for _, v in samples) - lo or 1.0, max_ticks=5)
    x_max, y_span = xt[-1] or 1.0, yt[-1] or 1.0

    def px(t_s: float, v: float) -> tuple[float, float]:
        return left + plot_w * (t_s / 60.0) / x_max, top + plot_h * (1 - (v - lo) / y_span)

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img">']
    for t in yt:
        y = top + plot_h * (1 - t / y_span)
        parts.append(
            f'<line x1="{left}" x2="{width - right}" y1="{y:.1f}" y2="{y:.1f}" stroke="#ddd"/>'
            f'<text class="tick-y" x="{left - 4}" y="{y + 4:.1f}" text-anchor="end" font-size="10">'
            f"{_tick_text(t + lo)}</text>"
        )
    for t in xt:
        x = left + plot_w * t / x_max
        parts.append(
            f'<text class="tick-x" x="{x:.1f}" y="{top + plot_h + 14}" text-anchor="middle" font-size="10">'
            f"{_tick_text(t)}</text>"
        )
    line = " ".join("{:.1f},{:.1f}".format(*px(t, v)) for t, v in samples)
    parts.append(f'<polyline class="series" points="{line}" fill="none" stroke="{PALETTE[0]}" stroke-width="1.5"/>')
    parts.append(
        f'<text class="axis-label-x" x="{left + plot_w / 2:.1f}" y="{height - 6}" text-anchor="middle" '
        f'font-size="11">minutes since armed</text>'
        f'<text class="axis-label-y" transform="translate(12,{top + plot_h / 2:.1f}) rotate(-90)" '
        f'text-anchor="middle" font-size="11">{_e(y_label)}</text></svg>'
    )
    return f"<figure><figcaption>{_e(title)}</figcaption>{''.join(parts)}</figure>"


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
        time_series_svg(batt, title="battery remaining", y_label="battery (%)"),
        "<h2>Commands</h2>",
        table(cmds, ["time", "name", "result", "latency_ms"]),
        "<h2>Events</h2>",
        table(evs, ["time", "type", "mode", "alt_m", "battery_pct", "summary"]),
        "</body></html>\n",
    ])
