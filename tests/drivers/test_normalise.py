"""Read-back normalisation, fed with items a real ArduCopter read back (fixtures/ardupilot_readback.json)."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from mavjet.drivers.mavlink.dialect import mavlink2
from mavjet.drivers.mavlink.mission import FENCE, MISSION, RALLY, MissionItem
from mavjet.drivers.mavlink.modes import Flavour
from mavjet.drivers.mavlink.normalise import check_item, differences, readback, same_item
from mavjet.drivers.mavlink.plan import digest
from mavjet.drivers.mavlink.transfers import MissionMismatch, compare_readback

FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "ardupilot_readback.json").read_text())


def _item(mission_type: int, seq: int, f: dict[str, Any]) -> MissionItem:
    def num(v: float | None) -> float:
        return math.nan if v is None else float(v)

    return MissionItem(
        seq=seq, frame=f["frame"], command=f["command"], current=f["current"], autocontinue=f["autocontinue"],
        param1=num(f["param1"]), param2=num(f["param2"]), param3=num(f["param3"]), param4=num(f["param4"]),
        x=f["x"], y=f["y"], z=num(f["z"]), mission_type=mission_type,
    )  # fmt: skip


ROWS = [
    (
        _item(r["mission_type"], r["seq"], r["sent"]),
        _item(r["mission_type"], r["seq"], r["read_back"]),
    )
    for r in FIXTURE["items"]
]


@pytest.mark.parametrize(
    ("sent", "back"), ROWS, ids=[f"type{s.mission_type}-seq{s.seq}-cmd{s.command}" for s, _ in ROWS]
)
def test_ardupilot_readback_predicts_the_real_vehicle(sent: MissionItem, back: MissionItem) -> None:
    predicted = readback(sent, Flavour.ARDUPILOT)
    assert predicted.canonical() == back.canonical()
    assert predicted.current == back.current == 0
    assert readback(predicted, Flavour.ARDUPILOT) == predicted  # idempotent
    assert same_item(sent, back, Flavour.ARDUPILOT)
    assert differences(sent, back) == []


def test_raw_fields_differ_but_normalised_forms_agree() -> None:
    sent = [s for s, _ in ROWS]
    back = [b for _, b in ROWS]
    assert any(s.canonical() != b.canonical() for s, b in zip(sent, back, strict=True))
    for mission_type in (MISSION, FENCE, RALLY):
        a = [s for s in sent if s.mission_type == mission_type and s.frame != 10]
        b = [x for x in back if x.mission_type == mission_type and x.frame != 10]
        assert digest(a) == digest(b)


def test_specific_rules() -> None:
    land = MissionItem(seq=1, frame=3, command=mavlink2.MAV_CMD_NAV_LAND, param4=math.nan, z=0.0)
    assert readback(land).param4 == 1.0
    assert (
        readback(MissionItem(seq=1, frame=3, command=mavlink2.MAV_CMD_NAV_LAND, param4=-5.0)).param4
        == -1.0
    )
    loiter = MissionItem(
        seq=1,
        frame=3,
        command=mavlink2.MAV_CMD_NAV_LOITER_TIME,
        param1=30.7,
        param3=-50.0,
        param4=2.0,
    )
    got = readback(loiter)
    assert (got.param1, got.param3, got.param4) == (30.0, -1.0, 1.0)
    rtl = MissionItem(
        seq=2, frame=3, command=mavlink2.MAV_CMD_NAV_RETURN_TO_LAUNCH, x=5, y=6, z=7.0
    )
    assert (readback(rtl).frame, readback(rtl).x, readback(rtl).z) == (0, 0, 0.0)
    wp = MissionItem(seq=1, frame=mavlink2.MAV_FRAME_GLOBAL_RELATIVE_ALT_INT, command=16, z=30.129)
    assert readback(wp).frame == mavlink2.MAV_FRAME_GLOBAL_RELATIVE_ALT
    assert readback(wp).z == pytest.approx(30.12)  # whole centimetres, truncated
    fence = MissionItem(
        seq=0, frame=0, command=5004, param1=25.0, autocontinue=1, mission_type=FENCE
    )
    assert readback(fence).autocontinue == 0 and readback(fence, Flavour.PX4).autocontinue == 0


def test_generic_flavour_keeps_params_but_zeroes_nan() -> None:
    loiter = MissionItem(
        seq=1, frame=6, command=mavlink2.MAV_CMD_NAV_LOITER_TIME, param3=50.0, param4=math.nan
    )
    got = readback(loiter, Flavour.PX4)
    assert (got.frame, got.param3, got.param4) == (3, 50.0, 0.0)


def test_mismatch_names_the_item_and_field() -> None:
    sent = [s for s, _ in ROWS if s.mission_type == MISSION and s.frame != 10]
    back = [b for _, b in ROWS if b.mission_type == MISSION and b.frame != 10]
    compare_readback(sent, back, MISSION, Flavour.ARDUPILOT)
    moved = [*back[:3], replace(back[3], z=735.0), *back[4:]]
    with pytest.raises(MissionMismatch) as err:
        compare_readback(sent, moved, MISSION, Flavour.ARDUPILOT)
    assert err.value.seq == 4 and "mission.items[3]" in str(err.value) and "z:" in str(err.value)


def test_refusals_predicted_with_the_vehicle_result() -> None:
    r = FIXTURE["refused"][0]
    item = _item(r["mission_type"], r["seq"], r["sent"])
    problem = check_item(item, Flavour.ARDUPILOT)
    assert (
        problem is not None
        and problem.result == r["mission_ack"] == mavlink2.MAV_MISSION_INVALID_PARAM7
    )
    assert "NAV_WAYPOINT in a global frame needs an altitude (param7 is null)" in problem.reason
    nan_speed = MissionItem(
        seq=3, frame=0, command=mavlink2.MAV_CMD_DO_CHANGE_SPEED, param2=math.nan
    )
    p = check_item(nan_speed, Flavour.ARDUPILOT)
    assert p is not None and p.result == mavlink2.MAV_MISSION_INVALID_PARAM2
    assert check_item(nan_speed, Flavour.PX4) is None
    for sent, _ in ROWS:
        assert check_item(sent, Flavour.ARDUPILOT) is None, sent


def _plan_with(item: dict[str, Any]) -> dict[str, Any]:
    wp = {"type": "SimpleItem", "command": 16, "frame": 3, "autoContinue": True,
          "params": [0, 0, 0, None, -35.36, 149.16, 30]}  # fmt: skip
    return {"fileType": "Plan", "mission": {"version": 2, "plannedHomePosition": [-35.36, 149.16, 584],
            "items": [wp, wp, wp, wp, wp, item]}}  # fmt: skip


def test_plan_refuses_a_global_item_without_altitude_naming_index_and_field() -> None:
    from mavjet.drivers.mavlink.plan import PlanError, plan_from_dict

    bad = {"type": "SimpleItem", "command": 16, "frame": 0, "params": [0, 0, 0, None, -35.36, 149.16, None]}
    with pytest.raises(PlanError) as err:
        plan_from_dict(_plan_with(bad))
    assert err.value.path == "mission.items[5]"
    assert str(err.value) == "plan mission.items[5]: NAV_WAYPOINT in a global frame needs an altitude (param7 is null)"
    # A terrain-frame item passes the plan check: the vehicle decides (the gateway's TERRAIN_CHECK, terrain.py).
    terrain = {"type": "SimpleItem", "command": 16, "frame": 10, "params": [0, 0, 0, 0, -35.36, 149.16, 30]}
    plan = plan_from_dict(_plan_with(terrain))
    assert plan.terrain_items == 1 and plan.mission[6].frame == 10


def test_vehicle_refusal_names_the_item() -> None:
    from mavjet.drivers.mavlink.mission import MissionRejected, MissionUpload

    items = tuple(MissionItem(seq=i, frame=3, command=16, z=10.0) for i in range(3))
    up = MissionUpload(target_system=1, target_component=1, items=items)
    up.start(0.0)

    class _Msg:
        def __init__(self, kind: str, **kw: Any) -> None:
            self._kind, self.__dict__ = kind, {**kw, "_kind": kind}

        def get_type(self) -> str:
            return self._kind

        def get_srcSystem(self) -> int:
            return 1

    up.on_message(_Msg("MISSION_REQUEST", seq=0, mission_type=0), 0.1)
    up.on_message(_Msg("MISSION_REQUEST", seq=1, mission_type=0), 0.2)
    up.on_message(_Msg("MISSION_ACK", type=12, mission_type=0), 0.3)
    assert isinstance(up.error, MissionRejected) and up.error.seq == 1
    assert "mission.items[0] (seq 1)" in str(up.error) and "invalid_param7" in str(up.error)
