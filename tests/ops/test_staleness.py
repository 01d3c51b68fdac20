"""The staleness rule readers apply (mavjet twin, mavjet fleet), and the gateway clock behind it."""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

from mavjet.gateway.twin.clock import GatewayClock
from mavjet.ops.fleet import FleetView
from mavjet.ops.read import STALE_AFTER_S, Record, age_s, staleness

NOW = dt.datetime(2025, 1, 1, 12, 0, 0, tzinfo=dt.UTC)


def rec(kind: str, ago_s: float, vid: str = "VID-001", **data: Any) -> Record:
    return Record(f"fleet.test.veh.{vid}.state.{kind}", vid, kind, 1, NOW - dt.timedelta(seconds=ago_s), data)


def link(ago_s: float, state: str = "up", period_s: float | None = 1.0, vid: str = "VID-001") -> Record:
    return rec("link", ago_s, vid, state=state, gateway="gw", period_s=period_s)


def test_age_is_reader_clock_minus_sample_time() -> None:
    assert age_s(NOW - dt.timedelta(seconds=2.5), NOW) == 2.5
    assert age_s(NOW + dt.timedelta(seconds=1), NOW) == -1.0


def test_fresh_twin() -> None:
    s = staleness({"position": rec("position", 0.2), "status": rec("status", 0.9), "link": link(0.5)}, NOW)
    assert not s.stale and s.reason is None
    assert s.age_s == 0.2 and s.gateway_age_s == 0.5


def test_newest_vehicle_sample_decides_the_age_not_the_gateway_record() -> None:
    # The gateway keeps publishing `link` for a silent vehicle: that is not vehicle data.
    s = staleness({"position": rec("position", 30.0), "link": link(0.3, state="lost")}, NOW)
    assert s.stale and s.age_s == 30.0 and s.reason == "link lost"
    s = staleness({"position": rec("position", 6.0), "link": link(0.3)}, NOW)
    assert s.stale and s.reason == "no data for 6 s"
    assert not staleness({"position": rec("position", 6.0), "link": link(0.3)}, NOW, stale_after_s=10.0).stale


def test_gateway_gone_when_its_liveness_record_stops() -> None:
    chans = {"position": rec("position", STALE_AFTER_S + 1), "link": link(STALE_AFTER_S + 1)}
    s = staleness(chans, NOW)
    assert s.stale and s.reason == "gateway gone" and s.gateway_age_s == STALE_AFTER_S + 1
    # A slow link period (0.1 Hz) gets 3 periods of grace before the gateway counts as gone.
    s = staleness({"position": rec("position", 1.0), "link": link(20.0, period_s=10.0)}, NOW)
    assert not s.stale
    assert staleness({"position": rec("position", 1.0), "link": link(31.0, period_s=10.0)}, NOW).reason == "gateway gone"
    # A gateway that never wrote one (or a malformed period) is judged by stale_after_s alone.
    assert staleness({"position": rec("position", 1.0)}, NOW).reason == "no gateway record"
    assert staleness({"position": rec("position", 1.0), "link": link(6.0, period_s=None)}, NOW).reason == "gateway gone"


def test_no_data_and_future_samples_are_stale() -> None:
    assert staleness({"link": link(0.1)}, NOW).reason == "no data"
    assert staleness({}, NOW).stale
    # A sample far in the future (a vehicle clock, a skewed host) would look fresh forever.
    s = staleness({"position": rec("position", -18.0), "link": link(0.1)}, NOW)
    assert s.stale and s.reason == "clock skew"
    # Small skew between hosts is tolerated.
    assert not staleness({"position": rec("position", -0.5), "link": link(-0.2)}, NOW).stale


def test_fleet_rows_mark_stale_never_up_or_armed() -> None:
    view = FleetView()
    for r in (rec("status", 0.5, "VID-001", mode="GUIDED", armed=True), link(0.5, vid="VID-001"),
              rec("status", 40.0, "VID-002", mode="AUTO", armed=True), link(40.0, vid="VID-002")):
        view.on_state(r)
    rows = {r[0]: r for r in view.rows(NOW)}
    assert rows["VID-001"][2] == "ARMED" and rows["VID-001"][7] == "up" and rows["VID-001"][9] == "0.5s"
    assert rows["VID-001"][8] == "gw"  # OWNER: the gateway whose link record this is (with ownership, the owner)
    assert rows["VID-002"][2] == "stale" and rows["VID-002"][7] == "stale: gateway gone"
    assert "ARMED" not in rows["VID-002"] and "up" not in rows["VID-002"]
    text = view.render(NOW)
    assert "stale: gateway gone" in text


def test_gateway_clock_is_monotonic_anchored() -> None:
    c = GatewayClock(wall_ns=1_000_000_000_000, monotonic_ns=time.monotonic_ns())
    a = c.now_ns()
    b = c.now_ns()
    assert 1_000_000_000_000 <= a <= b < 1_000_000_000_000 + 10**9
    # Anchored to the wall clock when made (a later wall-clock step does not move it).
    real = GatewayClock()
    assert abs(real.now_ns() - time.time_ns()) < 50_000_000
