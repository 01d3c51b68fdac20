"""The per-flight page: track to scale, altitude and battery over time, events; pure (no Spark)."""

from __future__ import annotations

import datetime as dt
import math
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import pytest

from analytics.flightreport import flight_file, flight_page, project_m, track_svg
from analytics.synth import haversine_m

SVG = "{http://www.w3.org/2000/svg}"
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


def test_projection_keeps_metres_equal_on_both_axes() -> None:
    a, b, c = project_m([(47.0, 8.0), (47.0, 8.01), (47.01, 8.0)])
    east = math.dist(a, b)
    north = math.dist(a, c)
    assert east == pytest.approx(haversine_m(47.0, 8.0, 47.0, 8.01), rel=1e-3)
    assert north == pytest.approx(haversine_m(47.0, 8.0, 47.01, 8.0), rel=1e-3)


def test_track_is_drawn_to_scale_north_up() -> None:
    _, samples, _ = _flight()
    svg = ElementTree.fromstring(track_svg([(s["lat_deg"], s["lon_deg"]) for s in samples])).find(f"{SVG}svg")
    assert svg is not None
    m_per_px = float(svg.get("data-m-per-px", "0"))
    line = next(e for e in svg.iter(f"{SVG}polyline") if e.get("class") == "track")
    pts = [tuple(map(float, p.split(","))) for p in (line.get("points") or "").split()]
    (x0, y0), (x1, y1), (x2, y2) = pts[0], pts[1], pts[2]
    assert (x1 - x0) * m_per_px == pytest.approx(1000, rel=2e-3) and y1 == pytest.approx(y0)  # east: right
    assert (y1 - y2) * m_per_px == pytest.approx(1000, rel=2e-3) and x2 == pytest.approx(x1)  # north: up
    bar = next(e for e in svg.iter(f"{SVG}line") if e.get("class") == "scale-bar")
    label = next(e for e in svg.iter(f"{SVG}text") if e.get("class") == "scale-label").text or ""
    bar_m = (float(bar.get("x2", "0")) - float(bar.get("x1", "0"))) * m_per_px
    assert label in ("200 m", "500 m") and bar_m == pytest.approx(float(label.split()[0]), rel=1e-3)
    assert "no positions" in track_svg([])


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


@pytest.mark.skipif(CHROMIUM is None, reason="Debian chromium is not installed (`which chromium` finds nothing)")
def test_headless_chromium_screenshot(tmp_path: Path) -> None:
    page = tmp_path / "flight.html"
    page.write_text(flight_page(*_flight()), encoding="utf-8")
    shot = tmp_path / "flight.png"
    subprocess.run(
        [str(CHROMIUM), "--headless", "--disable-gpu", "--no-sandbox", f"--screenshot={shot}",
         "--window-size=1000,1800", page.as_uri()],
        capture_output=True, timeout=120, check=True,
    )
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000  # a rendered page, not a blank
