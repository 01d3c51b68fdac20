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


# --- the front page's tables and labels (issue 49: a correct report) ----------------------------


def _front(**kw: object) -> str:
    from mavjet.analytics.report import ReportData, render

    return render(ReportData(**kw))  # type: ignore[arg-type]


def test_an_empty_table_says_none_not_headers_alone() -> None:
    page = _front()
    assert "<figcaption>vehicles with the most failsafes</figcaption><p class=empty>none</p>" in page
    assert "<th>vehicle</th>" not in page
    assert "<figcaption>failsafes per day, by type</figcaption><p class=empty>none: no failsafes" in page


def test_the_top_block_has_human_labels_and_times_to_the_second() -> None:
    page = _front(summary={"events": 1234, "error_rows": 0, "first_event": "2025-06-01T12:00:03.123456",
                           "total_s": 12.345, "armed_without_takeoff": 2})
    assert "<dt>undecodable events</dt>" in page and "<dt>replay took (s)</dt>" in page
    assert "<dt>armed without a takeoff (not flights)</dt>" in page
    assert ">2025-06-01 12:00:03<" in page and ".123456" not in page
    assert "<dt>error_rows" not in page and "<dt>total_s" not in page


def test_text_columns_left_numbers_right() -> None:
    from mavjet.analytics.report import CSS, table

    html_table = table([{"vid": "VID-1", "failsafes": 3, "types": "battery, gcs"}], ["vid", "failsafes", "types"])
    assert "<td>VID-1</td><td class=num>3</td><td>battery, gcs</td>" in html_table
    assert "<th>vehicle</th><th>failsafes</th><th>types</th>" in html_table
    assert "td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}" in CSS and "td.num{text-align:right" in CSS


def test_latency_is_per_result_kind_and_the_chart_shows_accepted_commands() -> None:
    from mavjet.analytics.jobs import command_mix

    rows = [
        {"name": "takeoff", "result": "accepted", "count": 5, "vehicles": 2, "latency_p50_ms": 4.0,
         "latency_p95_ms": 6.0, "latency_p99_ms": 7.0},
        {"name": "takeoff", "result": "rejected", "count": 1, "vehicles": 1, "latency_p50_ms": 420.0,
         "latency_p95_ms": 420.0, "latency_p99_ms": 420.0},
        {"name": "takeoff", "result": "all", "count": 6, "vehicles": 3, "latency_p50_ms": 4.5,
         "latency_p95_ms": 300.0, "latency_p99_ms": 400.0},
    ]
    (mix,) = command_mix(rows)
    assert (mix["count"], mix["vehicles"], mix["accepted"], mix["rejected"], mix["failed"]) == (6, 3, 5, 1, 0)
    page = _front(command_rows=[mix], latency_rows=rows)
    chart = page[page.index("<figcaption>latency of accepted commands"):]
    chart = chart[: chart.index("</figure>") + len("</figure>")]
    texts = _svg_texts("<figure>" + chart)
    assert "4" in texts and "420" not in texts and "4.5" not in texts  # accepted only, never a mixed median
    table_html = page[page.index("<caption>latency by command and result"):]
    assert "<td>takeoff</td><td>accepted</td><td class=num>5</td><td class=num>4.0</td>" in table_html
    assert "<td>takeoff</td><td>rejected</td><td class=num>1</td><td class=num>420.0</td>" in table_html
    assert "<td>all</td>" not in table_html


def test_effect_times_are_seconds_from_the_command_to_its_effect() -> None:
    page = _front(chain_rows=[{"name": "land", "count": 3, "expected": 3, "effects": 3, "effect_p50_ms": 123236.0,
                               "effect_p95_ms": 150000.0}])
    assert "command → effect: time from the command to its effect event" in page
    assert "<th>p50 (s)</th>" in page and "<td class=num>123.2</td>" in page and "123,236" not in page
