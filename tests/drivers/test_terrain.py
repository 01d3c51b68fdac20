"""The gateway's terrain decision (drivers/mavlink/terrain.py): pure, with real MAVLink messages."""

from __future__ import annotations

from pymavlink.dialects.v20 import ardupilotmega as M

from mavjet.drivers.mavlink.mission import MissionItem
from mavjet.drivers.mavlink.terrain import (
    TerrainCheck,
    TerrainCheckConfig,
    TerrainReport,
    terrain_points,
    terrain_refusals,
)

A, B = (-353632611, 1491652300), (-353622611, 1491652300)


def report(point: tuple[int, int], spacing: int = 100, pending: int = 0, *, src: int = 1) -> object:
    msg = M.MAVLink_terrain_report_message(point[0], point[1], spacing, 584.0, 10.0, pending, 56)
    mav = M.MAVLink(None, srcSystem=src, srcComponent=1)
    return mav.decode(bytearray(msg.pack(mav)))


def wp(seq: int, point: tuple[int, int], frame: int = M.MAV_FRAME_GLOBAL_TERRAIN_ALT) -> MissionItem:
    return MissionItem(seq=seq, frame=frame, command=M.MAV_CMD_NAV_WAYPOINT, x=point[0], y=point[1], z=30.0)


def test_points_are_the_terrain_items_with_a_position_once_each() -> None:
    items = [wp(0, A, M.MAV_FRAME_GLOBAL), wp(1, A), wp(2, B, M.MAV_FRAME_GLOBAL_RELATIVE_ALT), wp(3, A),
             wp(4, (0, 0)), wp(5, B, M.MAV_FRAME_GLOBAL_TERRAIN_ALT_INT)]
    assert terrain_points(items) == [A, B]


def test_check_asks_each_point_and_stops_once_all_are_healthy() -> None:
    m = TerrainCheck(points=[A, B], target_system=1)
    out = m.start(0.0)
    assert [(o.get_type(), o.lat, o.lon) for o in out] == [("TERRAIN_CHECK", *A), ("TERRAIN_CHECK", *B)]
    m.on_message(report(A), 0.1)
    m.on_message(report(B, spacing=0, pending=56), 0.1)  # B's block is being read from disk
    assert not m.done
    again = m.on_tick(0.5)
    assert [(o.lat, o.lon) for o in again] == [B]  # only what is not healthy yet
    m.on_message(report(B, src=7), 0.6)  # another system's report does not count
    assert not m.done
    m.on_message(report(B), 0.6)
    assert m.done and m.reports[B].healthy


def test_check_gives_up_after_its_rounds() -> None:
    m = TerrainCheck(points=[A], target_system=1, config=TerrainCheckConfig(interval_s=0.5, rounds=3))
    sent = len(m.start(0.0))
    t = 0.0
    for _ in range(10):
        t += 0.5
        sent += len(m.on_tick(t))
        if m.done:
            break
    assert m.done and sent == 3 and m.reports == {}


def test_refusals_name_the_item_and_why() -> None:
    items = [wp(0, A, M.MAV_FRAME_GLOBAL), wp(1, A), wp(2, B), wp(3, (1, 2)), wp(4, B, M.MAV_FRAME_GLOBAL_RELATIVE_ALT)]
    reports = {
        A: TerrainReport.from_message(report(A)),
        B: TerrainReport.from_message(report(B, spacing=0, pending=504)),
        (1, 2): TerrainReport.from_message(report((1, 2), pending=3)),
    }
    assert terrain_refusals(items, reports) == [
        "mission.items[1]: NAV_WAYPOINT in a terrain frame (10): the vehicle has no terrain data there "
        "(TERRAIN_REPORT spacing 0, 504 blocks pending)",
        "mission.items[2]: NAV_WAYPOINT in a terrain frame (10): the vehicle is still loading terrain data "
        "(3 blocks pending)",
    ]
    assert terrain_refusals(items[:2], {}) == [
        "mission.items[0]: NAV_WAYPOINT in a terrain frame (10): the vehicle did not answer TERRAIN_CHECK "
        "(terrain disabled or unsupported)"
    ]
    assert terrain_refusals(items[:2], {A: reports[A]}) == []


def test_a_large_plan_is_asked_in_slices_and_every_point_its_rounds() -> None:
    points = [(k, k) for k in range(1, 101)]
    m = TerrainCheck(points=points, target_system=1,
                     config=TerrainCheckConfig(interval_s=0.5, rounds=2, max_checks_per_round=32))
    bursts = [len(m.start(0.0))]
    t = 0.0
    for _ in range(20):
        t += 0.5
        bursts.append(len(m.on_tick(t)))
        if m.done:
            break
    assert m.done and max(bursts) == 32  # never more than a slice at once
    assert sum(bursts) == 200 and set(m.asked.values()) == {2}  # yet each point asked its 2 rounds
