"""PX4's read-back form (mavlink_mission.cpp: parse_/format_mavlink_mission_item)."""

from __future__ import annotations

import math
from dataclasses import replace

from mavjet.drivers.mavlink.dialect import mavlink2 as M
from mavjet.drivers.mavlink.mission import FENCE, RALLY, MissionItem
from mavjet.drivers.mavlink.modes import Flavour
from mavjet.drivers.mavlink.normalise import readback, same_item

PX4 = Flavour.PX4


def _item(command: int, p: tuple[float, float, float, float], *, frame: int = 6, mtype: int = 0) -> MissionItem:
    return MissionItem(seq=1, frame=frame, command=command, param1=p[0], param2=p[1], param3=p[2], param4=p[3],
                       x=-353632610, y=1491652300, z=30.0, mission_type=mtype)  # fmt: skip


def test_positional_items_keep_only_the_fields_px4_stores() -> None:
    wp = readback(_item(M.MAV_CMD_NAV_WAYPOINT, (2.0, 1.5, 7.0, math.nan)), PX4)
    assert (wp.frame, wp.param1, wp.param2, wp.param3, wp.param4) == (3, 2.0, 1.5, 0.0, 0.0)
    takeoff = readback(_item(M.MAV_CMD_NAV_TAKEOFF, (15.0, 0, 0, 90.0)), PX4)
    assert (takeoff.param1, takeoff.param4) == (0.0, 90.0)  # pitch not stored; yaw kept
    loiter = readback(_item(M.MAV_CMD_NAV_LOITER_TIME, (30.0, 1.0, 50.0, 1.0)), PX4)
    assert (loiter.param1, loiter.param2, loiter.param3, loiter.param4) == (30.0, 1.0, 50.0, 1.0)
    land = readback(_item(M.MAV_CMD_NAV_LAND, (5.0, 2.0, 0, -90.0)), PX4)
    assert (land.param1, land.param2, land.param4) == (0.0, 2.0, 270.0)  # yaw wrapped to [0, 360)


def test_yaw_round_trip_noise_and_wrapping_compare_equal() -> None:
    sent = _item(M.MAV_CMD_NAV_WAYPOINT, (0, 0, 0, -45.0))
    back = _item(M.MAV_CMD_NAV_WAYPOINT, (0, 0, 0, 315.0000305), frame=M.MAV_FRAME_GLOBAL_RELATIVE_ALT_INT)
    assert same_item(sent, back, PX4)


def test_mission_frame_items_keep_their_params() -> None:
    speed = readback(_item(M.MAV_CMD_DO_CHANGE_SPEED, (1.0, 8.0, -1.0, 0.0), frame=M.MAV_FRAME_MISSION), PX4)
    assert (speed.frame, speed.param1, speed.param2, speed.param3) == (2, 1.0, 8.0, -1.0)
    jump = readback(_item(M.MAV_CMD_DO_JUMP, (3.7, 2.2, 0, 0), frame=M.MAV_FRAME_MISSION), PX4)
    assert (jump.param1, jump.param2) == (3.0, 2.0)


def test_fence_points_lose_autocontinue_rally_points_keep_it() -> None:
    vertex = readback(_item(M.MAV_CMD_NAV_FENCE_POLYGON_VERTEX_INCLUSION, (3.6, 0, 0, 0), frame=0, mtype=FENCE), PX4)
    assert (vertex.autocontinue, vertex.param1) == (0, 4.0)  # vertex count rounded
    rally = readback(_item(M.MAV_CMD_NAV_RALLY_POINT, (1, 2, 3, 4), mtype=RALLY), PX4)
    assert (rally.autocontinue, rally.param1, rally.param4) == (1, 0.0, 0.0)


def test_readback_is_idempotent() -> None:
    for cmd in (M.MAV_CMD_NAV_WAYPOINT, M.MAV_CMD_NAV_LOITER_TIME, M.MAV_CMD_NAV_LAND, M.MAV_CMD_NAV_TAKEOFF):
        once = readback(_item(cmd, (2.5, 1.0, -50.0, 400.0)), PX4)
        assert readback(once, PX4) == once


def test_px4_missions_have_no_home_item_on_the_wire() -> None:
    """PX4 stores item `seq` at index `seq` and flies from 0: mavjet's home at seq 0 is not sent, and a
    download gets an empty home put back, so digests and verification keep one layout."""
    from mavjet.drivers.mavlink.mission import MISSION
    from mavjet.drivers.mavlink.plan import digest
    from mavjet.drivers.mavlink.transfers import compare_readback, from_vehicle, to_vehicle

    home = MissionItem(seq=0, frame=0, command=M.MAV_CMD_NAV_WAYPOINT, x=-353632610, y=1491652300, z=584.0)
    plan = [home, *(replace(_item(M.MAV_CMD_NAV_WAYPOINT, (0, 0, 0, 0), frame=3), seq=k) for k in (1, 2, 3))]
    wire = to_vehicle(plan, MISSION, PX4)
    assert [it.seq for it in wire] == [0, 1, 2] and wire[0] == replace(plan[1], seq=0)
    back = from_vehicle([readback(it, PX4) for it in wire], MISSION, PX4)
    assert [it.seq for it in back] == [0, 1, 2, 3] and (back[0].x, back[0].y) == (0, 0)
    compare_readback(plan, back, MISSION, PX4)  # does not raise
    assert digest(back) == digest(plan)
    # ArduPilot, and fence/rally lists on PX4, go as they are.
    for flavour, mtype in ((Flavour.ARDUPILOT, MISSION), (PX4, FENCE), (PX4, RALLY)):
        assert to_vehicle(plan, mtype, flavour) == plan and from_vehicle(plan, mtype, flavour) == plan
