"""The replay's human report: one self-contained HTML file with inline SVG charts.

No JavaScript, no CDN, no server: the file opens from disk in any browser and
can be mailed around. Input is plain Python data (the small aggregates the
replay collected), so this module is pure and testable without Spark. The
charts are drawn by matplotlib (mavjet.analytics.charts) and embedded as SVG.
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from mavjet.analytics import charts


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


def bar_chart(
    items: Sequence[tuple[str, float]],
    *,
    title: str,
    unit: str = "",
    x_label: str = "",
    y_label: str = "",
    integer: bool = True,
) -> str:
    """Horizontal bars, one per (label, value), on a value axis (integer ticks for counts)."""
    if not items:
        return charts.empty_html(title)
    fig = charts.bar_figure(items, x_label=x_label, y_label=y_label, integer=integer)
    tips = {f"bar-{i}": f"{label}: {_num(v, 0 if integer else 1)} {unit}".rstrip() for i, (label, v) in enumerate(items)}
    return charts.figure_html(fig, title, titles=tips)


def stacked_columns(
    days: Sequence[str],
    series: Mapping[str, Sequence[float]],
    *,
    title: str,
    y_label: str = "count",
    x_label: str = "day (UTC)",
    integer: bool = True,
) -> str:
    """Stacked columns over days, one colour per series, with a legend; a date axis whose labels never overlap."""
    if not days:
        return charts.empty_html(title)
    fig = charts.stacked_figure(days, series, y_label=y_label, x_label=x_label, integer=integer)
    tips = {f"series-{k}": f"{name}: {_num(sum(v), 0 if integer else 1)} in total" for k, (name, v) in enumerate(series.items())}
    return charts.figure_html(fig, title, titles=tips)


def grouped_log_bars(
    groups: Sequence[str], series: Mapping[str, Sequence[float | None]], *, title: str, unit: str
) -> str:
    """Horizontal grouped bars on a log scale (latencies span ms to seconds)."""
    if not groups:
        return charts.empty_html(title)
    return charts.figure_html(charts.log_bars_figure(groups, series, unit=unit), title)


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
figure svg{max-width:100%;height:auto}
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
