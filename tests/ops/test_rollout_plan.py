"""`mavjet rollout`'s rules as pure functions: targets, waves, thresholds, the per-vehicle state machine."""

from __future__ import annotations

from typing import Any

import pytest

from mavjet.ops.rollout import parse_change
from mavjet.ops.rollout_plan import (
    Failure,
    Observation,
    Progress,
    Rollout,
    RolloutError,
    RolloutStatus,
    Settings,
    Step,
    advance,
    field_progress,
    new_rollout,
    resume_halted,
    stop,
    to_roll_back,
    write_failed,
    written,
)
from mavjet.ops.rollout_targets import (
    apply_change,
    parse_selector,
    parse_threshold,
    parse_waves,
    plan_waves,
    select,
    tag_view,
)

CHANGE = {"params.RTL_ALT": 2000}


def test_selector_and_tag_view() -> None:
    assert parse_selector("type=quad, site=north") == {"type": "quad", "site": "north"}
    for bad in ("", "type", "type=", "=quad", "a b=c"):
        with pytest.raises(RolloutError):
            parse_selector(bad)
    # operator tags win over meta; non-scalars are not matched; bools read as true/false
    view = tag_view({"type": "copter", "flavour": "ardupilot", "board": {"x": 1}, "sysid": 3},
                    {"type": "survey", "site": "north", "spare": True})
    assert view == {"type": "survey", "flavour": "ardupilot", "sysid": "3", "site": "north", "spare": "true"}
    views = {"V2": {"site": "north", "type": "quad"}, "V1": {"site": "north", "type": "quad"}, "V3": {"site": "south"}}
    assert select(views, {"site": "north", "type": "quad"}) == ["V1", "V2"]
    assert select(views, {"site": "east"}) == []


def test_waves_canary_then_percentages() -> None:
    assert parse_waves("10%,50%,100%") == (0.1, 0.5, 1.0)
    assert parse_waves("25%") == (0.25, 1.0)  # the whole set always ends it
    for bad in ("10", "50%,10%", "0%", "101%", "x%"):
        with pytest.raises(RolloutError):
            parse_waves(bad)
    assert plan_waves(200, canary=1, fractions=(0.1, 0.5, 1.0)) == (1, 20, 100, 200)
    assert plan_waves(3, canary=1, fractions=(0.1, 0.5, 1.0)) == (1, 2, 3)  # rounded up, empty waves dropped
    assert plan_waves(50, canary=0, fractions=(1.0,)) == (50,)
    assert plan_waves(5, canary=9, fractions=(1.0,)) == (5,)
    with pytest.raises(RolloutError):
        plan_waves(0, canary=1, fractions=(1.0,))


def test_threshold_count_or_share() -> None:
    assert parse_threshold("2", 200) == 2
    assert parse_threshold("5%", 200) == 10
    assert parse_threshold("1%", 50) == 0  # rounded down: 1% of 50 allows none
    for bad in ("-1", "x", "120%"):
        with pytest.raises(RolloutError):
            parse_threshold(bad, 10)


def test_change_parsing_and_merge() -> None:
    change = parse_change(["params.RTL_ALT=2000", "mode=", "rates.position=5"])
    assert change == {"params.RTL_ALT": 2000, "mode": None, "rates.position": 5}
    desired = {"mode": "GUIDED", "params": {"LAND_SPEED": 60}}
    assert apply_change(desired, change) == {"params": {"LAND_SPEED": 60, "RTL_ALT": 2000}, "rates": {"position": 5}}
    assert desired == {"mode": "GUIDED", "params": {"LAND_SPEED": 60}}  # not modified
    with pytest.raises(RolloutError):
        parse_change(["params.=3"])


def reported(rev: int, delta: dict[str, Any] | None = None, link: str = "up") -> dict[str, Any]:
    return {"desired_revision": rev, "delta": delta or {}, "link": link}


def test_field_progress_reads_the_gateways_delta() -> None:
    paths = ("params.RTL_ALT",)
    assert field_progress(None, 5, paths, reject_attempts=3)[0] is Progress.PENDING
    assert field_progress(reported(4), 5, paths, reject_attempts=3)[0] is Progress.PENDING  # older revision
    assert field_progress(reported(5), 5, paths, reject_attempts=3)[0] is Progress.CONVERGED
    assert field_progress(reported(6), 5, paths, reject_attempts=3)[0] is Progress.CONVERGED  # a later one
    other = {"params.LAND_SPEED": {"reason": "x", "attempts": 9}}  # a field the rollout did not change
    assert field_progress(reported(5, other), 5, paths, reject_attempts=3)[0] is Progress.CONVERGED
    trying = {"params.RTL_ALT": {"reason": "no PARAM_VALUE", "attempts": 1}}
    assert field_progress(reported(5, trying), 5, paths, reject_attempts=3) == (
        Progress.PENDING, "params.RTL_ALT: no PARAM_VALUE")
    refused = {"params.RTL_ALT": {"reason": "no PARAM_VALUE", "attempts": 3}}
    assert field_progress(reported(5, refused), 5, paths, reject_attempts=3)[0] is Progress.REJECTED
    assert field_progress(reported(5, {"params": {"reason": "r"}}), 5, paths, reject_attempts=3)[0] is Progress.PENDING
    assert field_progress(reported(5, {"$": {"reason": "not JSON"}}), 5, paths, reject_attempts=3)[0] is Progress.REJECTED


def rollout(n: int = 5, waves: tuple[int, ...] = (1, 3, 5), max_failures: int = 1) -> Rollout:
    return new_rollout(rollout_id="r1", env="test", change=CHANGE, targets=[f"V{i}" for i in range(1, n + 1)],
                       waves=waves, settings=Settings(disarm_timeout_s=10, converge_timeout_s=20, max_failures=max_failures),
                       now_s=0.0)


OK = Observation(armed=False, link_up=True)


def test_a_wave_starts_after_the_previous_converged() -> None:
    r = rollout()
    assert [v.wave for v in r.vehicles.values()] == [0, 1, 1, 2, 2]
    a = advance(r, {"V1": OK}, 1.0)
    assert a.write == ("V1",) and a.rollout.vehicles["V2"].step is Step.PENDING
    r = written(a.rollout, "V1", revision=7, previous_revision=3, now_s=1.0)
    a = advance(r, {"V1": Observation(armed=False, link_up=True, reported=reported(6))}, 2.0)
    assert not a.write and a.rollout.vehicles["V1"].step is Step.WRITTEN and a.rollout.wave == 0
    a = advance(a.rollout, {"V1": Observation(armed=False, link_up=True, reported=reported(7))}, 3.0)
    assert [v.vid for v in a.finished] == ["V1"] and a.waves_done == (0,)
    assert a.rollout.wave == 1 and a.rollout.vehicles["V2"].step is Step.WAITING  # the next wave started
    assert a.write == ()  # its vehicles were not observed yet: written on the next pass
    a = advance(a.rollout, {"V2": OK, "V3": OK}, 4.0)
    assert a.write == ("V2", "V3")


def test_armed_and_link_down_fail_at_the_disarm_deadline_and_the_threshold_halts() -> None:
    r = advance(rollout(), {"V1": OK}, 0.0).rollout
    r = written(r, "V1", revision=2, previous_revision=1, now_s=0.0)
    r = advance(r, {"V1": Observation(armed=False, link_up=True, reported=reported(2))}, 1.0).rollout
    armed = Observation(armed=True, link_up=True)
    down = Observation(armed=None, link_up=False)
    a = advance(r, {"V2": armed, "V3": down}, 2.0)
    assert a.write == () and a.rollout.status is RolloutStatus.RUNNING
    a = advance(a.rollout, {"V2": armed, "V3": down}, 10.5)  # waiting since 1.0 (its wave began): 9.5 s of 10
    assert not a.finished
    a = advance(a.rollout, {"V2": armed, "V3": down}, 12.5)
    assert {v.vid: v.failure for v in a.finished} == {"V2": Failure.ARMED, "V3": Failure.LINK}
    assert a.halted and a.rollout.status is RolloutStatus.HALTED and "2 failures exceed" in a.rollout.reason
    assert a.rollout.vehicles["V4"].step is Step.PENDING and a.rollout.wave == 1
    assert advance(a.rollout, {}, 13.0).rollout is a.rollout  # a halted rollout does nothing
    # resume with a higher threshold goes on to the last wave
    r2 = resume_halted(a.rollout, 2, 14.0)
    assert r2.status is RolloutStatus.RUNNING and r2.settings.max_failures == 2
    a = advance(r2, {"V4": OK, "V5": OK}, 15.0)
    assert a.rollout.wave == 2 and a.write == ("V4", "V5")  # the failed wave closed; the last one is written


def test_rejected_timeout_and_write_failures() -> None:
    r = rollout(n=3, waves=(3,), max_failures=5)
    r = advance(r, {v: OK for v in ("V1", "V2", "V3")}, 0.0).rollout
    r = written(r, "V1", revision=2, previous_revision=1, now_s=0.0)
    r = written(r, "V2", revision=2, previous_revision=1, now_s=0.0)
    r = write_failed(r, "V3", Failure.INVALID, "params.RTL_ALT: out of range", 0.0)
    refused = reported(2, {"params.RTL_ALT": {"reason": "no PARAM_VALUE", "attempts": 3}})
    slow = reported(1)
    a = advance(r, {"V1": Observation(armed=False, link_up=True, reported=refused),
                    "V2": Observation(armed=False, link_up=True, reported=slow)}, 5.0)
    assert a.rollout.vehicles["V1"].failure is Failure.REJECTED and a.rollout.vehicles["V2"].step is Step.WRITTEN
    a = advance(a.rollout, {"V2": Observation(armed=False, link_up=True, reported=slow)}, 21.0)
    assert a.rollout.vehicles["V2"].failure is Failure.TIMEOUT
    assert a.rollout.status is RolloutStatus.DONE and a.rollout.failures() == 3  # within max_failures 5
    assert [v.vid for v in to_roll_back(a.rollout)] == ["V1", "V2"]  # V3 was never written


def test_abort_skips_the_unwritten_and_the_document_round_trips() -> None:
    r = advance(rollout(), {"V1": OK}, 0.0).rollout
    r = written(r, "V1", revision=9, previous_revision=4, now_s=0.5)
    stopped = stop(r, RolloutStatus.ABORTED, "operator", 1.0)
    assert [v.step for v in stopped.vehicles.values()] == [Step.WRITTEN] + [Step.SKIPPED] * 4
    assert Rollout.from_json(stopped.to_json()) == stopped
    with pytest.raises(RolloutError):
        Rollout.from_json({"id": "x"})
