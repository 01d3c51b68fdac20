"""The sim's terrain behaves like ArduPilot's AP_Terrain (sim/terrain.py).

Facts from recording mission_roundtrip (section 5) and libraries/AP_Terrain:
no TERRAIN_REQUEST until the terrain stream is asked for; then at most one
request per 2 s, for the vehicle's own block first; TERRAIN_CHECK answered at
once; a terrain-frame item blocks arming until every cached block is filled.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from pymavlink.dialects.v20 import ardupilotmega as M

from mavjet.sim.fleet import SimFleet
from mavjet.sim.terrain import FULL_MASK, MAX_BLOCKS, TerrainServer, grid_of
from tests.sim.test_missions import item, upload
from tests.support.sim import MavClient, ready, running

ARM = M.MAV_CMD_COMPONENT_ARM_DISARM
GUIDED = 4
SET_INTERVAL = M.MAV_CMD_SET_MESSAGE_INTERVAL
HOME_E7 = (-353632611, 1491652300)  # the recording's home


def test_the_cache_is_bounded_oldest_block_out() -> None:
    # A stream of TERRAIN_CHECKs for distinct places (or a long flight) must not grow the sim without bound.
    t = TerrainServer()
    lat, lon = HOME_E7
    first = grid_of(lat, lon)
    for i in range(MAX_BLOCKS + 50):
        t.height(lat + i * 300_000, lon)  # 0.03 degrees apart: a new block each time
    assert len(t.blocks) == MAX_BLOCKS
    assert first not in t.blocks
    assert grid_of(lat + (MAX_BLOCKS + 49) * 300_000, lon) in t.blocks


def test_block_corner_is_the_one_a_real_arducopter_requested() -> None:
    # mission_roundtrip: home -35.3632611, 149.1652300 -> TERRAIN_REQUEST lat=-353747690 lon=1491548424.
    assert grid_of(*HOME_E7) == (-353747690, 1491548424)


def test_requests_are_two_seconds_apart_and_data_only_lands_in_a_cached_block() -> None:
    t = TerrainServer()
    t.tick(HOME_E7, HOME_E7)  # home and the 9 blocks around the vehicle enter the cache (disk read pending)
    assert t.stats() == (9 * 56, 0)
    assert t.request(HOME_E7, 0.0) is None  # still waiting for the disk
    t.tick(HOME_E7, HOME_E7)  # no terrain files: the blocks come back empty
    first = t.request(HOME_E7, 10.0)
    assert (first.lat, first.lon, first.grid_spacing, first.mask) == (-353747690, 1491548424, 100, FULL_MASK)
    assert t.request(HOME_E7, 11.9) is None
    assert t.request(HOME_E7, 12.0) is not None
    stray = SimpleNamespace(lat=1, lon=2, grid_spacing=100, gridbit=0, data=[0] * 16)
    t.on_data(stray)
    assert (1, 2) not in t.blocks
    for bit in range(56):
        t.on_data(SimpleNamespace(lat=first.lat, lon=first.lon, grid_spacing=100, gridbit=bit, data=[600] * 16))
    assert t.stats() == (8 * 56, 56)
    nxt = t.request(HOME_E7, 20.0)
    assert (nxt.lat, nxt.lon) != (first.lat, first.lon)  # the own block is full: on to the next one


def test_report_has_spacing_only_with_heights_here_and_at_home() -> None:
    t = TerrainServer(preloaded=True, ground_amsl_m=584.0)
    assert t.report(*HOME_E7, home=HOME_E7, rel_alt_m=0.0).spacing == 0  # first lookup: disk read pending
    t.tick(HOME_E7, HOME_E7)  # home's block read; the 8 around the vehicle enter the cache
    assert t.report(*HOME_E7, home=HOME_E7, rel_alt_m=10.0).pending == 8 * 56
    t.tick(HOME_E7, HOME_E7)
    r = t.report(*HOME_E7, home=HOME_E7, rel_alt_m=10.0)
    assert (r.spacing, r.pending, r.terrain_height, r.current_height) == (100, 0, 584.0, 10.0)
    assert t.report(*HOME_E7, home=None, rel_alt_m=0.0).spacing == 0


async def test_no_terrain_request_until_the_stream_is_asked_for(fleet: SimFleet, gcs: MavClient) -> None:
    await ready(fleet)
    v = fleet.vehicles[0]
    i = gcs.mark()
    home = item(0, M.MAV_CMD_NAV_WAYPOINT, v.lat_deg, v.lon_deg, 584.0, frame=M.MAV_FRAME_GLOBAL)
    wp = item(1, M.MAV_CMD_NAV_WAYPOINT, v.lat_deg + 1e-3, v.lon_deg, 30.0, frame=M.MAV_FRAME_GLOBAL_TERRAIN_ALT)
    assert (await upload(gcs, [home, wp]))[0].type == M.MAV_MISSION_ACCEPTED
    await gcs.recv("STATUSTEXT", lambda m: m.text == "PreArm: waiting for terrain data", since=i, timeout_s=3)
    assert not gcs.of("TERRAIN_REQUEST", i) and not gcs.of("TERRAIN_REPORT", i)
    # Streamed at 1 s of vehicle time (as in the recording): a report every second, a request every 2 s.
    j = gcs.mark()
    for msg_id in (133, 136):
        assert (await gcs.command_long(1, SET_INTERVAL, msg_id, 1e6)).result == M.MAV_RESULT_ACCEPTED
    req = await gcs.recv("TERRAIN_REQUEST", since=j, timeout_s=3)
    assert (req.lat, req.lon, req.mask) == (*_own_block(v), FULL_MASK)  # the vehicle's own block first
    await gcs.recv("TERRAIN_REPORT", lambda m: m.pending > 0 and m.spacing == 0, since=j, timeout_s=3)
    for _ in range(6):
        await gcs.recv("TERRAIN_REPORT", timeout_s=3)
    requests, reports = len(gcs.of("TERRAIN_REQUEST", j)), len(gcs.of("TERRAIN_REPORT", j))
    assert 1 <= requests <= reports // 2 + 1, (requests, reports)


def _own_block(v: object) -> tuple[int, int]:
    return grid_of(round(v.lat_deg * 1e7), round(v.lon_deg * 1e7))  # type: ignore[attr-defined]


async def test_terrain_item_blocks_arming_until_the_ground_station_serves_every_block(fleet: SimFleet, gcs: MavClient) -> None:
    await ready(fleet)
    v = fleet.vehicles[0]
    assert (await gcs.set_mode(1, GUIDED)).result == M.MAV_RESULT_ACCEPTED
    home = item(0, M.MAV_CMD_NAV_WAYPOINT, v.lat_deg, v.lon_deg, 584.0, frame=M.MAV_FRAME_GLOBAL)
    wp = item(1, M.MAV_CMD_NAV_WAYPOINT, v.lat_deg + 1e-3, v.lon_deg, 30.0, frame=M.MAV_FRAME_GLOBAL_TERRAIN_ALT)
    i = gcs.mark()
    assert (await upload(gcs, [home, wp]))[0].type == M.MAV_MISSION_ACCEPTED
    j = gcs.mark()
    assert (await gcs.command_long(1, ARM, 1)).result == M.MAV_RESULT_FAILED
    await gcs.recv("STATUSTEXT", lambda m: m.text == "Arm: waiting for terrain data", since=j)
    # A ground station that answers every TERRAIN_REQUEST (as MAVProxy's terrain module does).
    for msg_id in (133, 136):
        assert (await gcs.command_long(1, SET_INTERVAL, msg_id, 1e6)).result == M.MAV_RESULT_ACCEPTED
    served: set[tuple[int, int]] = set()
    for _ in range(60):
        k = gcs.mark()
        rep = await gcs.recv("TERRAIN_REPORT", since=k, timeout_s=3)
        if rep.pending == 0 and rep.spacing != 0 and v.terrain.points_done:
            break
        for req in gcs.of("TERRAIN_REQUEST", i):
            if (req.lat, req.lon) not in served:
                served.add((req.lat, req.lon))
                for bit in range(56):
                    gcs.send(M.MAVLink_terrain_data_message(req.lat, req.lon, req.grid_spacing, bit, [584] * 16))
    else:
        raise AssertionError(f"terrain never complete; served {len(served)} blocks")
    assert len(served) >= 9  # the vehicle's block and the 8 around it, then the mission's
    assert (await gcs.command_long(1, ARM, 1)).result == M.MAV_RESULT_ACCEPTED
    assert (await gcs.command_long(1, ARM, 0)).result == M.MAV_RESULT_ACCEPTED


async def test_terrain_check_is_answered_at_once_and_healthy_with_terrain_tiles() -> None:
    for tiles in (False, True):
        async with running(terrain_tiles=tiles) as fleet:
            gcs = await MavClient.connect(fleet.endpoints[0])
            try:
                await ready(fleet)
                v = fleet.vehicles[0]
                home = item(0, M.MAV_CMD_NAV_WAYPOINT, v.lat_deg, v.lon_deg, 584.0, frame=M.MAV_FRAME_GLOBAL)
                assert (await upload(gcs, [home]))[0].type == M.MAV_MISSION_ACCEPTED  # home set
                point = (round(v.lat_deg * 1e7) + 10_000, round(v.lon_deg * 1e7))
                last = None
                for _ in range(10):
                    k = gcs.mark()
                    gcs.send(M.MAVLink_terrain_check_message(*point))
                    last = await gcs.recv("TERRAIN_REPORT", lambda m, p=point: (m.lat, m.lon) == p, since=k, timeout_s=2)
                    if last.spacing != 0 and last.pending == 0:
                        break
                    await _sleep_sim(fleet, 1.5)
                assert last is not None
                if tiles:
                    assert (last.spacing, last.pending) == (100, 0) and abs(last.terrain_height - 584.0) < 1.0
                else:
                    assert last.spacing == 0 and last.pending > 0  # nobody serves the blocks it now waits for
            finally:
                await gcs.close()


async def test_terrain_disabled_refuses_arming_with_a_terrain_item(fleet: SimFleet, gcs: MavClient) -> None:
    await ready(fleet)
    v = fleet.vehicles[0]
    v.params["TERRAIN_ENABLE"] = 0.0
    assert (await gcs.set_mode(1, GUIDED)).result == M.MAV_RESULT_ACCEPTED
    home = item(0, M.MAV_CMD_NAV_WAYPOINT, v.lat_deg, v.lon_deg, 584.0, frame=M.MAV_FRAME_GLOBAL)
    wp = item(1, M.MAV_CMD_NAV_WAYPOINT, v.lat_deg + 1e-3, v.lon_deg, 30.0, frame=M.MAV_FRAME_GLOBAL_TERRAIN_ALT)
    assert (await upload(gcs, [home, wp]))[0].type == M.MAV_MISSION_ACCEPTED
    j = gcs.mark()
    assert (await gcs.command_long(1, ARM, 1)).result == M.MAV_RESULT_FAILED
    await gcs.recv("STATUSTEXT", lambda m: m.text == "Arm: terrain disabled", since=j)
    k = gcs.mark()
    gcs.send(M.MAVLink_terrain_check_message(wp.x, wp.y))
    rep = await gcs.recv("TERRAIN_REPORT", since=k)
    assert (rep.spacing, rep.pending, rep.loaded) == (0, 0, 0)


async def _sleep_sim(fleet: SimFleet, sim_s: float) -> None:
    await asyncio.sleep(sim_s / fleet.config.speedup)
