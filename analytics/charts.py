"""The report's charts, drawn by matplotlib and embedded as inline SVG.

Each chart is built as a `Figure` by a `*_figure` function (which the tests
inspect: labels, tick values, label extents after layout) and turned into
markup by `figure_html`. Figures are made with the object API on the Agg
canvas, never through pyplot, so there is no global state and nothing opens
a window. The SVG keeps its text as `<text>` (svg.fonttype "none"): it stays
small, searchable and selectable, and the page loads nothing from the network
(no metadata block, no xlink namespace: SVG 2 `href`).

Axis rules, for every chart: count axes get integer ticks
(`MaxNLocator(integer=True)`), date axes `AutoDateLocator` with
`ConciseDateFormatter` (labels never overlap, whatever the range), every axis
is labelled with its quantity and unit.
"""

from __future__ import annotations

import datetime as dt
import html
import io
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import matplotlib as mpl
from cycler import cycler
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.dates import AutoDateLocator, ConciseDateFormatter, date2num
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator
from matplotlib.typing import RcKeyType

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")
WIDTH_IN = 7.2  # 720 px at 100 dpi: the report's column
DPI = 100

STYLE: dict[RcKeyType, object] = {
    "svg.fonttype": "none",
    "svg.hashsalt": "mavjet",  # stable ids: the same data gives the same page
    "font.size": 9.0,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.color": "#dddddd",
    "grid.linewidth": 0.6,
    "axes.axisbelow": True,
    "axes.prop_cycle": cycler(color=list(PALETTE)),
}


def new_figure(height_in: float, *, width_in: float = WIDTH_IN) -> Figure:
    """A figure on the Agg canvas (layout by Agg's text metrics; output as SVG)."""
    fig = Figure(figsize=(width_in, height_in), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


# rc settings are read when axes, ticks and text are made, so every *_figure function and
# figure_svg (which draws) run inside mpl.rc_context(STYLE).


def _num(v: float) -> str:
    return f"{v:,.0f}" if float(v).is_integer() else f"{v:,.1f}"


def figure_svg(fig: Figure, *, titles: Mapping[str, str] | None = None) -> str:
    """The figure as one `<svg>` element; `titles` adds a tooltip to the artist with that gid."""
    buf = io.StringIO()
    with mpl.rc_context(STYLE):
        fig.savefig(buf, format="svg", metadata={"Creator": None, "Date": None, "Format": None, "Type": None})
    text = buf.getvalue()
    svg = text[text.index("<svg"):]
    svg = svg.replace(' xmlns:xlink="http://www.w3.org/1999/xlink"', "").replace("xlink:href=", "href=")
    svg = svg.replace("<svg ", '<svg role="img" ', 1)
    for gid, title in (titles or {}).items():
        head = re.search(f'<g id="{re.escape(gid)}"[^>]*>', svg)
        if head is not None:
            svg = f"{svg[:head.end()]}<title>{html.escape(title)}</title>{svg[head.end():]}"
    return svg


def figure_html(fig: Figure, title: str, *, titles: Mapping[str, str] | None = None) -> str:
    return f"<figure><figcaption>{html.escape(title)}</figcaption>{figure_svg(fig, titles=titles)}</figure>"


def empty_html(title: str, why: str = "no data") -> str:
    return f"<figure><figcaption>{html.escape(title, quote=False)}</figcaption><p class=empty>{html.escape(why, quote=False)}</p></figure>"


# --- the front page ----------------------------------------------------------------------------


@mpl.rc_context(STYLE)
def bar_figure(items: Sequence[tuple[str, float]], *, x_label: str, y_label: str, integer: bool = True) -> Figure:
    """Horizontal bars, first item on top, the value written at each bar's end."""
    fig = new_figure(0.8 + 0.28 * len(items))
    ax = fig.add_subplot()
    labels = [str(k) for k, _ in items]
    bars = ax.barh(range(len(items)), [v for _, v in items], color=PALETTE[0], height=0.7)
    for i, b in enumerate(bars):
        b.set_gid(f"bar-{i}")
    ax.set_yticks(range(len(items)), labels)
    ax.invert_yaxis()
    ax.bar_label(bars, labels=[_num(v) for _, v in items], padding=3, fontsize=8)
    ax.xaxis.set_major_locator(MaxNLocator(integer=integer))
    ax.set_xlim(0, max([v for _, v in items] + [1.0]) * 1.08)
    ax.grid(axis="y", visible=False)
    ax.set_xlabel(x_label)
    ax.set_ylabel(y_label)
    return fig


def _as_dates(days: Sequence[str]) -> list[dt.date] | None:
    try:
        return [dt.date.fromisoformat(d) for d in days]
    except ValueError:
        return None


@mpl.rc_context(STYLE)
def stacked_figure(
    days: Sequence[str], series: Mapping[str, Sequence[float]], *, y_label: str, x_label: str, integer: bool = True
) -> Figure:
    """Stacked columns per day, one colour per series, a legend; dates on a date axis."""
    fig = new_figure(2.8)
    ax = fig.add_subplot()
    dates = _as_dates(days)
    xs: list[float] = [float(i) for i in range(len(days))]
    if dates is not None:
        xs = [float(date2num(d)) for d in dates]  # type: ignore[no-untyped-call]
    bottom = [0.0] * len(days)
    for k, (name, values) in enumerate(series.items()):
        ax.bar(xs, list(values), bottom=bottom, width=0.85, label=name, color=PALETTE[k % len(PALETTE)], gid=f"series-{k}")
        bottom = [b + float(v) for b, v in zip(bottom, values, strict=True)]
    if dates is not None:
        locator = AutoDateLocator(minticks=3, maxticks=8)  # type: ignore[no-untyped-call]
        ax.xaxis.set_major_locator(locator)
        ax.xaxis.set_major_formatter(ConciseDateFormatter(locator))  # type: ignore[no-untyped-call]
        ax.set_xlim(min(xs) - 0.6, max(xs) + 0.6)
    else:
        ax.set_xticks(xs, list(days))
    ax.yaxis.set_major_locator(MaxNLocator(integer=integer))
    ax.set_ylim(0, max([*bottom, 1.0]) * 1.05)
    ax.grid(axis="x", visible=False)
    ax.set_xlabel(x_label)
    ax.set_ylabel(y_label)
    if series:
        # above the plot, so it never covers a column
        ax.legend(loc="lower left", bbox_to_anchor=(0.0, 1.0), frameon=False, ncols=min(len(series), 6), fontsize=8)
    return fig


@mpl.rc_context(STYLE)
def log_bars_figure(groups: Sequence[str], series: Mapping[str, Sequence[float | None]], *, unit: str) -> Figure:
    """Grouped horizontal bars on a log scale (latencies span milliseconds to seconds)."""
    n = max(len(series), 1)
    fig = new_figure(0.9 + 0.22 * n * len(groups))
    ax = fig.add_subplot()
    h = 0.8 / n
    vals = [v for s in series.values() for v in s if v is not None and v > 0]
    for k, (name, values) in enumerate(series.items()):
        ys = [g + (k - (n - 1) / 2) * h for g in range(len(groups))]
        pts = [(y, v) for y, v in zip(ys, values, strict=True) if v is not None and v > 0]
        if not pts:
            continue
        bars = ax.barh([y for y, _ in pts], [v for _, v in pts], height=h * 0.9, label=name,
                       color=PALETTE[k % len(PALETTE)], gid=f"series-{k}")
        ax.bar_label(bars, labels=[_num(v) for _, v in pts], padding=2, fontsize=7)
    ax.set_xscale("log")
    ax.xaxis.set_major_locator(LogLocator(base=10))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:,g}"))
    if vals:
        ax.set_xlim(10 ** _floor_log10(min(vals)), 10 ** (_floor_log10(max(vals)) + 1))
    ax.set_yticks(range(len(groups)), list(groups))
    ax.invert_yaxis()
    ax.grid(axis="y", visible=False)
    ax.set_xlabel(f"{unit}, log scale")
    ax.set_ylabel("command")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, fontsize=8)
    return fig


def _floor_log10(v: float) -> int:
    e = 0
    while 10 ** (e + 1) <= v:
        e += 1
    while 10**e > v:
        e -= 1
    return e


# --- a flight's page ---------------------------------------------------------------------------

# What a flight page marks on its track and altitude chart: kind -> (legend label, colour, marker).
MARK_STYLES: dict[str, tuple[str, str, str]] = {
    "failsafe": ("failsafe", PALETTE[1], "X"),
    "mode": ("mode change", PALETTE[4], "D"),
    "command": ("command", PALETTE[3], "^"),
}


@dataclass(frozen=True, slots=True, kw_only=True)
class Mark:
    """An event drawn on a flight's charts: where (x, y in the chart's units) and what (a tooltip)."""

    kind: str  # a MARK_STYLES key
    x: float
    y: float = 0.0
    text: str = ""


def mark_gid(kind: str, i: int) -> str:
    return f"mark-{kind}-{i}"


def _draw_marks(ax: Axes, marks: Sequence[Mark], *, vertical: bool) -> None:
    """Points (track) or vertical lines (over time), one legend entry per kind, a gid per mark for its tooltip."""
    seen: set[str] = set()
    counts: dict[str, int] = {}
    for m in marks:
        name, colour, marker = MARK_STYLES[m.kind]
        i = counts.get(m.kind, 0)
        counts[m.kind] = i + 1
        lab = name if m.kind not in seen else None
        seen.add(m.kind)
        if vertical:
            ax.axvline(m.x, color=colour, linewidth=1.6, linestyle="--", label=lab, gid=mark_gid(m.kind, i))
        else:
            ax.plot([m.x], [m.y], marker, color=colour, markersize=8, markeredgecolor="white", markeredgewidth=0.6,
                    label=lab, gid=mark_gid(m.kind, i))  # fmt: skip


def mark_titles(marks: Sequence[Mark]) -> dict[str, str]:
    """Tooltips of the marks, by gid (for figure_html)."""
    out: dict[str, str] = {}
    counts: dict[str, int] = {}
    for m in marks:
        i = counts.get(m.kind, 0)
        counts[m.kind] = i + 1
        out[mark_gid(m.kind, i)] = m.text
    return out



@mpl.rc_context(STYLE)
def track_figure(
    xy_m: Sequence[tuple[float, float]], *, size_in: float = 5.0, marks: Sequence[Mark] = ()
) -> Figure:
    """The track in metres east/north of its centre: one metre the same length on both axes, north up;
    `marks` (failsafes, mode changes, commands) where they happened."""
    fig = new_figure(size_in, width_in=size_in + (1.7 if marks else 1.0))  # the legend sits right of the plot
    ax = fig.add_subplot()
    xs, ys = [p[0] for p in xy_m], [p[1] for p in xy_m]
    ax.plot(xs, ys, color=PALETTE[0], linewidth=1.8, gid="track")
    ax.plot(xs[:1], ys[:1], "o", color=PALETTE[2], markersize=7, label="start", gid="track-start")
    ax.plot(xs[-1:], ys[-1:], "s", color=PALETTE[1], markersize=6, label="end", gid="track-end")
    _draw_marks(ax, marks, vertical=False)
    span = max(max(xs) - min(xs), max(ys) - min(ys), 10.0)
    cx, cy = (max(xs) + min(xs)) / 2, (max(ys) + min(ys)) / 2
    half = span / 2 * 1.08
    ax.set_xlim(cx - half, cx + half)
    ax.set_ylim(cy - half, cy + half)
    ax.set_aspect("equal", adjustable="box")
    ax.set_xlabel("east (m)")
    ax.set_ylabel("north (m)")
    # outside the plot, so it never hides part of the track
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, fontsize=8)
    return fig


@mpl.rc_context(STYLE)
def time_series_figure(
    samples: Sequence[tuple[float, float]],
    *,
    y_label: str,
    y_range: tuple[float, float] | None = None,
    marks: Sequence[Mark] = (),
) -> Figure:
    """A value over the flight: (seconds since armed, value), x in minutes; `y_range` fixes the y axis;
    `marks` (x in seconds since armed) as dashed vertical lines, with a legend right of the plot."""
    fig = new_figure(2.2 if not marks else 2.6)
    ax = fig.add_subplot()
    ax.plot([t / 60.0 for t, _ in samples], [v for _, v in samples], color=PALETTE[0], linewidth=1.5, gid="series")
    _draw_marks(ax, [Mark(kind=m.kind, x=m.x / 60.0, text=m.text) for m in marks], vertical=True)
    if marks:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, fontsize=8)
    ax.set_xlim(left=0)
    if y_range is not None:
        ax.set_ylim(*y_range)
    else:
        ax.set_ylim(bottom=min(0.0, *(v for _, v in samples)))
    ax.xaxis.set_major_locator(MaxNLocator(nbins=8, steps=[1, 2, 5, 10]))
    ax.set_xlabel("minutes since armed")
    ax.set_ylabel(y_label)
    return fig
