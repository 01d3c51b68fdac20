"""`mavjet fleet`: the view fits 80x24, filters by vid glob, and its feed shows what an operator acts on."""

from __future__ import annotations

import datetime as dt
from typing import Any

from mavjet.ops.fleet import FleetView
from mavjet.ops.read import Record

NOW = dt.datetime(2026, 11, 23, 12, 0, 0, tzinfo=dt.UTC)


def state(vid: str, kind: str, **data: Any) -> Record:
    return Record(f"fleet.t.veh.{vid}.state.{kind}", vid, kind, 1, NOW - dt.timedelta(seconds=0.4), data)


def event(vid: str, kind: str, i: int, **data: Any) -> Record:
    return Record(f"fleet.t.veh.{vid}.evt.{kind}", vid, kind, i, NOW - dt.timedelta(seconds=30 - i), data)


def fleet(n: int, **kw: Any) -> FleetView:
    view = FleetView(**kw)
    for i in range(1, n + 1):
        vid = f"VID-{i:03d}"
        view.on_state(state(vid, "status", mode="GUIDED_NOGPS_LONG_MODE", armed=i % 2 == 0))
        view.on_state(state(vid, "position", lat_deg=-35.3632621, lon_deg=149.1652374, alt_m=12.0,
                            groundspeed_m_s=4.5))
        view.on_state(state(vid, "battery", remaining_pct=87.0))
        view.on_state(state(vid, "link", state="up", period_s=1.0))
    for i in range(12):
        view.on_event(event(f"VID-{i + 1:03d}", "statustext", i, severity=6, text="x" * 150))
    return view


def test_thirty_vehicles_fit_80_by_24() -> None:
    text = fleet(30).render(NOW, "mavjet fleet — env t", width=80, height=24)
    lines = text.splitlines()
    assert len(lines) <= 24, len(lines)
    assert max(len(line) for line in lines) <= 80
    assert "POSITION" not in lines[1]  # the first column to go on a narrow screen
    assert any(line.startswith("… ") and "more" in line for line in lines)
    assert "EVENTS" in lines and sum(1 for line in lines if "statustext" in line) >= 3


def test_wide_and_unbounded_keeps_everything() -> None:
    text = fleet(30).render(NOW)
    assert "POSITION" in text and "-35.36326,149.16524" in text
    assert sum(1 for line in text.splitlines() if line.startswith("VID-")) == 30


def test_vid_glob_filters_rows_and_events() -> None:
    view = fleet(30, vid_glob="VID-00*")
    assert [r[0] for r in view.rows(NOW)] == [f"VID-{i:03d}" for i in range(1, 10)]
    assert all(e.vid.startswith("VID-00") for e in view.events)


def test_feed_hides_successful_command_results_unless_asked() -> None:
    quiet, loud = FleetView(), FleetView(all_events=True)
    for view in (quiet, loud):
        view.on_event(event("VID-001", "cmd_result", 1, name="set_mode", result="accepted"))
        view.on_event(event("VID-001", "cmd_result", 2, name="arm", result="rejected"))
        view.on_event(event("VID-001", "failsafe", 3, failsafe_type="battery"))
    assert [(e.kind, e.data.get("result")) for e in quiet.events] == [("cmd_result", "rejected"), ("failsafe", None)]
    assert len(loud.events) == 3


def test_json_gives_rows_with_staleness_and_hides_stale_values_under_last() -> None:
    view = fleet(2)
    old = NOW - dt.timedelta(seconds=60)
    view.on_state(Record("fleet.t.veh.VID-009.state.status", "VID-009", "status", 1, old, {"mode": "AUTO", "armed": True}))
    view.on_state(Record("fleet.t.veh.VID-009.state.link", "VID-009", "link", 1, old, {"state": "up", "period_s": 1.0}))
    doc = view.to_json(NOW)
    rows = {r["vid"]: r for r in doc["vehicles"]}  # type: ignore[union-attr,index]
    assert rows["VID-001"]["stale"] is False and rows["VID-001"]["mode"] == "GUIDED_NOGPS_LONG_MODE"
    assert rows["VID-009"]["stale"] is True and "armed" not in rows["VID-009"]
    assert rows["VID-009"]["last"]["status"]["armed"] is True
    assert len(doc["events"]) == 12  # type: ignore[arg-type]


def test_an_empty_fleet_with_a_full_feed_fits_the_height_too() -> None:
    view = FleetView()
    for i in range(12):
        view.on_event(event("VID-001", "statustext", i, severity=6, text="hello"))
    lines = view.render(NOW, "title", width=80, height=10).splitlines()
    assert len(lines) <= 10 and "(no vehicles yet)" in lines and lines[-1].count("statustext") == 1
