"""The report's charts: labelled axes, integer ticks on count axes, date labels that do not overlap.

Pure: the charts are SVG strings, inspected as XML.
"""

from __future__ import annotations

import datetime as dt
import itertools
from xml.etree import ElementTree

import pytest

from analytics.report import (
    CHAR_W_10PX,
    bar_chart,
    grouped_log_bars,
    label_step,
    nice_ticks,
    stacked_columns,
)

SVG = "{http://www.w3.org/2000/svg}"


def _svg(figure: str) -> ElementTree.Element:
    root = ElementTree.fromstring(figure)
    svg = root.find(f"{SVG}svg")
    assert svg is not None
    return svg


def _texts(svg: ElementTree.Element, cls: str) -> list[ElementTree.Element]:
    return [t for t in svg.iter(f"{SVG}text") if t.get("class") == cls]


@pytest.mark.parametrize("vmax", [1, 2, 3, 5, 7, 13, 99, 1234])
def test_count_ticks_are_integers_from_zero_past_the_maximum(vmax: int) -> None:
    ticks = nice_ticks(vmax, integer=True)
    assert ticks[0] == 0 and ticks[-1] >= vmax and 2 <= len(ticks) <= 7
    assert all(float(t).is_integer() for t in ticks)
    steps = {round(b - a, 9) for a, b in itertools.pairwise(ticks)}
    assert len(steps) == 1


def test_failsafe_chart_has_its_y_label_and_integer_ticks() -> None:
    # 3 failsafes at most: the old chart labelled its middle line "2" (1.5 rounded)
    days = ["2025-06-01", "2025-06-02", "2025-06-03"]
    svg = _svg(stacked_columns(days, {"battery": [1.0, 0.0, 3.0]}, title="t", y_label="failsafes per day"))
    (ylabel,) = _texts(svg, "axis-label-y")
    assert ylabel.text == "failsafes per day"
    (xlabel,) = _texts(svg, "axis-label-x")
    assert xlabel.text == "day (UTC)"
    ticks = [t.text or "" for t in _texts(svg, "tick-y")]
    assert ticks == ["0", "1", "2", "3"]


def test_date_labels_never_overlap_for_any_range() -> None:
    for n_days in (1, 7, 30, 90, 365):
        days = [(dt.date(2025, 1, 1) + dt.timedelta(days=i)).isoformat() for i in range(n_days)]
        svg = _svg(stacked_columns(days, {"gcs": [1.0] * n_days}, title="t"))
        labels = _texts(svg, "tick-x")
        assert labels and labels[0].text == days[0]
        xs = [float(t.get("x", "0")) for t in labels]
        width = len(days[0]) * CHAR_W_10PX
        assert all(b - a >= width for a, b in itertools.pairwise(xs)), n_days
    assert label_step(["2025-06-01"] * 10, 100.0) == 1


def test_flights_chart_counts_on_an_integer_axis_with_labels() -> None:
    svg = _svg(bar_chart([("VID-1", 3.0), ("VID-2", 1.0)], title="t", x_label="flights", y_label="vehicle"))
    assert [t.text for t in _texts(svg, "tick-x")] == ["0", "1", "2", "3"]
    assert [t.text for t in _texts(svg, "axis-label-x")] == ["flights"]
    assert [t.text for t in _texts(svg, "axis-label-y")] == ["vehicle"]
    assert [t.text for t in _texts(svg, "category")] == ["VID-1", "VID-2"]


def test_latency_chart_names_its_unit_and_scale() -> None:
    svg = _svg(grouped_log_bars(["arm"], {"p50": [40.0], "p99": [4000.0]}, title="t", unit="ms"))
    assert [t.text for t in _texts(svg, "axis-label-x")] == ["ms, log scale"]
