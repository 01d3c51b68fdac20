"""Terrain-frame items and MAV_SYSID, as on ArduCopter 4.7 (recording mission_roundtrip, section 5)."""

from __future__ import annotations

from pymavlink.dialects.v20 import ardupilotmega as M

from sim.fleet import SimFleet
from sim.terrain import FULL_MASK
from tests.sim.test_missions import item, upload
from tests.support.sim import MavClient, ready

ARM = M.MAV_CMD_COMPONENT_ARM_DISARM
GUIDED = 4


async def test_terrain_item_is_requested_and_blocks_arming_until_the_data_arrives(fleet: SimFleet, gcs: MavClient) -> None:
    await ready(fleet)
    v = fleet.vehicles[0]
    assert (await gcs.set_mode(1, GUIDED)).result == M.MAV_RESULT_ACCEPTED
    terrain_wp = item(1, M.MAV_CMD_NAV_WAYPOINT, v.lat_deg + 1e-3, v.lon_deg, 30.0, frame=M.MAV_FRAME_GLOBAL_TERRAIN_ALT)
    i = gcs.mark()
    home = item(0, M.MAV_CMD_NAV_WAYPOINT, v.lat_deg, v.lon_deg, 584.0, frame=M.MAV_FRAME_GLOBAL)
    assert (await upload(gcs, [home, terrain_wp]))[0].type == M.MAV_MISSION_ACCEPTED
    # The vehicle asks for the grid under the item (all 56 blocks) and says at once why it cannot arm.
    req = await gcs.recv("TERRAIN_REQUEST", since=i, timeout_s=3)
    assert req.grid_spacing == 100 and req.mask == FULL_MASK
    assert req.lat <= terrain_wp.x and req.lon <= terrain_wp.y
    await gcs.recv("STATUSTEXT", lambda m: m.text == "PreArm: waiting for terrain data", since=i, timeout_s=3)
    j = gcs.mark()
    assert (await gcs.command_long(1, ARM, 1)).result == M.MAV_RESULT_FAILED
    await gcs.recv("STATUSTEXT", lambda m: m.text == "Arm: waiting for terrain data", since=j)
    # Half the blocks: the next request asks only for the rest, and arming is still refused.
    for bit in range(28):
        gcs.send(M.MAVLink_terrain_data_message(req.lat, req.lon, req.grid_spacing, bit, [0] * 16))
    j = gcs.mark()
    rest = await gcs.recv("TERRAIN_REQUEST", since=j, timeout_s=3)
    assert rest.mask == FULL_MASK & ~((1 << 28) - 1)
    assert (await gcs.command_long(1, ARM, 1)).result == M.MAV_RESULT_FAILED
    for bit in range(28, 56):
        gcs.send(M.MAVLink_terrain_data_message(req.lat, req.lon, req.grid_spacing, bit, [0] * 16))
    j = gcs.mark()
    assert (await gcs.command_long(1, ARM, 1)).result == M.MAV_RESULT_ACCEPTED
    assert not [m for m in gcs.of("TERRAIN_REQUEST", j)]
    assert (await gcs.command_long(1, ARM, 0)).result == M.MAV_RESULT_ACCEPTED


async def test_mission_without_terrain_items_sends_no_request(fleet: SimFleet, gcs: MavClient) -> None:
    await ready(fleet)
    v = fleet.vehicles[0]
    home = item(0, M.MAV_CMD_NAV_WAYPOINT, v.lat_deg, v.lon_deg, 584.0, frame=M.MAV_FRAME_GLOBAL)
    i = gcs.mark()
    assert (await upload(gcs, [home, item(1, M.MAV_CMD_NAV_TAKEOFF, alt=10)]))[0].type == M.MAV_MISSION_ACCEPTED
    assert (await gcs.set_mode(1, GUIDED)).result == M.MAV_RESULT_ACCEPTED
    assert (await gcs.command_long(1, ARM, 1)).result == M.MAV_RESULT_ACCEPTED
    assert not gcs.of("TERRAIN_REQUEST", i)


async def test_system_id_is_mav_sysid_without_the_old_name(fleet: SimFleet, gcs: MavClient) -> None:
    i = gcs.mark()
    gcs.send(M.MAVLink_param_request_read_message(1, 1, b"MAV_SYSID", -1))
    pv = await gcs.recv("PARAM_VALUE", lambda m: m.param_id == "MAV_SYSID", since=i)
    assert pv.param_value == 1.0
    gcs.send(M.MAVLink_param_request_read_message(1, 1, b"SYSID_THISMAV", -1))
    gcs.send(M.MAVLink_param_request_read_message(1, 1, b"MAV_GCS_SYSID", -1))
    await gcs.recv("PARAM_VALUE", lambda m: m.param_id == "MAV_GCS_SYSID", since=i)
    assert not [m for m in gcs.of("PARAM_VALUE", i) if m.param_id == "SYSID_THISMAV"]  # unknown in 4.7: no answer
