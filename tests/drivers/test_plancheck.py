"""Plan checks (drivers/mavlink/plancheck.py) on QGroundControl plans and Mission Planner `.waypoints` files."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from mavjet.drivers.mavlink.dialect import mavlink2
from mavjet.drivers.mavlink.plan import PlanError, parse_plan, plan_from_dict
from mavjet.drivers.mavlink.plancheck import (
    Check,
    PlanLimits,
    Severity,
    check_plan,
    distance_m,
    inside_polygon,
    refusals,
    warnings,
)
from mavjet.drivers.mavlink.waypoints import is_waypoints, parse_waypoints, waypoints_label

ROOT = Path(__file__).resolve().parents[2]
QGC_FULL = ROOT / "tests" / "sitl" / "qgc_full.plan"  # QGroundControl's own export (copter, fence, rally)
DEMO = ROOT / "sim" / "plans" / "demo.plan"
MP_FILE = Path(__file__).parent / "fixtures" / "mp_survey.waypoints"

TAKEOFF, WAYPOINT, LAND = 22, 16, 21
CHANGE_SPEED = mavlink2.MAV_CMD_DO_CHANGE_SPEED


def qgc() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(QGC_FULL.read_text())
    return doc


def items(doc: dict[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = doc["mission"]["items"]
    return out


def checks(doc: dict[str, Any], **kw: Any) -> list[tuple[Severity, Check, str]]:
    return [(f.severity, f.check, f.where) for f in check_plan(plan_from_dict(doc), **kw)]


@pytest.mark.parametrize("path", [QGC_FULL, DEMO], ids=["qgc_full", "demo"])
def test_a_good_qgroundcontrol_plan_has_no_findings(path: Path) -> None:
    assert check_plan(parse_plan(path.read_bytes())) == []


def test_a_copter_plan_without_takeoff_is_a_warning_naming_the_vehicles_own_words() -> None:
    doc = qgc()
    doc["mission"]["items"] = [it for it in items(doc) if it["command"] != TAKEOFF]
    found = check_plan(plan_from_dict(doc))
    assert [(f.severity, f.check) for f in found] == [(Severity.WARNING, Check.TAKEOFF)]
    assert "Missing Takeoff Cmd" in str(found[0]) and refusals(found) == []
    # A plane does not need one; the vehicle the gateway talks to beats the file's vehicleType.
    doc["mission"]["vehicleType"] = 1  # MAV_TYPE_FIXED_WING
    assert check_plan(plan_from_dict(doc)) == []
    assert [f.check for f in check_plan(plan_from_dict(doc), vehicle_class="copter")] == [Check.TAKEOFF]


def test_a_takeoff_that_is_not_the_first_navigation_item_is_named() -> None:
    doc = qgc()
    its = items(doc)
    its[0], its[2] = its[2], its[0]  # a waypoint first, the takeoff later
    assert checks(doc) == [(Severity.WARNING, Check.TAKEOFF, "mission.items[0]")]


def test_items_below_home_are_refused_in_every_altitude_frame() -> None:
    doc = qgc()
    items(doc)[2]["params"][6] = -5  # relative to home
    assert checks(doc) == [(Severity.REFUSAL, Check.BELOW_HOME, "mission.items[2]")]
    doc = qgc()
    items(doc)[2]["frame"] = 0  # AMSL: home is at 584 m
    items(doc)[2]["params"][6] = 570
    found = check_plan(plan_from_dict(doc))
    assert [(f.check, f.where) for f in found] == [(Check.BELOW_HOME, "mission.items[2]")]
    assert "-14.0 m is below home" in found[0].message
    items(doc)[2]["params"][6] = 600  # 16 m above home: fine
    assert check_plan(plan_from_dict(doc)) == []


def test_items_above_the_ceiling_are_refused_and_the_ceiling_is_configurable() -> None:
    doc = qgc()
    items(doc)[3]["params"][6] = 130
    assert check_plan(plan_from_dict(doc)) == []  # the default ceiling is the catalogue's 500 m
    found = check_plan(plan_from_dict(doc), PlanLimits(ceiling_m=120))
    assert [(f.severity, f.check, f.where) for f in found] == [(Severity.REFUSAL, Check.CEILING, "mission.items[3]")]
    assert "130.0 m above home is above the ceiling of 120 m" in found[0].message


def test_waypoints_outside_the_plans_own_geofence_are_refused() -> None:
    doc = qgc()
    items(doc)[4]["params"][4:6] = [-35.359, 149.16578]  # north of the inclusion polygon
    found = check_plan(plan_from_dict(doc))
    assert [(f.severity, f.check, f.where) for f in found] == [(Severity.REFUSAL, Check.GEOFENCE, "mission.items[4]")]
    assert "outside inclusion polygon geoFence.polygons[0]" in found[0].message
    doc = qgc()
    items(doc)[4]["params"][4:6] = [-35.36505, 149.16305]  # inside the exclusion circle (r 40 m)
    found = check_plan(plan_from_dict(doc))
    assert [f.check for f in found] == [Check.GEOFENCE]
    assert "inside exclusion circle geoFence.circles[0]" in found[0].message


def test_an_inclusion_circle_and_an_exclusion_polygon() -> None:
    doc = json.loads(DEMO.read_text())
    items(doc)[2]["params"][4:6] = [-35.3642, 149.1642]  # inside the demo's exclusion square
    assert checks(doc) == [(Severity.REFUSAL, Check.GEOFENCE, "mission.items[2]")]
    doc = json.loads(DEMO.read_text())
    items(doc)[2]["params"][4:6] = [-35.3600, 149.1657797]  # 315 m north of a 300 m inclusion circle
    assert checks(doc) == [(Severity.REFUSAL, Check.GEOFENCE, "mission.items[2]")]


def test_a_land_item_that_is_not_last_is_a_warning() -> None:
    doc = qgc()
    its = items(doc)
    land = next(i for i, it in enumerate(its) if it["command"] == LAND)
    its.append({**copy.deepcopy(its[2]), "doJumpId": 99})
    assert checks(doc) == [(Severity.WARNING, Check.LAND_NOT_LAST, f"mission.items[{land}]")]


@pytest.mark.parametrize(("speed", "refused"), [(6, False), (-1, False), (-2, False), (0, True), (-3, True), (45, True)])
def test_speed_items_out_of_range_are_refused(speed: float, refused: bool) -> None:
    doc = qgc()
    its = items(doc)
    k = next(i for i, it in enumerate(its) if it["command"] == CHANGE_SPEED)
    its[k]["params"][1] = speed
    expected = [(Severity.REFUSAL, Check.SPEED, f"mission.items[{k}]")] if refused else []
    assert checks(doc) == expected


def test_long_legs_are_warnings_from_home_and_between_waypoints() -> None:
    doc = qgc()
    doc["geoFence"] = {"version": 2, "polygons": [], "circles": []}
    items(doc)[4]["params"][4:6] = [-35.3455, 149.16578]  # ~1.97 km north of the previous waypoint
    found = check_plan(plan_from_dict(doc))
    # to it, and back from it: both legs are too long
    assert [(f.severity, f.check, f.where) for f in found] == [
        (Severity.WARNING, Check.DISTANCE, "mission.items[4]"),
        (Severity.WARNING, Check.DISTANCE, "mission.items[6]"),
    ]
    assert "from the previous waypoint (limit 900 m)" in found[0].message
    assert check_plan(plan_from_dict(doc), PlanLimits(max_leg_m=5000)) == []
    doc = qgc()
    doc["geoFence"] = {"version": 2, "polygons": [], "circles": []}
    items(doc)[0]["params"][4:6] = [-35.373261, 149.16523]  # the takeoff 1.1 km south of home
    assert checks(doc)[0] == (Severity.WARNING, Check.DISTANCE, "mission.items[0]")
    assert "from home" in str(check_plan(plan_from_dict(doc))[0])


def test_warnings_and_refusals_split() -> None:
    doc = qgc()
    doc["mission"]["items"] = [it for it in items(doc) if it["command"] != TAKEOFF]
    items(doc)[1]["params"][6] = -1
    found = check_plan(plan_from_dict(doc))
    assert [f.check for f in warnings(found)] == [Check.TAKEOFF]
    assert [f.check for f in refusals(found)] == [Check.BELOW_HOME]
    assert found[1].as_dict()["severity"] == "refusal"


def test_geometry() -> None:
    assert distance_m((0.0, 0.0), (1.0, 0.0)) == pytest.approx(111_195, rel=1e-3)
    square = [(0.0, 0.0), (0.0, 1.0), (1.0, 1.0), (1.0, 0.0)]
    assert inside_polygon((0.5, 0.5), square) and not inside_polygon((1.5, 0.5), square)
    assert not inside_polygon((0.5, -0.1), square)


# ---------------------------------------------------------------------------
# Mission Planner `.waypoints`


def test_a_mission_planner_file_reads_as_the_same_mission_as_its_plan() -> None:
    data = MP_FILE.read_bytes()
    assert is_waypoints(data) and not is_waypoints(QGC_FULL.read_bytes())
    doc, plan = parse_waypoints(data)
    assert plan.home == (-35.363261, 149.16523, 584.0)
    assert [it.command for it in plan.mission] == [16, 22, 178, 16, 19, 16, 177, 21]
    jump = plan.mission[6]
    assert (jump.param1, jump.param2) == (3.0, 2.0)  # DO_JUMP to index 3, twice: the target stays put
    # The stored .plan is a QGroundControl plan that parses to the same digest.
    assert parse_plan(json.dumps(doc)).mission_digest == plan.mission_digest
    # Same items as QGroundControl's plan up to the DO_JUMP.
    qgc_plan = parse_plan(QGC_FULL.read_bytes())
    assert [(i.command, i.x, i.y, i.z) for i in plan.mission[1:6]] == [
        (i.command, i.x, i.y, i.z) for i in qgc_plan.mission[1:6]
    ]
    assert check_plan(plan, label=waypoints_label) == []


def test_checks_on_a_mission_planner_file_name_its_lines() -> None:
    header, home, _takeoff, *rest = MP_FILE.read_text().splitlines()
    rows = [ln.split("\t") for ln in rest]  # without the takeoff: renumber from 1
    for k, cols in enumerate(rows, start=1):
        cols[0] = str(k)
        if cols[3] == "177":
            cols[4] = "2"  # the DO_JUMP's target moved up with it
    rows[1][10] = "-2.000000"  # index 2, a waypoint: 2 m below home
    _doc, plan = parse_waypoints("\n".join([header, home, *("\t".join(c) for c in rows)]) + "\n")
    found = check_plan(plan, label=waypoints_label)
    # No vehicle type in a .waypoints file: the takeoff warning says it assumes a copter.
    assert [(f.severity, f.check, f.where) for f in found] == [
        (Severity.WARNING, Check.TAKEOFF, ""),
        (Severity.REFUSAL, Check.BELOW_HOME, "line 4 (index 2)"),
    ]
    assert "does not say which vehicle" in found[0].message


@pytest.mark.parametrize(
    ("text", "where", "reason"),
    [
        ("", "line 1", "expected 'QGC WPL 110'"),
        ("QGC WPL 100\n", "line 1", "expected 'QGC WPL 110'"),
        ("QGC WPL 110\n", "line 2", "no items"),
        ("QGC WPL 110\n0\t1\t0\t16\t0\t0\t0\t0\t1\t2\t3\n", "line 2", "expected 12 columns"),
        ("QGC WPL 110\n1\t1\t0\t16\t0\t0\t0\t0\t1\t2\t3\t1\n", "line 2", "INDEX 1: expected 0"),
        ("QGC WPL 110\n0\t1\t0\t16\t0\t0\t0\t0\tx\t2\t3\t1\n", "line 2", "PARAM5: expected a number"),
        ("QGC WPL 110\n0\t1\t0\t16\t0\t0\t0\t0\t1\t2\t3\t1\n1\t0\t3\t16\t0\t0\t0\t0\t1\t2\tnan\t1\n",
         "line 3 (index 1)", "needs an altitude"),
        ("QGC WPL 110\n0\t1\t0\t16\t0\t0\t0\t0\t1\t2\t3\t1\n1\t0\t3\t16\t0\t0\t0\t0\t91\t2\t3\t1\n",
         "line 3 (index 1)", "latitude 91.0 outside"),
        ("QGC WPL 110\n0\t1\t0\t16\t0\t0\t0\t0\t1\t2\t3\t1\n1\t0\t3\t177\t9\t1\t0\t0\t0\t0\t0\t1\n",
         "line 3 (index 1)", "DO_JUMP to unknown"),
    ],
)
def test_broken_mission_planner_files_name_the_line(text: str, where: str, reason: str) -> None:
    with pytest.raises(PlanError) as info:
        parse_waypoints(text)
    assert info.value.path.startswith(where), info.value
    assert reason in info.value.reason


def test_spaces_and_a_byte_order_mark_are_accepted() -> None:
    text = "\ufeffQGC WPL 110\r\n0 1 0 16 0 0 0 0 -35.0 149.0 100 1\r\n1 0 3 22 0 0 0 0 0 0 10 1\r\n"
    assert is_waypoints(text.encode())
    _doc, plan = parse_waypoints(text)
    assert [it.command for it in plan.mission] == [16, 22]


def test_qgroundcontrols_older_coordinate_item_form_reads_and_checks() -> None:
    """QGroundControl's older item form ("coordinate": [lat, lon, alt] and four params), as in its own unit-test plans."""
    path = Path(__file__).parent / "fixtures" / "qgc_coordinate_items.plan"
    plan = parse_plan(path.read_bytes())
    assert [it.command for it in plan.mission] == [16, 22, 16, 205, 16, 20]
    wp = plan.mission[2]
    assert (wp.x, wp.y, wp.z, wp.frame) == (-353620100, 1491652300, 30.0, 3)
    assert plan.vehicle_type == 2 and check_plan(plan) == []
    doc = json.loads(path.read_text())
    items(doc)[3]["coordinate"][2] = -3  # a waypoint below home, in the older form
    items(doc)[0]["command"] = WAYPOINT  # and no takeoff
    assert checks(doc) == [
        (Severity.WARNING, Check.TAKEOFF, ""),
        (Severity.REFUSAL, Check.BELOW_HOME, "mission.items[3]"),
    ]
    items(doc)[1]["params"] = [0, 0, 0]  # neither form
    with pytest.raises(PlanError, match=r"mission.items\[1\].params: expected 7 params, got 3"):
        plan_from_dict(doc)
