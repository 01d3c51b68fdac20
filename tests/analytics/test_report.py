"""The report's charts (matplotlib): labelled axes, integer ticks on count axes, date labels that do not overlap.

Pure: each chart's Figure is inspected after layout (labels, the ticks inside
the view, the drawn extents of the tick labels), and its inline SVG as XML.
"""

from __future__ import annotations

import datetime as dt
import itertools
import re
from xml.etree import ElementTree

import pytest
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from mavjet.analytics import charts
from mavjet.analytics.report import bar_chart, grouped_log_bars, stacked_columns

SVG = "{http://www.w3.org/2000/svg}"


def _axes(fig: Figure) -> Axes:
    fig.canvas.draw()
    (ax,) = fig.axes
    return ax


def _visible_ticks(ax: Axes, axis: str) -> list[float]:
    lo, hi = sorted(ax.get_ylim() if axis == "y" else ax.get_xlim())
    ticks = ax.get_yticks() if axis == "y" else ax.get_xticks()
    return [float(t) for t in ticks if lo - 1e-9 <= t <= hi + 1e-9]


def _svg_texts(figure_html: str) -> list[str]:
    root = ElementTree.fromstring(figure_html)  # the whole <figure> is well-formed XML
    svg = root.find(f"{SVG}svg")
    assert svg is not None
    return [t.text or "" for t in svg.iter(f"{SVG}text")]


@pytest.mark.parametrize("vmax", [1, 2, 3, 5, 7, 13, 99, 1234])
def test_count_axes_have_integer_ticks(vmax: int) -> None:
    ax = _axes(charts.stacked_figure(["2025-06-01", "2025-06-02"], {"gcs": [float(vmax), 0.0]},
                                     y_label="failsafes per day", x_label="day (UTC)"))
    ticks = _visible_ticks(ax, "y")
    assert ticks[0] == 0 and ticks[-1] <= vmax * 1.05 and len(ticks) >= 2
    assert all(t.is_integer() for t in ticks), ticks  # never 0.5 failsafes
    assert len({round(b - a, 9) for a, b in itertools.pairwise(ticks)}) == 1
    ax = _axes(charts.bar_figure([("VID-1", float(vmax)), ("VID-2", 1.0)], x_label="flights", y_label="vehicle"))
    assert all(t.is_integer() for t in _visible_ticks(ax, "x"))


def test_failsafe_chart_has_its_labels_and_integer_ticks() -> None:
    # 3 failsafes at most: the old hand-drawn chart labelled a line "2" that was 1.5
    days = ["2025-06-01", "2025-06-02", "2025-06-03"]
    ax = _axes(charts.stacked_figure(days, {"battery": [1.0, 0.0, 3.0]}, y_label="failsafes per day",
                                     x_label="day (UTC)"))
    assert ax.get_ylabel() == "failsafes per day" and ax.get_xlabel() == "day (UTC)"
    assert _visible_ticks(ax, "y") == [0, 1, 2, 3]
    texts = _svg_texts(stacked_columns(days, {"battery": [1.0, 0.0, 3.0]}, title="t", y_label="failsafes per day"))
    assert "failsafes per day" in texts and "day (UTC)" in texts and "battery" in texts
    assert [t for t in texts if re.fullmatch(r"\d+", t)] == ["02", "03", "0", "1", "2", "3"]


@pytest.mark.parametrize("n_days", [1, 7, 30, 90, 365, 1000])
def test_date_labels_never_overlap_for_any_range(n_days: int) -> None:
    days = [(dt.date(2025, 1, 1) + dt.timedelta(days=i)).isoformat() for i in range(n_days)]
    fig = charts.stacked_figure(days, {"gcs": [1.0] * n_days}, y_label="failsafes per day", x_label="day (UTC)")
    ax = _axes(fig)
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
    lo, hi = ax.get_xlim()
    labels = [t for t, x in zip(ax.get_xticklabels(), ax.get_xticks(), strict=True) if lo <= x <= hi and t.get_text()]
    assert len(labels) >= 2 or n_days == 1
    boxes = sorted((t.get_window_extent(renderer) for t in labels), key=lambda b: b.x0)
    assert all(a.x1 + 2 <= b.x0 for a, b in itertools.pairwise(boxes)), [t.get_text() for t in labels]
    assert len(labels) <= 10  # readable: a handful of dates, not one per column


def test_flights_chart_counts_on_an_integer_axis_with_labels() -> None:
    page = bar_chart([("VID-1", 3.0), ("VID-2", 1.0)], title="t", x_label="flights", y_label="vehicle", unit="flights")
    texts = _svg_texts(page)
    assert "flights" in texts and "vehicle" in texts and "VID-1" in texts and "VID-2" in texts
    ax = _axes(charts.bar_figure([("VID-1", 3.0), ("VID-2", 1.0)], x_label="flights", y_label="vehicle"))
    assert _visible_ticks(ax, "x") == [0, 1, 2, 3]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["VID-1", "VID-2"]  # first item on top
    assert ax.get_ylim()[0] > ax.get_ylim()[1]
    assert "<title>VID-1: 3 flights</title>" in page  # each bar's tooltip has the exact value


def test_latency_chart_names_its_unit_and_scale() -> None:
    page = grouped_log_bars(["arm"], {"p50": [40.0], "p99": [4000.0]}, title="t", unit="ms")
    assert "ms, log scale" in _svg_texts(page)
    ax = _axes(charts.log_bars_figure(["arm"], {"p50": [40.0], "p99": [4000.0]}, unit="ms"))
    assert ax.get_xscale() == "log" and ax.get_xlim()[0] <= 40.0 and ax.get_xlim()[1] >= 4000.0


def test_inline_svg_loads_nothing() -> None:
    page = bar_chart([("a", 1.0)], title="t")
    assert "xlink" not in page and "<metadata" not in page and "<image" not in page
    assert re.findall(r"https?://[^\"' ]+", page) == ["http://www.w3.org/2000/svg"]
    assert "no data" in stacked_columns([], {}, title="t")
