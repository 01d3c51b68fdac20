"""Each shadow step's observe() — the diff a pass runs — fed with documents and read-back values. Pure."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mavjet.drivers.mavlink.dialect import mavlink2
from mavjet.drivers.mavlink.plan import Plan, parse_plan
from mavjet.gateway.shadow.book import RetryBook
from mavjet.gateway.shadow.diff import FlightRecord, FlightResult, LiveConfig, VehicleView
from mavjet.gateway.shadow.document import Desired, parse_desired
from mavjet.gateway.shadow.steps import GeofenceStep, MissionStep, ParamsStep, RatesStep, Verdict
from mavjet.gateway.shadow.steps.flight import FlightTracker, observe_flight
from mavjet.gateway.shadow.steps.geofence import reported_fence
from mavjet.gateway.shadow.steps.mission import check_plan
from mavjet.gateway.shadow.steps.params import observe_param

INT8 = mavlink2.MAV_PARAM_TYPE_INT8
INT32 = mavlink2.MAV_PARAM_TYPE_INT32
REAL32 = mavlink2.MAV_PARAM_TYPE_REAL32
PLAN = Path(__file__).resolve().parents[2] / "sim" / "plans" / "demo.plan"
FENCE = {"circles": [{"center": [1, 2], "radius_m": 50}], "max_alt_m": 80, "action": "land"}


def desired(revision: int = 1, **fields: Any) -> Desired:
    return parse_desired(json.dumps(fields).encode(), revision=revision)


async def no_plan(name: str) -> Plan:
    raise AssertionError("observe() does no I/O")


def verdicts(findings: list[Any]) -> dict[str, Verdict]:
    return {f.path: f.verdict for f in findings}


# -- params --------------------------------------------------------------------------


def test_params_observe() -> None:
    d = desired(params={"RTL_ALT": 2000, "WPNAV_SPEED": 7.3, "FENCE_ENABLE": 300, "bad": 1})
    live = LiveConfig(params={"RTL_ALT": (1500.0, INT32), "WPNAV_SPEED": (7.300000190734863, REAL32),
                              "FENCE_ENABLE": (0.0, INT8)})
    found = {f.path: f for f in ParamsStep().observe(d, live)}
    assert "params.bad" not in found  # a schema error is the document's, not the step's
    assert found["params.RTL_ALT"].verdict is Verdict.ACT
    assert found["params.RTL_ALT"].desired == 2000 and found["params.RTL_ALT"].reported == 1500
    assert found["params.WPNAV_SPEED"].verdict is Verdict.OK  # float32 round trip
    assert found["params.FENCE_ENABLE"].verdict is Verdict.HOLD and "out of range" in found["params.FENCE_ENABLE"].reason
    assert verdicts(ParamsStep().observe(d, LiveConfig())) == {
        "params.RTL_ALT": Verdict.UNKNOWN, "params.WPNAV_SPEED": Verdict.UNKNOWN, "params.FENCE_ENABLE": Verdict.UNKNOWN,
    }


def test_observe_param_integer_type() -> None:
    f = observe_param("params.RTL_ALT", "RTL_ALT", 1.5, (1.0, INT32))
    assert f.verdict is Verdict.HOLD and "not an integer" in f.reason and f.key == "RTL_ALT"
    assert observe_param("params.X", "X", 3, (3.0, INT32)).verdict is Verdict.OK


# -- mission -------------------------------------------------------------------------


def test_mission_observe_and_plan_check() -> None:
    plan = parse_plan(PLAN.read_bytes())
    step = MissionStep(no_plan)
    assert step.observe(desired(), LiveConfig()) == []
    d = desired(mission={"object": "missions/demo.plan", "digest": plan.mission_digest[:16]})
    assert verdicts(step.observe(d, LiveConfig())) == {"mission": Verdict.UNKNOWN}
    assert verdicts(step.observe(d, LiveConfig(mission_digest=plan.mission_digest))) == {"mission": Verdict.OK}
    [f] = step.observe(d, LiveConfig(mission_digest="cd" * 32))
    assert f.verdict is Verdict.ACT and f.reported == "cd" * 32 and f.desired == plan.mission_digest[:16]
    assert check_plan(d.mission, plan) is None  # type: ignore[arg-type]
    other = desired(mission={"object": "missions/demo.plan", "digest": "0" * 64})
    assert "desired says" in (check_plan(other.mission, plan) or "")  # type: ignore[arg-type]
    assert step.observe(desired(mission={"object": "x"}), LiveConfig()) == []  # invalid: the document reports it


# -- geofence ------------------------------------------------------------------------


def test_geofence_observe() -> None:
    d = desired(geofence=FENCE)
    g = d.geofence
    assert g is not None
    step = GeofenceStep()
    params = {k: (v, REAL32) for k, v in g.params().items()}
    assert verdicts(step.observe(d, LiveConfig(params=params))) == {"geofence": Verdict.UNKNOWN}  # items not read
    items = list(g.items())
    partial = dict(params)
    partial.pop("FENCE_ALT_MAX")
    assert verdicts(step.observe(d, LiveConfig(params=partial, fence_items=items, fence_digest=g.digest))) == {
        "geofence": Verdict.UNKNOWN}
    live = LiveConfig(params=params, fence_items=items, fence_digest=g.digest)
    [ok] = step.observe(d, live)
    assert ok.verdict is Verdict.OK and ok.reported == reported_fence(live)
    live.params["FENCE_ALT_MAX"] = (50.0, REAL32)
    [off] = step.observe(d, live)
    assert off.verdict is Verdict.ACT and off.reason == "FENCE_ALT_MAX=50 (want 80)"
    live.fence_digest = "ee" * 32
    [off] = step.observe(d, live)
    assert off.reason.startswith("zones digest eeeeeeeeeeee") and off.reason.endswith("(want 80)")
    assert step.observe(desired(geofence={}), live) == []


def test_reported_fence() -> None:
    d = desired(geofence=FENCE)
    assert d.geofence is not None
    assert reported_fence(LiveConfig()) is None
    live = LiveConfig(params={k: (v, REAL32) for k, v in d.geofence.params().items()}, fence_items=list(d.geofence.items()))
    rep = reported_fence(live)
    assert rep is not None and rep["max_alt_m"] == 80 and rep["action"] == "land" and rep["digest"] == d.geofence.digest


# -- rates ---------------------------------------------------------------------------


def test_rates_observe() -> None:
    d = desired(rates={"position": 5, "attitude": 4, "gps": 2, "NOT_A_MESSAGE": 1})
    live = LiveConfig(rates_hz={"position": 5.0, "attitude": 10.0})
    found = {f.path: f for f in RatesStep(request_timeout_s=1.0).observe(d, live)}
    assert found["rates.position"].verdict is Verdict.OK
    assert found["rates.attitude"].verdict is Verdict.ACT and found["rates.attitude"].reported == 10.0
    assert found["rates.gps"].verdict is Verdict.UNKNOWN
    assert found["rates.NOT_A_MESSAGE"].verdict is Verdict.HOLD
    assert "not a MAVLink message" in found["rates.NOT_A_MESSAGE"].reason


# -- mode and armed ------------------------------------------------------------------


def view(**kw: Any) -> VehicleView:
    base: dict[str, Any] = dict(mode="LOITER", armed=False, failsafe_active=False, in_recovery_mode=False,
                                recovery_by_autopilot=False, in_air=False, link_up=True,
                                known_modes=("LOITER", "GUIDED", "RTL"))
    base.update(kw)
    return VehicleView(**base)


def flight(fld: str, d: Desired, v: VehicleView, record: FlightRecord | None = None, *,
           after_recovery: bool = False) -> tuple[Verdict, str]:
    [f] = observe_flight(fld, d, v, record, revision_seen_after_recovery=after_recovery, max_attempts=3)
    return f.verdict, f.reason


def test_mode_observe() -> None:
    d = desired(3, mode="GUIDED")
    assert observe_flight("mode", desired(3), view(), None, revision_seen_after_recovery=False, max_attempts=3) == []
    assert flight("mode", d, view()) == (Verdict.ACT, "")
    assert flight("mode", d, view(mode="GUIDED")) == (Verdict.ALREADY, "")
    verdict, reason = flight("mode", desired(3, mode="WARP"), view())
    assert verdict is Verdict.HOLD and "unknown mode" in reason
    assert "no HEARTBEAT" in flight("mode", d, view(known_modes=()))[1]
    # once per revision: done, then a pilot changed it -> reported, not overridden
    done = FlightRecord(revision=3, value="GUIDED", result=FlightResult.ACCEPTED)
    assert flight("mode", d, view(mode="GUIDED"), done) == (Verdict.OK, "")
    verdict, reason = flight("mode", d, view(mode="LOITER"), done)
    assert verdict is Verdict.HOLD and "not overridden" in reason
    assert flight("mode", desired(4, mode="GUIDED"), view(), done) == (Verdict.ACT, "")
    gave_up = FlightRecord(revision=3, value="GUIDED", result=FlightResult.FAILED, attempts=3, reason="rejected")
    verdict, reason = flight("mode", d, view(), gave_up)
    assert verdict is Verdict.HOLD and reason.startswith("gave up after 3 attempts")
    retry = FlightRecord(revision=3, value="GUIDED", result=FlightResult.FAILED, attempts=1)
    assert flight("mode", d, view(), retry) == (Verdict.ACT, "")


def test_flight_holds() -> None:
    d = desired(5, mode="GUIDED", armed=False)
    verdict, reason = flight("mode", d, view(mode="RTL", failsafe_active=True))
    assert verdict is Verdict.HOLD and "failsafe" in reason
    rtl = view(mode="RTL", in_recovery_mode=True, recovery_by_autopilot=True)
    assert "on its own" in flight("mode", d, rtl)[1]
    assert flight("mode", d, rtl, after_recovery=True) == (Verdict.ACT, "")
    verdict, reason = flight("armed", d, view(armed=True, in_air=True))
    assert verdict is Verdict.HOLD and "never disarms" in reason
    assert flight("armed", d, view(armed=True)) == (Verdict.ACT, "")
    assert flight("armed", d, view(link_up=False, armed=True)) == (Verdict.HOLD, "link down")


def test_flight_tracker_tells_own_modes_from_the_autopilots() -> None:
    t = FlightTracker()
    t.own_mode = ("RTL", 100.0)
    t.on_mode("RTL", 101.0)  # the mode we asked for
    assert t.recovery_entered_mono is None
    t.on_mode("LAND", 102.0)  # chosen by the autopilot
    assert t.recovery_entered_mono == 102.0
    t.revision_seen_mono = 103.0
    assert t.revision_seen_after_recovery()
    t.on_mode("GUIDED", 104.0)
    assert t.recovery_entered_mono is None and not t.revision_seen_after_recovery()
    t.on_statustext("PreArm: Battery below minimum arming voltage", 200.0)
    assert t.recent_text(201.0) == " (PreArm: Battery below minimum arming voltage)" and t.recent_text(210.0) == ""


# -- the retry book ------------------------------------------------------------------


def test_retry_book() -> None:
    book = RetryBook(retry_initial_s=1.0, retry_max_s=4.0, fail_after_attempts=2)
    book.begin_pass()
    assert book.due("mode", now_mono=0.0)
    assert not book.fail("mode", "GUIDED", "LOITER", "rejected", revision=1, now_mono=10.0)
    assert not book.due("mode", now_mono=10.5) and book.due("mode", now_mono=11.0)
    assert book.fail("mode", "GUIDED", "LOITER", "rejected", revision=1, now_mono=11.0)  # threshold: announce once
    assert not book.fail("mode", "GUIDED", "LOITER", "rejected", revision=1, now_mono=13.0)
    assert book.delta.entries["mode"].attempts == 3 and book.next_due_mono() == 17.0
    book.waiting("mode", "GUIDED", "LOITER")
    assert book.delta.entries["mode"].reason == "rejected"
    book.note("params.X", 1, None, "unknown parameter")
    book.end_pass()
    assert set(book.delta.entries) == {"mode", "params.X"}
    book.begin_pass()
    book.ok("mode")
    book.end_pass()  # params.X was not spoken about in this pass: dropped
    assert not book.delta and book.next_due_mono() is None
    book.give_up("x")
    book.reset()
    assert book.attempts == {}
