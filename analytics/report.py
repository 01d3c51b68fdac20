"""The replay's human report: one self-contained HTML file with inline SVG charts.

No JavaScript, no CDN, no server: the file opens from disk in any browser and
can be mailed around. Input is plain Python data (the small aggregates the
replay collected), so this module is pure and testable without Spark.
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")


def _legend(series: Iterable[str], *, x: float, y: float, gap: float) -> list[str]:
    """Colour swatch + name for each series, left to right from (x, y)."""
    out = []
    for k, name in enumerate(series):
        out.append(
            f'<rect x="{x}" y="{y}" width="10" height="10" fill="{PALETTE[k % len(PALETTE)]}"/>'
            f'<text x="{x + 14}" y="{y + 9}" font-size="11">{_e(name)}</text>'
        )
        x += gap + 8 * len(name)
    return out


def _e(v: Any) -> str:
    return html.escape(str(v), quote=True)


def _num(v: Any, digits: int = 1) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        if math.isnan(v):
            return "-"
        return f"{v:,.{digits}f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def nice_ticks(vmax: float, *, integer: bool = False, max_ticks: int = 6) -> list[float]:
    """Ticks 0..>= vmax at a step of 1, 2 or 5 x 10^k, at most `max_ticks` + 1 of them.

    With `integer` the step is at least 1, so a count axis never shows 0.5
    (what matplotlib's MaxNLocator(integer=True) does).
    """
    vmax = max(float(vmax), 1.0 if integer else 1e-9)
    raw = vmax / max_ticks
    mag = 10.0 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1.0, 2.0, 5.0, 10.0) if m * mag >= raw)
    if integer:
        step = max(1.0, float(math.ceil(step)))
    n = math.ceil(vmax / step - 1e-9)
    return [round(i * step, 10) for i in range(n + 1)]


def _tick_text(v: float) -> str:
    return f"{int(v):,}" if float(v).is_integer() else f"{v:,.2g}"


# Width of one character at font-size 10 in a sans-serif face, generously:
# used to space date labels so that neighbours never overlap.
CHAR_W_10PX = 6.5


def label_step(labels: Sequence[str], slot_w: float, *, font_px: float = 10.0, gap_px: float = 8.0) -> int:
    """Show every n-th label so that labels `slot_w` apart do not overlap."""
    if not labels:
        return 1
    need = max(len(x) for x in labels) * CHAR_W_10PX * font_px / 10.0 + gap_px
    return max(1, math.ceil(need / max(slot_w, 1e-9)))


def bar_chart(
    items: Sequence[tuple[str, float]],
    *,
    title: str,
    unit: str = "",
    width: int = 720,
    bar_h: int = 16,
    x_label: str = "",
    y_label: str = "",
    integer: bool = True,
) -> str:
    """Horizontal bars, one per (label, value), with a value axis (integer ticks for counts)."""
    if not items:
        return f"<figure><figcaption>{_e(title)}</figcaption><p class=empty>no data</p></figure>"
    label_w, pad, top = 140, 60, 5
    ticks = nice_ticks(max(v for _, v in items), integer=integer)
    vmax = ticks[-1] or 1.0
    plot_w = width - label_w - pad
    plot_h = len(items) * (bar_h + 4)
    h = top + plot_h + 40
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{h}" role="img">']
    for t in ticks:
        x = label_w + plot_w * t / vmax
        parts.append(
            f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{top}" y2="{top + plot_h}" stroke="#ddd"/>'
            f'<text class="tick-x" x="{x:.1f}" y="{top + plot_h + 12}" text-anchor="middle" font-size="10">'
            f"{_tick_text(t)}</text>"
        )
    for i, (label, v) in enumerate(items):
        y = top + i * (bar_h + 4)
        w = max(1.0, plot_w * v / vmax)
        parts.append(
            f'<text class="category" x="{label_w - 6}" y="{y + bar_h - 4}" text-anchor="end" font-size="11">'
            f"{_e(label)}</text>"
            f'<rect x="{label_w}" y="{y}" width="{w:.1f}" height="{bar_h}" fill="{PALETTE[0]}"><title>'
            f"{_e(label)}: {_num(v)} {_e(unit)}</title></rect>"
            f'<text x="{label_w + w + 4:.1f}" y="{y + bar_h - 4}" font-size="11">{_num(v)}</text>'
        )
    if x_label:
        parts.append(
            f'<text class="axis-label-x" x="{label_w + plot_w / 2:.1f}" y="{h - 8}" text-anchor="middle" '
            f'font-size="11">{_e(x_label)}</text>'
        )
    if y_label:
        parts.append(
            f'<text class="axis-label-y" x="4" y="{h - 8}" font-size="11">{_e(y_label)}</text>'
        )
    parts.append("</svg>")
    return f"<figure><figcaption>{_e(title)}</figcaption>{''.join(parts)}</figure>"


def stacked_columns(
    days: Sequence[str],
    series: Mapping[str, Sequence[float]],
    *,
    title: str,
    width: int = 720,
    height: int = 240,
    y_label: str = "count",
    x_label: str = "day (UTC)",
    integer: bool = True,
) -> str:
    """Vertical stacked columns over days, one colour per series, with a legend.

    The y axis has integer ticks when the values are counts, and date labels
    are thinned so that neighbours never overlap.
    """
    if not days:
        return f"<figure><figcaption>{_e(title)}</figcaption><p class=empty>no data</p></figure>"
    left, bottom, top = 56, 44, 10
    plot_w, plot_h = width - left - 10, height - bottom - top
    totals = [sum(s[i] for s in series.values()) for i in range(len(days))]
    ticks = nice_ticks(max(totals), integer=integer, max_ticks=5)
    vmax = ticks[-1] or 1.0
    col_w = plot_w / len(days)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height + 20}" role="img">']
    for t in ticks:
        y = top + plot_h * (1 - t / vmax)
        parts.append(
            f'<line x1="{left}" x2="{width - 10}" y1="{y:.1f}" y2="{y:.1f}" stroke="#ddd"/>'
            f'<text class="tick-y" x="{left - 4}" y="{y + 4:.1f}" text-anchor="end" font-size="10">'
            f"{_tick_text(t)}</text>"
        )
    for i, day in enumerate(days):
        x = left + i * col_w
        y = top + plot_h
        for k, (name, values) in enumerate(series.items()):
            v = values[i]
            if v <= 0:
                continue
            hgt = plot_h * v / vmax
            y -= hgt
            parts.append(
                f'<rect x="{x + 0.5:.1f}" y="{y:.1f}" width="{max(0.5, col_w - 1):.1f}" height="{hgt:.1f}" '
                f'fill="{PALETTE[k % len(PALETTE)]}"><title>{_e(day)} {_e(name)}: {_num(v, 0)}</title></rect>'
            )
    step = label_step(days, col_w)
    for i in range(0, len(days), step):
        x = left + i * col_w + col_w / 2
        parts.append(
            f'<text class="tick-x" x="{x:.1f}" y="{top + plot_h + 14}" text-anchor="middle" font-size="10">'
            f"{_e(days[i])}</text>"
        )
    parts.append(
        f'<text class="axis-label-x" x="{left + plot_w / 2:.1f}" y="{top + plot_h + 30}" text-anchor="middle" '
        f'font-size="11">{_e(x_label)}</text>'
        f'<text class="axis-label-y" transform="translate(12,{top + plot_h / 2:.1f}) rotate(-90)" '
        f'text-anchor="middle" font-size="11">{_e(y_label)}</text>'
    )
    parts.extend(_legend(series, x=left, y=height + 4, gap=20))
    parts.append("</svg>")
    return f"<figure><figcaption>{_e(title)}</figcaption>{''.join(parts)}</figure>"


def grouped_log_bars(
    groups: Sequence[str], series: Mapping[str, Sequence[float | None]], *, title: str, unit: str, width: int = 720
) -> str:
    """Horizontal grouped bars on a log scale (latencies span ms to seconds)."""
    if not groups:
        return f"<figure><figcaption>{_e(title)}</figcaption><p class=empty>no data</p></figure>"
    label_w, pad, bar_h = 120, 70, 10
    vals = [v for s in series.values() for v in s if v is not None and v > 0]
    lo = math.floor(math.log10(min(vals))) if vals else 0
    hi = math.ceil(math.log10(max(vals))) if vals else 1
    hi = max(hi, lo + 1)
    span_w = width - label_w - pad
    group_h = len(series) * (bar_h + 2) + 8
    h = len(groups) * group_h + 30
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{h}" role="img">']
    for d in range(lo, hi + 1):
        x = label_w + span_w * (d - lo) / (hi - lo)
        parts.append(
            f'<line x1="{x:.1f}" x2="{x:.1f}" y1="0" y2="{h - 28}" stroke="#ddd"/>'
            f'<text x="{x:.1f}" y="{h - 16}" text-anchor="middle" font-size="10">{_num(10.0**d, 0 if d >= 0 else -d)} {_e(unit)}</text>'
        )
    for g, name in enumerate(groups):
        y0 = g * group_h + 4
        parts.append(
            f'<text x="{label_w - 6}" y="{y0 + group_h / 2:.1f}" text-anchor="end" font-size="11">{_e(name)}</text>'
        )
        for k, (sname, values) in enumerate(series.items()):
            v = values[g]
            if v is None or v <= 0:
                continue
            w = max(1.0, span_w * (math.log10(v) - lo) / (hi - lo))
            y = y0 + k * (bar_h + 2)
            parts.append(
                f'<rect x="{label_w}" y="{y}" width="{w:.1f}" height="{bar_h}" fill="{PALETTE[k % len(PALETTE)]}">'
                f"<title>{_e(name)} {_e(sname)}: {_num(v)} {_e(unit)}</title></rect>"
                f'<text x="{label_w + w + 3:.1f}" y="{y + bar_h - 1}" font-size="9">{_num(v)}</text>'
            )
    parts.append(
        f'<text class="axis-label-x" x="{width - 4}" y="{h - 10}" text-anchor="end" font-size="11">'
        f"{_e(unit)}, log scale</text>"
    )
    parts.extend(_legend(series, x=label_w, y=h - 10, gap=30))
    parts.append("</svg>")
    return f"<figure><figcaption>{_e(title)}</figcaption>{''.join(parts)}</figure>"


def table(rows: Sequence[dict[str, Any]], columns: Sequence[str], *, title: str = "") -> str:
    head = "".join(f"<th>{_e(c)}</th>" for c in columns)
    body = "".join(
        "<tr>" + "".join(f"<td>{_e(_num(r.get(c)))}</td>" for c in columns) + "</tr>" for r in rows
    )
    cap = f"<caption>{_e(title)}</caption>" if title else ""
    return f"<table>{cap}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


@dataclass(slots=True, kw_only=True)
class ReportData:
    title: str = "mavjet replay"
    range_text: str = ""
    summary: dict[str, Any] = field(default_factory=dict)
    flights_per_vehicle: list[tuple[str, float]] = field(default_factory=list)
    failsafe_days: list[str] = field(default_factory=list)
    failsafe_series: dict[str, list[float]] = field(default_factory=dict)
    command_rows: list[dict[str, Any]] = field(default_factory=list)
    top_failsafe_vehicles: list[dict[str, Any]] = field(default_factory=list)
    timelines: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    kpis: dict[str, Any] = field(default_factory=dict)
    chain_rows: list[dict[str, Any]] = field(default_factory=list)
    # one dict per flight page: vid, flight_no, start, air_s, distance_m, failsafes, href
    flight_links: list[dict[str, Any]] = field(default_factory=list)


# KPI key -> (label, digits, scale): rates are shown as percentages.
KPI_LABELS = {
    "flights": ("flights", 0, 1.0),
    "vehicles": ("vehicles that flew", 0, 1.0),
    "flight_hours": ("flight hours (airborne)", 1, 1.0),
    "failsafes": ("failsafes", 0, 1.0),
    "failsafe_rate": ("flights with a failsafe (%)", 1, 100.0),
    "failsafes_per_100h": ("failsafes per 100 flight hours", 1, 1.0),
    "commands": ("commands answered", 0, 1.0),
    "command_success_rate": ("commands accepted (%)", 1, 100.0),
    "median_cmd_latency_ms": ("median command latency, accepted (ms)", 1, 1.0),
    "median_effect_latency_ms": ("median latency to effect (ms)", 1, 1.0),
}


def kpi_list(kpis: Mapping[str, Any]) -> str:
    items = []
    for key, (label, digits, scale) in KPI_LABELS.items():
        if key not in kpis:
            continue
        v = kpis[key]
        text = _num(v * scale if isinstance(v, int | float) and scale != 1.0 else v, digits)
        items.append(f'<dt>{_e(label)}</dt><dd class="kpi" data-kpi="{_e(key)}">{_e(text)}</dd>')
    return f"<dl class=kpis>{''.join(items)}</dl>"


def flight_index(links: Sequence[Mapping[str, Any]]) -> str:
    cols = ("start", "air_s", "distance_m", "max_alt_m", "failsafes")
    head = "<th>flight</th>" + "".join(f"<th>{_e(c)}</th>" for c in cols)
    body = "".join(
        f'<tr><td><a href="{_e(r["href"])}">{_e(r["vid"])} #{_e(r["flight_no"])}</a></td>'
        + "".join(f"<td>{_e(_num(r.get(c)))}</td>" for c in cols)
        + "</tr>"
        for r in links
    )
    return f"<table class=flights><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


CSS = """
body{font-family:system-ui,sans-serif;margin:2em;max-width:900px;color:#222}
h1{font-size:1.5em}h2{font-size:1.2em;margin-top:2em;border-bottom:1px solid #ccc}
table{border-collapse:collapse;margin:1em 0;font-size:13px}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}
th{background:#f3f3f3}caption{text-align:left;font-weight:bold;padding:4px 0}
figure{margin:1em 0}figcaption{font-weight:bold;margin-bottom:4px}.empty{color:#888}
dl{display:grid;grid-template-columns:max-content auto;gap:2px 12px}dt{font-weight:bold}
"""


def render(d: ReportData) -> str:
    cmd_names = [str(r["name"]) for r in d.command_rows]
    parts = [
        "<!doctype html><html lang=en><head><meta charset=utf-8>",
        f"<title>{_e(d.title)}</title><style>{CSS}</style></head><body>",
        f"<h1>{_e(d.title)}</h1><p>{_e(d.range_text)}</p>",
        "<dl>" + "".join(f"<dt>{_e(k)}</dt><dd>{_e(_num(v))}</dd>" for k, v in d.summary.items()) + "</dl>",
        *(["<h2>Fleet KPIs</h2>", kpi_list(d.kpis)] if d.kpis else []),
        "<h2>Flights per vehicle</h2>",
        bar_chart(
            d.flights_per_vehicle, title="flights (vehicles with the most flights)", unit="flights",
            x_label="flights", y_label="vehicle",
        ),
        "<h2>Failsafes over time</h2>",
        stacked_columns(
            d.failsafe_days, d.failsafe_series, title="failsafes per day, by type", y_label="failsafes per day"
        ),
        table(d.top_failsafe_vehicles, ["vid", "failsafes", "types"], title="vehicles with the most failsafes"),
        "<h2>Command latency</h2>",
        grouped_log_bars(
            cmd_names,
            {
                "p50": [r.get("latency_p50_ms") for r in d.command_rows],
                "p95": [r.get("latency_p95_ms") for r in d.command_rows],
                "p99": [r.get("latency_p99_ms") for r in d.command_rows],
            },
            title="command latency percentiles (log scale)",
            unit="ms",
        ),
        table(
            d.command_rows,
            ["name", "count", "vehicles", "accepted", "rejected", "failed", "expired", "invalid", "timeout",
             "latency_p50_ms", "latency_p95_ms", "latency_p99_ms"],
            title="commands by name",
        ),
    ]
    if d.chain_rows:
        parts.append(
            table(d.chain_rows, ["name", "count", "expected", "effects", "effect_p50_ms", "effect_p95_ms"],
                  title="command -> effect (latency from sending to the effect event)")
        )
    if d.flight_links:
        parts.append("<h2>Flight pages</h2>")
        parts.append(flight_index(d.flight_links))
    for vid, rows in d.timelines.items():
        parts.append(f"<h2>Timeline {_e(vid)}</h2>")
        parts.append(table(rows, ["time", "type", "mode", "alt_m", "battery_pct", "summary"]))
    parts.append("</body></html>\n")
    return "".join(parts)
