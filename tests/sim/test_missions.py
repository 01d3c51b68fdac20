"""The mission protocol as ArduPilot speaks it, and AUTO flying the mission."""

from __future__ import annotations

import contextlib
from typing import Any

from pymavlink.dialects.v20 import ardupilotmega as M

from mavjet.sim import geo
from mavjet.sim.fleet import SimFleet
from tests.support import wait_for
from tests.support.sim import MavClient, ready, running

OK = M.MAV_RESULT_ACCEPTED
REL = M.MAV_FRAME_GLOBAL_RELATIVE_ALT_INT


def item(
    seq: int, cmd: int, lat: float = 0.0, lon: float = 0.0, alt: float = 0.0, *, p1: float = 0.0, p2: float = 0.0, frame: int = REL, mtype: int = 0
) -> Any:
    return M.MAVLink_mission_item_int_message(1, 1, seq, frame, cmd, 0, 1, p1, p2, 0, 0, round(lat * 1e7), round(lon * 1e7), alt, mtype)


def square_mission(v: Any, side_m: float = 30.0, alt: float = 12.0) -> list[Any]:
    home = item(0, M.MAV_CMD_NAV_WAYPOINT, v.lat_deg, v.lon_deg, 584.0, frame=M.MAV_FRAME_GLOBAL)
    pts = [geo.offset(v.lat_deg, v.lon_deg, n, e) for n, e in ((side_m, 0), (side_m, side_m), (0, side_m))]
    items = [home, item(1, M.MAV_CMD_NAV_TAKEOFF, alt=alt)]
    items += [item(2 + k, M.MAV_CMD_NAV_WAYPOINT, lat, lon, alt) for k, (lat, lon) in enumerate(pts)]
    items.append(item(5, M.MAV_CMD_DO_CHANGE_SPEED, p1=1, p2=8))  # a DO_ item right after a waypoint
    items.append(item(6, M.MAV_CMD_NAV_RETURN_TO_LAUNCH))
    return items


async def upload(gcs: MavClient, items: list[Any], mtype: int = 0) -> Any:
    """Answer the vehicle's requests until its MISSION_ACK."""
    i = gcs.mark()
    gcs.send(M.MAVLink_mission_count_message(1, 1, len(items), mtype))
    served: list[int] = []
    while True:
        msg = await _next_of(gcs, ("MISSION_REQUEST", "MISSION_REQUEST_INT", "MISSION_ACK"), i)
        i = gcs.messages.index(msg, i) + 1
        if msg.get_type() == "MISSION_ACK":
            return msg, served
        assert msg.mission_type == mtype
        served.append(msg.seq)
        gcs.send(items[msg.seq])


async def _next_of(gcs: MavClient, types: tuple[str, ...], since: int) -> Any:
    await wait_for(lambda: any(m.get_type() in types for m in gcs.messages[since:]), timeout_s=10, interval_s=0.02)
    return next(m for m in gcs.messages[since:] if m.get_type() in types)


async def download(gcs: MavClient, mtype: int = 0) -> list[Any]:
    i = gcs.mark()
    gcs.send(M.MAVLink_mission_request_list_message(1, 1, mtype))
    count = (await gcs.recv("MISSION_COUNT", since=i)).count
    out = []
    for seq in range(count):
        i = gcs.mark()
        gcs.send(M.MAVLink_mission_request_int_message(1, 1, seq, mtype))
        out.append(await gcs.recv("MISSION_ITEM_INT", lambda m, s=seq: m.seq == s, since=i))
    gcs.send(M.MAVLink_mission_ack_message(1, 1, M.MAV_MISSION_ACCEPTED, mtype))
    return out


def key(m: Any) -> tuple[Any, ...]:
    return (m.seq, m.frame, m.command, m.param1, m.x, m.y, m.z)


async def test_upload_download_roundtrip_with_home_at_seq0(fleet: SimFleet, gcs: MavClient) -> None:
    v = fleet.vehicles[0]
    await ready(fleet)
    items = square_mission(v)
    ack, served = await upload(gcs, items)
    assert ack.type == M.MAV_MISSION_ACCEPTED and served == list(range(len(items)))
    got = await download(gcs)
    # ArduPilot reads items back in its own form: a location in frame 6 comes back in frame 3,
    # a command without a location (DO_CHANGE_SPEED, RTL) in frame 0 (the test used to expect them verbatim).
    located = {M.MAV_CMD_NAV_TAKEOFF, M.MAV_CMD_NAV_WAYPOINT}
    want = [
        (m.seq, M.MAV_FRAME_GLOBAL_RELATIVE_ALT if m.command in located else 0, m.command, m.param1, m.x, m.y, m.z)
        for m in items[1:]
    ]
    assert [key(m) for m in got[1:]] == want
    assert v.home is not None
    assert (got[0].x, got[0].y) == (round(v.home[0] * 1e7), round(v.home[1] * 1e7))  # live home, not the upload
    assert len(v.mission) == len(items)
    # clear leaves only home
    i = gcs.mark()
    gcs.send(M.MAVLink_mission_clear_all_message(1, 1, 0))
    assert (await gcs.recv("MISSION_ACK", since=i)).type == M.MAV_MISSION_ACCEPTED
    assert len(await download(gcs)) == 1


async def test_lost_item_is_requested_again(fleet: SimFleet, gcs: MavClient) -> None:
    v = fleet.vehicles[0]
    items = square_mission(v)
    v.drop_next("MISSION_ITEM_INT", 1, incoming=True)  # the vehicle never hears the first item
    ack, served = await upload(gcs, items)
    assert ack.type == M.MAV_MISSION_ACCEPTED
    assert served[:2] == [0, 0]  # asked for seq 0 again after its 1 s (sim) retry timer
    assert v.missions.rerequests >= 1


async def test_abandoned_upload_is_cancelled_and_keeps_the_old_mission(fleet: SimFleet, gcs: MavClient) -> None:
    v = fleet.vehicles[0]
    items = square_mission(v)
    await upload(gcs, items)
    i = gcs.mark()
    gcs.send(M.MAVLink_mission_count_message(1, 1, 4, 0))
    ack = await gcs.recv("MISSION_ACK", since=i, timeout_s=5)  # 8 s of sim time without an item
    assert ack.type == M.MAV_MISSION_OPERATION_CANCELLED
    assert len(gcs.of("MISSION_REQUEST", i)) >= 3  # re-requested before giving up
    assert len(v.mission) == len(items)


async def test_auto_flies_the_mission_and_reports_reached_items(fleet: SimFleet, gcs: MavClient) -> None:
    v = fleet.vehicles[0]
    await ready(fleet)
    await upload(gcs, square_mission(v))
    assert (await gcs.set_mode(1, 4)).result == OK
    assert (await gcs.command_long(1, M.MAV_CMD_COMPONENT_ARM_DISARM, 1)).result == OK
    i = gcs.mark()
    assert (await gcs.command_long(1, M.MAV_CMD_MISSION_START)).result == OK
    assert v.mode == "AUTO"
    await wait_for(lambda: not v.armed, timeout_s=45, interval_s=0.02)  # the mission ends with RTL and landing
    # ArduPilot coalesces: waypoint 4 is followed at once by DO_CHANGE_SPEED 5, so only 5 is reported
    # (the test used to expect 4, as the documents describe).
    assert v.reached == [1, 2, 3, 5, 6]
    # The model disarms in the same step that sends the last MISSION_ITEM_REACHED,
    # so the frame may still be in flight to the GCS: wait for it, then compare.
    with contextlib.suppress(TimeoutError):
        await wait_for(lambda: len(gcs.of("MISSION_ITEM_REACHED", i)) >= len(v.reached), timeout_s=5, interval_s=0.02)
    reached = [m.seq for m in gcs.of("MISSION_ITEM_REACHED", i)]
    assert reached == [1, 2, 3, 5, 6]
    texts = [m.text for m in gcs.of("STATUSTEXT", i)]
    assert "Reached command #4" in texts  # the text still names every navigation item
    current = [m.seq for m in gcs.of("MISSION_CURRENT", i)]
    assert current and current == sorted(current)
    assert v.speed_m_s == 8.0  # DO_CHANGE_SPEED ran
    assert v.alt_m == 0.0
    assert v.home is not None and geo.distance_m(v.lat_deg, v.lon_deg, v.home[0], v.home[1]) < 1.0


async def test_auto_refused_on_ground_without_takeoff_item(fleet: SimFleet, gcs: MavClient) -> None:
    v = fleet.vehicles[0]
    await ready(fleet)
    items = [i for i in square_mission(v) if i.command != M.MAV_CMD_NAV_TAKEOFF]
    for k, it in enumerate(items):
        it.seq = k
    await upload(gcs, items)
    await gcs.set_mode(1, 4)
    await gcs.command_long(1, M.MAV_CMD_COMPONENT_ARM_DISARM, 1)
    i = gcs.mark()
    assert (await gcs.command_long(1, M.MAV_CMD_MISSION_START)).result == M.MAV_RESULT_FAILED
    await gcs.recv("STATUSTEXT", lambda m: "Missing Takeoff" in m.text, since=i)


async def test_fence_upload_and_polygon_breach_triggers_rtl() -> None:
    async with running() as fleet:
        gcs = await MavClient.connect(fleet.endpoints[0])
        try:
            v = fleet.vehicles[0]
            await ready(fleet)
            corners = [geo.offset(v.lat_deg, v.lon_deg, n, e) for n, e in ((-20, -20), (-20, 20), (20, 20), (20, -20))]
            fence = [
                item(k, M.MAV_CMD_NAV_FENCE_POLYGON_VERTEX_INCLUSION, lat, lon, p1=4, frame=M.MAV_FRAME_GLOBAL_INT, mtype=1)
                for k, (lat, lon) in enumerate(corners)
            ]
            ack, _ = await upload(gcs, fence, mtype=1)
            assert ack.type == M.MAV_MISSION_ACCEPTED and ack.mission_type == 1
            assert [key(m) for m in await download(gcs, 1)] == [key(m) for m in fence]
            gcs.send(M.MAVLink_param_set_message(1, 1, b"FENCE_ENABLE", 1, M.MAV_PARAM_TYPE_INT8))
            gcs.send(M.MAVLink_param_set_message(1, 1, b"FENCE_TYPE", 4, M.MAV_PARAM_TYPE_INT8))
            await wait_for(lambda: v.params["FENCE_TYPE"] == 4.0, timeout_s=10, interval_s=0.02)
            await gcs.set_mode(1, 4)
            await gcs.command_long(1, M.MAV_CMD_COMPONENT_ARM_DISARM, 1)
            await gcs.command_long(1, M.MAV_CMD_NAV_TAKEOFF, 0, 0, 0, 0, 0, 0, 10)
            await wait_for(lambda: v.takeoff_alt_m is None and v.alt_m > 9.9, timeout_s=10, interval_s=0.02)
            i = gcs.mark()
            lat, lon = geo.offset(v.lat_deg, v.lon_deg, 60, 0)
            v.goto(lat, lon, 10.0)
            status = await gcs.recv("FENCE_STATUS", lambda m: m.breach_status == 1, since=i, timeout_s=15)
            assert status.breach_type == M.FENCE_BREACH_BOUNDARY and status.breach_count == 1
            await wait_for(lambda: v.mode == "RTL", timeout_s=5, interval_s=0.02)
            await gcs.recv("FENCE_STATUS", lambda m: m.breach_status == 0, since=i, timeout_s=15)  # back inside
            await wait_for(lambda: not v.armed, timeout_s=40, interval_s=0.02)
        finally:
            await gcs.close()


async def test_legacy_mission_item_upload_is_accepted(fleet: SimFleet, gcs: MavClient) -> None:
    v = fleet.vehicles[0]
    i = gcs.mark()
    gcs.send(M.MAVLink_mission_count_message(1, 1, 2, 0))
    for seq in range(2):
        await gcs.recv("MISSION_REQUEST", lambda m, s=seq: m.seq == s, since=i)
        gcs.send(M.MAVLink_mission_item_message(1, 1, seq, 3, 16, 0, 1, 0, 0, 0, 0, v.lat_deg, v.lon_deg, 20.0, 0))
    assert (await gcs.recv("MISSION_ACK", since=i)).type == M.MAV_MISSION_ACCEPTED
    assert abs(v.mission[1].x - round(v.lat_deg * 1e7)) <= 50  # float32 degrees: why MISSION_ITEM_INT exists
