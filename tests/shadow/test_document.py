"""Pure core: desired document parsing, validation reasons, diff, flight rules, backoff."""

from __future__ import annotations

import json

import pytest

from mavjet.drivers.mavlink.dialect import mavlink2
from mavjet.drivers.mavlink.mission import FENCE
from mavjet.drivers.mavlink.plan import Plan
from mavjet.gateway.shadow.diff import (
    DeltaBook,
    FlightRecord,
    LiveConfig,
    VehicleView,
    flight_due,
    flight_hold,
    retry_delay_s,
)
from mavjet.gateway.shadow.document import Desired, check_mode, check_param, parse_desired
from mavjet.gateway.shadow.fence import fence_to_json, rate_matches, rate_message
from mavjet.gateway.shadow.steps import (
    Finding,
    GeofenceStep,
    MissionStep,
    ParamsStep,
    RatesStep,
    Verdict,
)

INT8 = mavlink2.MAV_PARAM_TYPE_INT8
INT32 = mavlink2.MAV_PARAM_TYPE_INT32
REAL32 = mavlink2.MAV_PARAM_TYPE_REAL32
DIGEST = "ab" * 32


def doc(**fields: object) -> bytes:
    return json.dumps(fields).encode()


def test_full_document_parses() -> None:
    d = parse_desired(
        doc(
            mode="guided", armed=False, params={"RTL_ALT": 2000, "WPNAV_SPEED": 7.5},
            mission={"object": "missions/a.plan", "digest": DIGEST},
            geofence={"polygons": [{"inclusion": True, "points": [[1, 2], [1, 3], [2, 3]]}],
                      "circles": [{"inclusion": False, "center": [1.5, 2.5], "radius_m": 20}],
                      "max_alt_m": 120, "action": "rtl"},
            rates={"position": 5, "ATTITUDE": 4},
        ),
        revision=7,
    )
    assert d.errors == {}
    assert d.revision == 7
    assert d.mode == "GUIDED" and d.armed is False
    assert d.params == {"RTL_ALT": 2000.0, "WPNAV_SPEED": 7.5}
    assert d.mission is not None and d.mission.object == "missions/a.plan"
    assert d.geofence is not None and len(d.geofence.polygons) == 1 and d.geofence.circles[0].radius_m == 20
    assert d.rates == {"position": 5.0, "ATTITUDE": 4.0}
    assert d.valid_fields == ("mode", "armed", "params", "mission", "geofence", "rates")


@pytest.mark.parametrize(
    ("data", "path", "fragment"),
    [
        (b"{not json", "$", "not valid JSON"),
        (b"[1, 2]", "$", "expected a JSON object"),
        (doc(colour="red"), "colour", "unknown field"),
        (doc(mode=3), "mode", "expected a mode name"),
        (doc(armed="yes"), "armed", "true or false"),
        (doc(params=[1]), "params", "expected an object"),
        (doc(params={"rtl_alt": 1}), "params.rtl_alt", "not a parameter name"),
        (doc(params={"A_VERY_LONG_PARAMETER_NAME": 1}), "params.A_VERY_LONG_PARAMETER_NAME", "at most 16"),
        (doc(params={"RTL_ALT": "high"}), "params.RTL_ALT", "finite number"),
        (doc(mission={"object": "x"}), "mission", "digest"),
        (doc(mission={"object": "x", "digest": "zz"}), "mission", "digest"),
        (doc(geofence={"polygons": [{"points": [[1, 2], [1, 3]]}]}), "geofence.polygons[0].points", "at least 3"),
        (doc(geofence={"polygons": [{"points": [[91, 2], [1, 3], [2, 2]]}]}), "geofence.polygons[0].points[0]", "latitude"),
        (doc(geofence={"circles": [{"center": [1, 2], "radius_m": -3}]}), "geofence.circles[0].radius_m", "positive"),
        (doc(geofence={"max_alt_m": 100, "action": "explode"}), "geofence.action", "unknown action"),
        (doc(geofence={}), "geofence", "needs at least one"),
        (doc(rates={"position": 0}), "rates.position", "rate must be"),
        (doc(rates={"position": 500}), "rates.position", "rate must be"),
        (doc(rates={"smell": 1}), "rates.smell", "unknown channel"),
    ],
)
def test_bad_fields_have_reasons(data: bytes, path: str, fragment: str) -> None:
    d = parse_desired(data, revision=1)
    assert path in d.errors, d.errors
    assert fragment in d.errors[path]


def test_bad_field_leaves_good_fields_usable() -> None:
    d = parse_desired(doc(params={"RTL_ALT": 1500, "BAD": "x"}, mode=5, rates={"gps": 2}), revision=3)
    assert d.params == {"RTL_ALT": 1500.0}
    assert set(d.errors) == {"params.BAD", "mode"}
    assert "rates" in d.valid_fields and "mode" not in d.valid_fields


def test_empty_and_deleted_documents_have_no_opinion() -> None:
    for data in (None, b"", b"  ", b"{}"):
        d = parse_desired(data, revision=2)
        assert d.errors == {} and d.valid_fields == ()


def test_check_param_against_vehicle_types() -> None:
    assert check_param("X", 1, None) is not None and "unknown parameter" in (check_param("X", 1, None) or "")
    assert "out of range" in (check_param("FENCE_ENABLE", 300, INT8) or "")
    assert "not an integer" in (check_param("RTL_ALT", 1.5, INT32) or "")
    assert check_param("RTL_ALT", 2000, INT32) is None
    assert check_param("WPNAV_SPEED", 1.5, REAL32) is None
    assert check_mode("GUIDED", ["STABILIZE", "GUIDED"]) is None
    assert "unknown mode" in (check_mode("WARP", ["GUIDED"]) or "")
    assert check_mode("GUIDED", []) is not None


async def _no_plan(name: str) -> Plan:
    raise AssertionError("observe() does no I/O")


def config_delta(d: Desired, live: LiveConfig) -> dict[str, Finding]:
    """The config steps' observe(), as the reconciler runs them: paths not as desired (or not read yet)."""
    steps = (ParamsStep(), MissionStep(_no_plan), GeofenceStep(), RatesStep(request_timeout_s=1.0))
    return {f.path: f for step in steps for f in step.observe(d, live) if f.verdict is not Verdict.OK}


def test_config_delta_params_tolerance_and_missing() -> None:
    d = parse_desired(doc(params={"RTL_ALT": 2000, "WPNAV_SPEED": 7.3}), revision=1)
    live = LiveConfig(params={"RTL_ALT": (2000.0, INT32), "WPNAV_SPEED": (7.300000190734863, REAL32)})
    assert config_delta(d, live) == {}
    live.params["RTL_ALT"] = (1500.0, INT32)
    delta = config_delta(d, live)
    assert set(delta) == {"params.RTL_ALT"} and delta["params.RTL_ALT"].reported == 1500.0
    assert set(config_delta(d, LiveConfig())) == {"params.RTL_ALT", "params.WPNAV_SPEED"}


def test_config_delta_mission_fence_rates() -> None:
    d = parse_desired(
        doc(mission={"object": "m", "digest": DIGEST[:16]}, rates={"position": 5},
            geofence={"circles": [{"center": [1, 2], "radius_m": 50}], "max_alt_m": 80, "action": "land"}),
        revision=1,
    )
    assert d.geofence is not None
    want = d.geofence.digest
    params = {k: (v, REAL32) for k, v in d.geofence.params().items()}
    live = LiveConfig(params=params, mission_digest=DIGEST, fence_digest=want, fence_items=list(d.geofence.items()),
                      rates_hz={"position": 5.0})
    assert config_delta(d, live) == {}
    live.mission_digest = "cd" * 32
    live.fence_digest = None
    live.rates_hz["position"] = 10.0
    delta = config_delta(d, live)
    # the geofence step's one path says what differs: here the zones (items), not the FENCE_* params
    assert set(delta) == {"mission", "geofence", "rates.position"}
    assert delta["geofence"].reason.startswith("zones digest") and "FENCE_" not in delta["geofence"].reason
    assert d.geofence.params()["FENCE_ACTION"] == 2.0


def test_fence_items_and_back() -> None:
    d = parse_desired(
        doc(geofence={"polygons": [{"inclusion": False, "points": [[1, 2], [1, 3], [2, 3]]}],
                      "circles": [{"inclusion": True, "center": [1.5, 2.5], "radius_m": 40}], "max_alt_m": 60}),
        revision=1,
    )
    assert d.geofence is not None
    items = d.geofence.items()
    assert len(items) == 4 and all(i.mission_type == FENCE for i in items)
    assert items[0].command == mavlink2.MAV_CMD_NAV_FENCE_POLYGON_VERTEX_EXCLUSION
    assert items[3].command == mavlink2.MAV_CMD_NAV_FENCE_CIRCLE_INCLUSION
    back = fence_to_json(items, d.geofence.params())
    assert back["polygons"][0]["inclusion"] is False and len(back["polygons"][0]["points"]) == 3
    assert back["circles"][0]["radius_m"] == 40 and back["max_alt_m"] == 60 and back["enabled"] is True
    assert d.geofence.params()["FENCE_TYPE"] == 5.0
    assert back["digest"] == d.geofence.digest


def test_rates() -> None:
    assert rate_message("position") == ("GLOBAL_POSITION_INT", mavlink2.MAVLINK_MSG_ID_GLOBAL_POSITION_INT)
    assert rate_message("NOT_A_MESSAGE") is None
    assert rate_matches(5.0, 5.0) and rate_matches(3.0, 3.0001) and not rate_matches(5.0, 10.0)
    assert not rate_matches(5.0, 0.0)


def test_delta_book_keeps_since_while_desired_unchanged() -> None:
    book = DeltaBook()
    book.set("params.X", desired=1, reported=0, reason="differs", now_s=100.0)
    book.set("params.X", desired=1, reported=0, reason="rejected", now_s=200.0, attempts=3)
    e = book.entries["params.X"]
    assert e.since_s == 100.0 and e.reason == "rejected" and e.attempts == 3
    book.set("params.X", desired=2, reported=0, reason="differs", now_s=300.0)
    assert book.entries["params.X"].since_s == 300.0 and book.entries["params.X"].attempts == 0
    book.set("geofence.items", desired="a", reported=None, reason="r", now_s=1.0)
    book.clear_prefix("geofence")
    assert set(book.entries) == {"params.X"}
    js = book.to_json()
    assert js["params.X"]["since"].endswith("Z") and js["params.X"]["desired"] == 2


def test_backoff_is_capped() -> None:
    delays = [retry_delay_s(n, 1.0, 30.0) for n in range(8)]
    assert delays[:4] == [0.0, 1.0, 2.0, 4.0]
    assert max(delays) == 30.0 and delays == sorted(delays)


def test_flight_due_once_per_revision() -> None:
    assert flight_due(3, None, max_attempts=3)
    ok = FlightRecord(revision=3, value="GUIDED", result="accepted")
    assert not flight_due(3, ok, max_attempts=3)
    assert flight_due(4, ok, max_attempts=3)
    failed = FlightRecord(revision=3, value=True, result="failed", attempts=2)
    assert flight_due(3, failed, max_attempts=3)
    assert not flight_due(3, FlightRecord(revision=3, value=True, result="failed", attempts=3), max_attempts=3)
    assert not flight_due(2, ok, max_attempts=3)
    again = FlightRecord.from_json(ok.to_json())
    assert again is not None and again.revision == 3 and again.value == "GUIDED"
    assert FlightRecord.from_json({"nonsense": 1}) is None


def _view(**kw: object) -> VehicleView:
    base: dict[str, object] = dict(mode="GUIDED", armed=False, failsafe_active=False, in_recovery_mode=False,
                                   recovery_by_autopilot=False, in_air=False, link_up=True)
    base.update(kw)
    return VehicleView(**base)  # type: ignore[arg-type]


def test_flight_hold_rules() -> None:
    assert flight_hold("mode", "AUTO", _view(), revision_seen_after_recovery=False) is None
    assert "failsafe" in (flight_hold("mode", "AUTO", _view(failsafe_active=True, mode="RTL"),
                                      revision_seen_after_recovery=True) or "")
    rtl = _view(mode="RTL", in_recovery_mode=True, recovery_by_autopilot=True)
    assert "on its own" in (flight_hold("mode", "AUTO", rtl, revision_seen_after_recovery=False) or "")
    assert flight_hold("mode", "AUTO", rtl, revision_seen_after_recovery=True) is None
    assert "airborne" in (flight_hold("armed", False, _view(in_air=True, armed=True),
                                      revision_seen_after_recovery=False) or "")
    assert flight_hold("armed", True, _view(link_up=False), revision_seen_after_recovery=False) == "link down"
