"""The per-flight page: track to scale, altitude and battery over time, events; pure (no Spark)."""

from __future__ import annotations

import datetime as dt
import itertools
import math
import os
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from mavjet.analytics.charts import Mark, time_series_figure, track_figure
from mavjet.analytics.flightreport import centre, flight_file, flight_page, project_m, track_svg
from mavjet.contract.events import EventType
from mavjet.contract.units import haversine_m

T0 = dt.datetime(2025, 6, 1, 12, 0, 0)


class Outline(HTMLParser):
    """Tags, headings and links of a page."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.headings: list[str] = []
        self.links: list[str] = []
        self._in_h = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        self._in_h = tag in ("h1", "h2")
        if tag == "a":
            self.links.extend(v for k, v in attrs if k == "href" and v)

    def handle_endtag(self, tag: str) -> None:
        self._in_h = False

    def handle_data(self, data: str) -> None:
        if self._in_h and data.strip():
            self.headings.append(data.strip())


def outline(page: str) -> Outline:
    o = Outline()
    o.feed(page)
    return o


def _flight() -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]:
    # a 1 km square flown from (47, 8): east, north, west, back
    lat0, lon0 = 47.0, 8.0
    dlat = math.degrees(1000 / 6_371_000)
    dlon = dlat / math.cos(math.radians(lat0))
    corners = [(lat0, lon0), (lat0, lon0 + dlon), (lat0 + dlat, lon0 + dlon), (lat0 + dlat, lon0), (lat0, lon0)]
    samples = [
        {"time": T0 + dt.timedelta(minutes=2 * i), "lat_deg": la, "lon_deg": lo, "alt_m": 0.0 if i in (0, 4) else 50.0,
         "battery_pct": 100.0 - 5 * i}
        for i, (la, lo) in enumerate(corners)
    ]
    flight = {"vid": "VID-0001", "flight_no": 3, "start": T0, "end": T0 + dt.timedelta(minutes=8),
              "takeoff_time": T0, "landing_time": T0 + dt.timedelta(minutes=8), "duration_s": 480.0, "air_s": 480.0,
              "distance_m": 4000.0, "max_alt_m": 50.0, "max_speed_mps": 8.3, "battery_used_pct": 20.0,
              "failsafes": 1, "failsafe_types": ["gcs"], "modes": ["GUIDED", "AUTO", "RTL"], "command_count": 1,
              "commands_accepted": 1,
              "commands": [{"time": T0, "name": "arm", "result": "accepted", "latency_ms": 42.0}]}
    events = [{"time": s["time"], "type": "mission_item_reached", "mode": "AUTO", "alt_m": s["alt_m"],
               "battery_pct": s["battery_pct"], "summary": f"reached mission item {i}"} for i, s in enumerate(samples)]
    return flight, samples, events


def _flight_with_marks() -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]:
    """The square flight with a mode change at the first corner, a command at the second, a failsafe at the third;
    two of its five positions from the flight recorder."""
    flight, samples, events = _flight()
    for s in samples:
        s["source"] = "event"
    samples[1]["source"] = samples[3]["source"] = "track"
    marks = [(EventType.MODE_CHANGED, "GUIDED -> AUTO"), (EventType.CMD_RESULT, "rtl accepted in 4.0 ms"),
             (EventType.FAILSAFE, "FAILSAFE battery -> RTL")]
    for i, (typ, summary) in enumerate(marks, start=1):
        s = samples[i]
        events.append({"time": s["time"] + dt.timedelta(seconds=1), "type": typ.value, "mode": "AUTO", "alt_m": 50.0,
                       "battery_pct": s["battery_pct"], "lat_deg": s["lat_deg"], "lon_deg": s["lon_deg"],
                       "summary": summary})
    events.sort(key=lambda e: e["time"])
    return flight, samples, events


def test_failsafes_mode_changes_and_commands_are_marked_on_the_track_and_the_altitude() -> None:
    flight, samples, events = _flight_with_marks()
    page = flight_page(flight, samples, events)
    track = page[page.index("<figcaption>track"):page.index("<h2>Altitude")]
    altitude = page[page.index("<figcaption>altitude"):page.index("<figcaption>battery")]
    for part in (track, altitude):
        for kind in ("failsafe", "mode", "command"):
            assert f'<g id="mark-{kind}-0">' in part, kind
        assert "<title>2025-06-01 12:06:01 FAILSAFE battery -&gt; RTL</title>" in part
        assert ">failsafe<" in part and ">mode change<" in part and ">command<" in part  # the legend
    # on the track, where it happened: the failsafe at the square's third corner (1 km east, 1 km north)
    pts = [(s["lat_deg"], s["lon_deg"]) for s in samples]
    xy = project_m(pts)
    fig = track_figure(xy, marks=[Mark(kind="failsafe", x=xy[3][0], y=xy[3][1])])
    (ax,) = fig.axes
    (mark,) = [ln for ln in ax.get_lines() if ln.get_gid() == "mark-failsafe-0"]
    assert tuple(map(float, mark.get_xydata()[0])) == pytest.approx(xy[3])  # type: ignore[index]
    assert project_m([pts[3]], origin=centre(pts)) == [pytest.approx(xy[3])]  # marks share the track's origin
    # over time: a dashed vertical line at the failsafe's minute
    fig = time_series_figure([(0.0, 0.0), (480.0, 0.0)], y_label="altitude (m)", marks=[Mark(kind="failsafe", x=361.0)])
    (ax,) = fig.axes
    (vline,) = [ln for ln in ax.get_lines() if ln.get_gid() == "mark-failsafe-0"]
    assert list(vline.get_xdata()) == pytest.approx([361.0 / 60, 361.0 / 60])  # type: ignore[arg-type]


def test_one_count_of_positions_on_a_flight_page() -> None:
    page = flight_page(*_flight_with_marks())
    assert "<figcaption>track (5 positions, north up, to scale)</figcaption>" in page
    assert "5 positions (2 from the flight recorder, TWIN_TRACKS; 3 from events)" in page
    assert "positions recorded" not in page


def test_projection_keeps_metres_equal_on_both_axes() -> None:
    a, b, c = project_m([(47.0, 8.0), (47.0, 8.01), (47.01, 8.0)])
    east = math.dist(a, b)
    north = math.dist(a, c)
    assert east == pytest.approx(haversine_m(47.0, 8.0, 47.0, 8.01), rel=1e-3)
    assert north == pytest.approx(haversine_m(47.0, 8.0, 47.01, 8.0), rel=1e-3)


def test_track_is_drawn_to_scale_north_up() -> None:
    _, samples, _ = _flight()
    points = [(s["lat_deg"], s["lon_deg"]) for s in samples]
    fig = track_figure(project_m(points))
    fig.canvas.draw()
    (ax,) = fig.axes
    assert ax.get_xlabel() == "east (m)" and ax.get_ylabel() == "north (m)"
    line = next(ln for ln in ax.get_lines() if ln.get_gid() == "track")
    (x0, y0), (x1, y1), (x2, y2) = [tuple(map(float, p)) for p in line.get_xydata()[:3]]  # type: ignore[union-attr]
    assert x1 - x0 == pytest.approx(1000, rel=2e-3) and y1 == pytest.approx(y0, abs=1e-6)  # east: +x, in metres
    assert y2 - y1 == pytest.approx(1000, rel=2e-3) and x2 == pytest.approx(x1, abs=1e-6)  # north: +y
    # to scale on the page: 1 km east and 1 km north are the same number of pixels, and north is up
    to_px = ax.transData.transform
    (p0x, p0y), (p1x, p1y), (p2x, p2y) = to_px([(x0, y0), (x1, y1), (x2, y2)])
    east_px, north_px = p1x - p0x, p2y - p1y
    assert east_px > 100 and north_px == pytest.approx(east_px, rel=1e-3)
    assert p1y == pytest.approx(p0y) and p2x == pytest.approx(p1x)  # east is across, north straight up
    svg = track_svg(points)
    assert 'id="track"' in svg and "<title>start</title>" in svg and "north up, to scale" in svg
    assert "no positions" in track_svg([])


def test_altitude_and_battery_axes() -> None:
    _, samples, _ = _flight()
    alt = [((s["time"] - T0).total_seconds(), s["alt_m"]) for s in samples]
    fig = time_series_figure(alt, y_label="altitude (m)")
    fig.canvas.draw()
    (ax,) = fig.axes
    assert ax.get_xlabel() == "minutes since armed" and ax.get_ylabel() == "altitude (m)"
    lo, hi = ax.get_xlim()
    assert lo == 0 and hi >= 8 and [t for t in ax.get_xticks() if lo <= t <= hi] == [0, 2, 4, 6, 8]  # minutes
    assert ax.get_ylim()[0] <= 0 <= 50 <= ax.get_ylim()[1]  # altitude from the ground up
    batt = [((s["time"] - T0).total_seconds(), s["battery_pct"]) for s in samples]
    fig = time_series_figure(batt, y_label="battery (%)", y_range=(0.0, 100.0))
    assert fig.axes[0].get_ylim() == (0.0, 100.0)  # a battery axis is 0-100 %, not zoomed into the drop


def test_flight_page_structure() -> None:
    page = flight_page(*_flight())
    o = outline(page)
    assert o.headings == ["VID-0001 · flight 3", "Track", "Altitude and battery", "Commands", "Events"]
    assert o.tags.count("svg") == 3 and "script" not in o.tags and "../report.html" in o.links
    assert "http://" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")
    assert "reached mission item 4" in page and "altitude (m)" in page and "battery (%)" in page
    assert "GUIDED → AUTO → RTL" in page and flight_file("VID-0001", 3) == "flight-pages/VID-0001-3.html"


def test_flight_page_without_positions_still_renders() -> None:
    flight, samples, events = _flight()
    page = flight_page(flight, [{"time": s["time"], "alt_m": s["alt_m"]} for s in samples], events)
    assert "no positions in this flight's data" in page and outline(page).tags.count("svg") == 1  # altitude only


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
BLUE = (0x1F, 0x77, 0xB4)  # the charts' first colour: bars, the track, the time series


def screenshot(html_file: Path, png: Path, *, width: int = 1000, height: int = 1800) -> Any:
    """Chromium's rendering of the page as an (height, width, 3) array of RGB pixels."""
    import numpy as np
    from PIL import Image

    subprocess.run(
        [str(CHROMIUM), "--headless", "--disable-gpu", "--no-sandbox", "--hide-scrollbars",
         "--force-device-scale-factor=1", f"--screenshot={png}", f"--window-size={width},{height}",
         html_file.as_uri()],
        capture_output=True, timeout=120, check=True,
    )
    if keep := os.environ.get("MAVJET_SCREENSHOT_DIR"):  # CI keeps them as artifacts
        shutil.copy(png, Path(keep) / png.name)
    with Image.open(png) as im:
        assert im.format == "PNG" and im.size == (width, height)
        return np.asarray(im.convert("RGB"), dtype=np.int16)


def _blue(px: Any) -> Any:
    import numpy as np

    return np.all(np.abs(px - np.array(BLUE)) < 40, axis=-1)


def _long_runs(mask: Any, min_px: int) -> list[tuple[int, int, int]]:
    """(row, first column, length) of the longest run of True in each row, for runs >= min_px."""
    out = []
    for y, row in enumerate(mask):
        best = (0, 0)
        start = None
        for x, on in enumerate([*row.tolist(), False]):
            if on and start is None:
                start = x
            elif not on and start is not None:
                best = max(best, (x - start, start))
                start = None
        if best[0] >= min_px:
            out.append((y, best[1], best[0]))
    return out


def _edges(runs: list[tuple[int, int, int]]) -> list[list[tuple[int, int, int]]]:
    """Runs in consecutive rows grouped: one drawn line or bar is a few pixels thick."""
    groups: list[list[tuple[int, int, int]]] = []
    for r in runs:
        if groups and r[0] - groups[-1][-1][0] <= 2:
            groups[-1].append(r)
        else:
            groups.append([r])
    return groups


@pytest.mark.skipif(CHROMIUM is None, reason="Debian chromium is not installed (`which chromium` finds nothing)")
def test_headless_chromium_screenshots_of_the_front_page_and_a_flight_page(tmp_path: Path) -> None:
    import numpy as np

    from mavjet.analytics.report import ReportData, render

    # The flight page: a 1 km square flown east, north, west, south must come out square on screen.
    page = tmp_path / "flight.html"
    page.write_text(flight_page(*_flight()), encoding="utf-8")
    px = screenshot(page, tmp_path / "flight.png")
    assert (px < 245).any(axis=-1).mean() > 0.03  # not a blank page
    runs = _long_runs(_blue(px), 120)
    groups = _edges(runs)
    assert len(groups) >= 2, runs  # the square's north and south edges (then the altitude plateau)
    top, bottom = groups[0], groups[1]
    side_px = float(np.median([r[2] for r in top]))
    height_px = float(np.mean([r[0] for r in bottom]) - np.mean([r[0] for r in top]))
    assert side_px > 200 and height_px == pytest.approx(side_px, rel=0.05)  # to scale: a square
    # the edges end at the same x: the east side is vertical (the start/end markers cover the west corner)
    assert abs((top[0][1] + top[0][2]) - (bottom[0][1] + bottom[0][2])) <= 4

    # The front page: KPIs, three charts, and the tables under them.
    d = ReportData(
        summary={"events": 1234}, kpis={"flights": 42, "failsafe_rate": 0.25},
        flights_per_vehicle=[(f"VID-{i:03d}", float(12 - i)) for i in range(8)],
        failsafe_days=[(dt.date(2025, 6, 1) + dt.timedelta(days=i)).isoformat() for i in range(30)],
        failsafe_series={"battery": [float(i % 3) for i in range(30)], "gcs": [float(i % 2) for i in range(30)]},
        latency_rows=[{"name": "arm", "result": "accepted", "count": 3, "latency_p50_ms": 40.0,
                       "latency_p95_ms": 90.0, "latency_p99_ms": 4000.0}],
    )
    front = tmp_path / "report.html"
    front.write_text(render(d), encoding="utf-8")
    px = screenshot(front, tmp_path / "report.png")
    blue = _blue(px)
    assert blue.mean() > 0.005  # the bars are drawn
    bars = _edges(_long_runs(blue, 60))
    # the flights-per-vehicle bars: 8 of them, the longest first and each shorter than the one above
    lengths = [max(r[2] for r in bar) for bar in bars[:8]]
    assert len(lengths) == 8 and all(a > b for a, b in itertools.pairwise(lengths)), lengths
    assert lengths[0] / lengths[-1] == pytest.approx(12 / 5, rel=0.05)  # bar length proportional to the count


# Appended to a copy of a page (the report itself has no scripts): the browser writes each cell's computed alignment
# into the DOM, which --dump-dom then shows.
ALIGN_PROBE = "<script>for (const td of document.querySelectorAll('td')) td.dataset.align = getComputedStyle(td).textAlign;</script>"


def dump_dom(html_file: Path) -> str:
    """The DOM as Chromium holds it after loading the page (scripts run)."""
    out = subprocess.run(
        [str(CHROMIUM), "--headless", "--disable-gpu", "--no-sandbox", "--dump-dom", html_file.as_uri()],
        capture_output=True, text=True, timeout=120, check=True,
    )
    return out.stdout


@pytest.mark.skipif(CHROMIUM is None, reason="Debian chromium is not installed (`which chromium` finds nothing)")
def test_headless_chromium_shows_the_marks_none_and_aligned_columns(tmp_path: Path) -> None:
    import numpy as np

    from mavjet.analytics.report import ReportData, render

    # A flight page with a mode change, a command and a failsafe: marked on the track and over time.
    page = tmp_path / "marked.html"
    page.write_text(flight_page(*_flight_with_marks()), encoding="utf-8")
    dom = dump_dom(page)
    for kind in ("failsafe", "mode", "command"):
        assert dom.count(f'id="mark-{kind}-0"') == 2, kind  # the track and the altitude chart
    assert dom.count("<title>2025-06-01 12:06:01 FAILSAFE battery -&gt; RTL</title>") == 2
    assert "5 positions (2 from the flight recorder" in dom and "track (5 positions, north up" in dom
    px = screenshot(page, tmp_path / "marked.png", height=1400)
    red = (px[..., 0] > 150) & (px[..., 1] < 110) & (px[..., 2] < 110)  # the failsafe's red, not the command's orange
    # the failsafe's dashed line on the altitude chart: a column red over much of the plot's height (the track's
    # markers are a few pixels tall)
    column = red.sum(axis=0)
    assert column.max() >= 60, column.max()
    rows = np.nonzero(red[:, int(column.argmax())])[0]
    assert rows.max() - rows.min() > 120  # a vertical line, dashed

    # The front page: an empty table says "none"; text cells left, numbers right, as the browser lays them out.
    d = ReportData(
        summary={"events": 1234, "error_rows": 0, "first_event": "2025-06-01T12:00:03.250000"},
        latency_rows=[{"name": "arm", "result": "accepted", "count": 3, "vehicles": 1, "latency_p50_ms": 4.0,
                       "latency_p95_ms": 6.0, "latency_p99_ms": 7.0},
                      {"name": "arm", "result": "rejected", "count": 1, "vehicles": 1, "latency_p50_ms": 420.0,
                       "latency_p95_ms": 420.0, "latency_p99_ms": 420.0}],
        command_rows=[{"name": "arm", "count": 4, "vehicles": 1, "accepted": 3, "rejected": 1}],
    )
    front = tmp_path / "report.html"
    front.write_text(render(d) + ALIGN_PROBE, encoding="utf-8")
    dom = dump_dom(front)
    assert "<figcaption>vehicles with the most failsafes</figcaption><p class=\"empty\">none</p>" in dom
    assert "undecodable events" in dom and "2025-06-01 12:00:03<" in dom and "error_rows<" not in dom
    assert '<td data-align="left">arm</td><td data-align="left">rejected</td>' in dom
    assert '<td class="num" data-align="right">420.0</td>' in dom
    screenshot(front, tmp_path / "report.png")  # kept with MAVJET_SCREENSHOT_DIR
