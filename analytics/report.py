"""The replay's human report: one self-contained HTML file with inline SVG charts.

No JavaScript, no CDN, no server: the file opens from disk in any browser and
can be mailed around. Input is plain Python data (the small aggregates the
replay collected), so this module is pure and testable without Spark. The
charts are drawn by matplotlib (mavjet.analytics.charts) and embedded as SVG.
"""

from __future__ import annotations

import datetime as dt
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
    empty: str = "no data",
) -> str:
    """Stacked columns over days, one colour per series, with a legend; a date axis whose labels never overlap."""
    if not days:
        return charts.empty_html(title, empty)
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


# Column key -> the header a reader sees (keys not listed are shown with spaces for underscores).
COLUMN_LABELS = {
    "vid": "vehicle", "name": "command", "count": "count", "vehicles": "vehicles", "result": "result",
    "latency_p50_ms": "p50 (ms)", "latency_p95_ms": "p95 (ms)", "latency_p99_ms": "p99 (ms)",
    "latency_ms": "latency (ms)", "expected": "effects expected", "effects": "effects seen",
    "effect_p50_s": "p50 (s)", "effect_p95_s": "p95 (s)", "failsafes": "failsafes", "types": "types",
    "time": "time (UTC)", "type": "event", "mode": "mode", "alt_m": "altitude (m)", "battery_pct": "battery (%)",
    "summary": "what happened", "start": "armed at (UTC)", "air_s": "in the air (s)", "distance_m": "distance (m)",
    "max_alt_m": "max altitude (m)", "flight": "flight",
}  # fmt: skip


def label(key: str) -> str:
    return COLUMN_LABELS.get(key, key.replace("_", " "))


def when(v: Any) -> str:
    """A time for a reader: ISO 8601 to the second, UTC implied (`2025-06-01 12:00:03`); other values as _num."""
    t: dt.datetime
    if isinstance(v, str):
        try:
            t = dt.datetime.fromisoformat(v)
        except ValueError:
            return str(v)
    elif isinstance(v, dt.datetime):
        t = v
    else:
        return _num(v)
    if t.tzinfo is not None:
        t = t.astimezone(dt.UTC).replace(tzinfo=None)
    return t.isoformat(sep=" ", timespec="seconds")


TIME_COLUMNS = frozenset({"time", "start", "issued", "acked"})


def _cell(v: Any, *, time: bool = False) -> str:
    """A table cell: numbers right-aligned (class num), text left-aligned; times to the second."""
    numeric = isinstance(v, int | float) and not isinstance(v, bool)
    text = when(v) if time or isinstance(v, dt.datetime) else _num(v)
    return f"<td class=num>{_e(text)}</td>" if numeric else f"<td>{_e(text)}</td>"


def table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str], *, title: str = "") -> str:
    """Rows under labelled headers; no rows is one cell saying "none" (never headers alone)."""
    if not rows:
        return charts.empty_html(title, "none") if title else "<p class=empty>none</p>"
    cap = f"<caption>{_e(title)}</caption>" if title else ""
    head = "".join(f"<th>{_e(label(c))}</th>" for c in columns)
    body = "".join("<tr>" + "".join(_cell(r.get(c), time=c in TIME_COLUMNS) for c in columns) + "</tr>" for r in rows)
    return f"<table>{cap}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


@dataclass(slots=True, kw_only=True)
class ReportData:
    title: str = "mavjet replay"
    range_text: str = ""
    summary: dict[str, Any] = field(default_factory=dict)
    flights_per_vehicle: list[tuple[str, float]] = field(default_factory=list)
    failsafe_days: list[str] = field(default_factory=list)
    failsafe_series: dict[str, list[float]] = field(default_factory=dict)
    command_rows: list[dict[str, Any]] = field(default_factory=list)  # per name: count, vehicles, result mix
    latency_rows: list[dict[str, Any]] = field(default_factory=list)  # per (name, result): count, p50/p95/p99
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
    "median_effect_latency_ms": ("median time from a command to its effect (s)", 1, 0.001),
}

# summary.json key -> the label of the report's top block (keys not listed: underscores as spaces).
SUMMARY_LABELS = {
    "events": "events read", "error_rows": "undecodable events", "vehicles": "vehicles",
    "first_event": "first event (UTC)", "last_event": "last event (UTC)", "flights": "flights (airborne)",
    "flights_complete": "flights ended (disarmed)", "armed_without_takeoff": "armed without a takeoff (not flights)",
    "cmd_results": "command results", "failsafes": "failsafes", "flight_pages": "flight pages",
    "total_s": "replay took (s)",
}  # fmt: skip


def summary_list(summary: Mapping[str, Any]) -> str:
    items = "".join(
        f'<dt>{_e(SUMMARY_LABELS.get(k, k.replace("_", " ")))}</dt><dd data-key="{_e(k)}">{_e(when(v))}</dd>'
        for k, v in summary.items()
    )
    return f"<dl class=summary>{items}</dl>"


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
    head = "<th>flight</th>" + "".join(f"<th>{_e(label(c))}</th>" for c in cols)
    body = "".join(
        f'<tr><td><a href="{_e(r["href"])}">{_e(r["vid"])} #{_e(r["flight_no"])}</a></td>'
        + "".join(_cell(r.get(c), time=c in TIME_COLUMNS) for c in cols)
        + "</tr>"
        for r in links
    )
    return f"<table class=flights><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


CSS = """
body{font-family:system-ui,sans-serif;margin:2em;max-width:900px;color:#222}
h1{font-size:1.5em}h2{font-size:1.2em;margin-top:2em;border-bottom:1px solid #ccc}
table{border-collapse:collapse;margin:1em 0;font-size:13px}td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}
td.num{text-align:right;font-variant-numeric:tabular-nums}td.none{color:#888;font-style:italic}
th{background:#f3f3f3}caption{text-align:left;font-weight:bold;padding:4px 0}
figure{margin:1em 0}figcaption{font-weight:bold;margin-bottom:4px}.empty{color:#888}
figure svg{max-width:100%;height:auto}
dl{display:grid;grid-template-columns:max-content auto;gap:2px 12px}dt{font-weight:bold}
"""


def _seconds(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Chain rows with their effect times in seconds (a landing takes minutes: 123.2 s, not 123,236.0 ms)."""
    out = []
    for r in rows:
        row = dict(r)
        for p in ("p50", "p95"):
            v = r.get(f"effect_{p}_ms")
            row[f"effect_{p}_s"] = None if v is None else float(v) / 1000.0
        out.append(row)
    return out


def render(d: ReportData) -> str:
    accepted = [r for r in d.latency_rows if r.get("result") == "accepted"]
    by_result = [r for r in d.latency_rows if r.get("result") != "all"]
    parts = [
        "<!doctype html><html lang=en><head><meta charset=utf-8>",
        f"<title>{_e(d.title)}</title><style>{CSS}</style></head><body>",
        f"<h1>{_e(d.title)}</h1><p>{_e(d.range_text)}</p>",
        summary_list(d.summary),
        *(["<h2>Fleet KPIs</h2>", kpi_list(d.kpis)] if d.kpis else []),
        "<h2>Flights per vehicle</h2>",
        bar_chart(
            d.flights_per_vehicle, title="flights (vehicles with the most flights)", unit="flights",
            x_label="flights", y_label="vehicle",
        ),
        "<h2>Failsafes over time</h2>",
        stacked_columns(
            d.failsafe_days, d.failsafe_series, title="failsafes per day, by type", y_label="failsafes per day",
            empty="none: no failsafes in the events read",
        ),
        table(d.top_failsafe_vehicles, ["vid", "failsafes", "types"], title="vehicles with the most failsafes"),
        "<h2>Command latency</h2>",
        grouped_log_bars(
            [str(r["name"]) for r in accepted],
            {
                "p50": [r.get("latency_p50_ms") for r in accepted],
                "p95": [r.get("latency_p95_ms") for r in accepted],
                "p99": [r.get("latency_p99_ms") for r in accepted],
            },
            title="latency of accepted commands, percentiles (log scale)",
            unit="ms",
        ),
        table(
            d.command_rows,
            ["name", "count", "vehicles", "accepted", "rejected", "failed", "expired", "invalid", "timeout"],
            title="commands by name: results",
        ),
        table(
            by_result, ["name", "result", "count", "latency_p50_ms", "latency_p95_ms", "latency_p99_ms"],
            title="latency by command and result (command sent → answer)",
        ),
    ]  # fmt: skip
    if d.chain_rows:
        parts.append(
            table(_seconds(d.chain_rows), ["name", "count", "expected", "effects", "effect_p50_s", "effect_p95_s"],
                  title="command → effect: time from the command to its effect event (armed, mode change, landed)")
        )
    if d.flight_links:
        parts.append("<h2>Flight pages</h2>")
        parts.append(flight_index(d.flight_links))
    for vid, rows in d.timelines.items():
        parts.append(f"<h2>Timeline {_e(vid)}</h2>")
        parts.append(table(rows, ["time", "type", "mode", "alt_m", "battery_pct", "summary"]))
    parts.append("</body></html>\n")
    return "".join(parts)
