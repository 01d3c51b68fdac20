"""QGroundControl .plan parsing, conversion back, digest, and error reporting."""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from mavjet.drivers.mavlink.dialect import mavlink2
from mavjet.drivers.mavlink.mission import FENCE, MISSION, RALLY
from mavjet.drivers.mavlink.plan import PlanError, digest, parse_plan, plan_from_dict, plan_to_dict

DEMO = Path(__file__).resolve().parents[2] / "sim" / "plans" / "demo.plan"


def demo_doc() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(DEMO.read_text())
    return doc


def test_demo_plan_parses() -> None:
    plan = parse_plan(DEMO.read_text())
    home = plan.mission[0]
    assert home.seq == 0 and home.command == mavlink2.MAV_CMD_NAV_WAYPOINT
    assert (home.x, home.y, home.z) == (-353632621, 1491652374, 584.0)
    assert [i.seq for i in plan.mission] == list(range(len(plan.mission)))
    takeoff = plan.mission[1]
    assert takeoff.command == mavlink2.MAV_CMD_NAV_TAKEOFF and takeoff.z == 30.0
    assert takeoff.frame == mavlink2.MAV_FRAME_GLOBAL_RELATIVE_ALT
    speed = plan.mission[2]  # MAV_FRAME_MISSION: params 5/6 are raw, not degrees
    assert speed.command == mavlink2.MAV_CMD_DO_CHANGE_SPEED and (speed.x, speed.y) == (0, 0)
    assert plan.mission[-1].command == mavlink2.MAV_CMD_NAV_RETURN_TO_LAUNCH
    assert all(i.mission_type == MISSION for i in plan.mission)
    # one inclusion circle + a 4-vertex exclusion polygon
    assert [i.command for i in plan.fence].count(mavlink2.MAV_CMD_NAV_FENCE_POLYGON_VERTEX_EXCLUSION) == 4
    assert [i.command for i in plan.fence].count(mavlink2.MAV_CMD_NAV_FENCE_CIRCLE_INCLUSION) == 1
    assert all(i.mission_type == FENCE for i in plan.fence) and [i.seq for i in plan.fence] == list(range(5))
    assert len(plan.rally) == 1 and plan.rally[0].mission_type == RALLY
    assert plan.items_for(FENCE) == plan.fence


def test_round_trip_through_plan_dict_keeps_digests() -> None:
    plan = parse_plan(DEMO.read_text())
    back = plan_from_dict(plan_to_dict(plan.mission, plan.fence, plan.rally))
    assert digest(back.mission) == digest(plan.mission)
    assert digest(back.mission, include_home=True) == digest(plan.mission, include_home=True)
    assert digest(back.fence) == digest(plan.fence)
    assert digest(back.rally) == digest(plan.rally)


def test_digest_ignores_home_and_current_but_not_content() -> None:
    plan = parse_plan(DEMO.read_text())
    items = list(plan.mission)
    moved_home = [replace(items[0], x=0), *items[1:]]
    assert digest(moved_home) == digest(items)
    assert digest(moved_home, include_home=True) != digest(items, include_home=True)
    changed = [*items[:3], replace(items[3], z=41.0), *items[4:]]
    assert digest(changed) != digest(items)
    current = [*items[:3], replace(items[3], current=1), *items[4:]]
    assert digest(current) == digest(items)
    assert len(digest(items)) == 64


def test_do_jump_maps_jump_id_to_seq() -> None:
    doc = demo_doc()
    doc["mission"]["items"].insert(
        7, {"type": "SimpleItem", "command": 177, "frame": 2, "autoContinue": True, "doJumpId": 99, "params": [3, 2, 0, 0, 0, 0, 0]}
    )
    plan = plan_from_dict(doc)
    jump = next(i for i in plan.mission if i.command == mavlink2.MAV_CMD_DO_JUMP)
    assert jump.param1 == 3.0  # doJumpId 3 is the first waypoint, which is seq 3
    assert jump.param2 == 2.0
    doc["mission"]["items"][7]["params"][0] = 42
    with pytest.raises(PlanError, match="doJumpId 42"):
        plan_from_dict(doc)


def mutate(path: list[Any], value: Any) -> dict[str, Any]:
    doc = copy.deepcopy(demo_doc())
    target: Any = doc
    for key in path[:-1]:
        target = target[key]
    if value is KeyError:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return doc


@pytest.mark.parametrize(
    ("path", "value", "where"),
    [
        (["fileType"], "Mission", "fileType"),
        (["mission"], KeyError, "mission"),
        (["mission", "items", 0, "command"], KeyError, "mission.items[0].command"),
        (["mission", "items", 0, "params"], [0, 0, 0], "mission.items[0].params"),
        (["mission", "items", 2, "params", 4], 91.5, "mission.items[2].params"),
        (["mission", "items", 2, "params", 5], -181, "mission.items[2].params"),
        (["mission", "items", 2, "params", 6], "high", "mission.items[2].params[6]"),
        (["mission", "items", 1, "frame"], 99, "mission.items[1].frame"),
        (["mission", "items", 1, "autoContinue"], "yes", "mission.items[1].autoContinue"),
        (["mission", "items", 3, "type"], "ComplexItem", "mission.items[3].type"),
        (["mission", "plannedHomePosition"], [100, 0, 0], "mission.plannedHomePosition"),
        (["mission", "version"], 1, "mission.version"),
        (["geoFence", "polygons", 0, "polygon"], [[0, 0], [1, 1]], "geoFence.polygons[0].polygon"),
        (["geoFence", "circles", 0, "circle", "radius"], -5, "geoFence.circles[0].circle.radius"),
        (["rallyPoints", "points", 0], [0, 200, 10], "rallyPoints.points[0]"),
    ],
)
def test_bad_plans_name_the_field(path: list[Any], value: Any, where: str) -> None:
    with pytest.raises(PlanError) as err:
        plan_from_dict(mutate(path, value))
    assert err.value.path == where


def test_not_json() -> None:
    with pytest.raises(PlanError) as err:
        parse_plan("{not json")
    assert err.value.path == "$" and "not JSON" in err.value.reason
    with pytest.raises(PlanError):
        parse_plan("[]")
