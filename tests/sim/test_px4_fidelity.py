"""The PX4 flavour answers as PX4's source does (Commander.cpp, HEARTBEAT.hpp, mode_util/control_mode.cpp).

No PX4 recordings exist here: each expectation names the source that sets it (docs/sim.md, "Fidelity to PX4").
"""

from __future__ import annotations

import struct
from typing import Any

from mavjet.sim import params
from mavjet.sim.modes import px4_custom
from tests.support.sim import M, MavClient, ready, running
from tests.support.wait import wait_for

ARM = M.MAV_CMD_COMPONENT_ARM_DISARM
TEMP = M.MAV_RESULT_TEMPORARILY_REJECTED
CUSTOM = M.MAV_MODE_FLAG_CUSTOM_MODE_ENABLED


async def _heartbeat(gcs: MavClient, custom_mode: int) -> Any:
    return await gcs.recv("HEARTBEAT", lambda h: h.custom_mode == custom_mode, timeout_s=5)


async def test_heartbeat_flags_and_status_follow_px4() -> None:
    """HEARTBEAT.hpp: AUTO.* → AUTO|GUIDED|STABILIZE; manual modes → MANUAL_INPUT|STABILIZE; status from the
    arming state only: STANDBY disarmed, ACTIVE armed (on the ground too, unlike ArduCopter)."""
    async with running(flavour="px4") as fleet:
        v = fleet.vehicles[0]
        gcs = await MavClient.connect(fleet.endpoints[0])
        try:
            hb = await _heartbeat(gcs, px4_custom(4, 3))
            assert (hb.type, hb.autopilot) == (M.MAV_TYPE_QUADROTOR, M.MAV_AUTOPILOT_PX4)
            assert (hb.base_mode, hb.system_status) == (0x1D, M.MAV_STATE_STANDBY)
            await ready(fleet)
            assert (await gcs.set_mode(v.sysid, 3)).result == M.MAV_RESULT_ACCEPTED  # POSCTL
            hb = await _heartbeat(gcs, px4_custom(3))
            assert (hb.base_mode, hb.system_status) == (0x51, M.MAV_STATE_STANDBY)
            assert (await gcs.command_long(v.sysid, ARM, 1)).result == M.MAV_RESULT_ACCEPTED
            hb = await gcs.recv("HEARTBEAT", lambda h: h.base_mode & M.MAV_MODE_FLAG_SAFETY_ARMED, timeout_s=5)
            assert v.landed and (hb.base_mode, hb.system_status) == (0xD1, M.MAV_STATE_ACTIVE)
        finally:
            await gcs.close()


async def test_refused_transitions_are_temporarily_rejected() -> None:
    """Commander::handle_command: a denied arm, disarm or mode switch answers TEMPORARILY_REJECTED (not FAILED)."""
    async with running(flavour="px4", gps_fix_s=120.0) as fleet:
        v = fleet.vehicles[0]
        gcs = await MavClient.connect(fleet.endpoints[0])
        try:
            i = gcs.mark()
            assert (await gcs.command_long(v.sysid, ARM, 1)).result == TEMP and not v.armed
            text = await gcs.recv("STATUSTEXT", since=i)
            assert text.severity == M.MAV_SEVERITY_CRITICAL
            assert (await gcs.set_mode(v.sysid, 4, 4)).result == TEMP  # AUTO.MISSION without a position
            assert (await gcs.command_long(v.sysid, M.MAV_CMD_NAV_RETURN_TO_LAUNCH)).result == TEMP
            assert v.mode == "AUTO.LOITER"
        finally:
            await gcs.close()


async def test_disarm_in_the_air_is_refused_with_px4s_text() -> None:
    async with running(flavour="px4") as fleet:
        v = fleet.vehicles[0]
        gcs = await MavClient.connect(fleet.endpoints[0])
        try:
            await ready(fleet)
            assert (await gcs.command_long(v.sysid, ARM, 1)).result == M.MAV_RESULT_ACCEPTED
            assert v.home is not None  # PX4 takes param7 above mean sea level: home + 10 m
            ack = await gcs.command_long(v.sysid, M.MAV_CMD_NAV_TAKEOFF, 0, 0, 0, 0, 0, 0, v.home[2] + 10)
            assert ack.result == M.MAV_RESULT_ACCEPTED and v.mode == "AUTO.TAKEOFF"
            await wait_for(lambda: v.alt_m > 2.0, timeout_s=15, interval_s=0.02)
            i = gcs.mark()
            assert (await gcs.command_long(v.sysid, ARM, 0)).result == TEMP and v.armed
            text = await gcs.recv("STATUSTEXT", since=i)
            assert text.text == "Disarming denied: not landed"
            await wait_for(lambda: v.mode == "AUTO.LOITER", timeout_s=15, interval_s=0.02)  # takeoff done
        finally:
            await gcs.close()


async def test_do_set_mode_decodes_main_and_sub_mode_as_commander() -> None:
    """AUTO with sub 0 is AUTO.MISSION; an unknown AUTO sub mode is rejected ("Unsupported auto mode"); an
    unknown main mode, or a base mode without custom flag and without a mapped flag, changes nothing and is
    ACCEPTED; SET_MODE's packed custom_mode is unpacked; a reposition must ask for the mode switch."""
    async with running(flavour="px4") as fleet:
        v = fleet.vehicles[0]
        gcs = await MavClient.connect(fleet.endpoints[0])
        try:
            await ready(fleet)
            assert (await gcs.set_mode(v.sysid, 4, 0)).result == TEMP and v.mode == "AUTO.LOITER"  # no mission
            i = gcs.mark()
            assert (await gcs.set_mode(v.sysid, 4, 99)).result == TEMP
            assert (await gcs.recv("STATUSTEXT", since=i)).text == "Unsupported auto mode"
            assert (await gcs.set_mode(v.sysid, 42)).result == M.MAV_RESULT_ACCEPTED and v.mode == "AUTO.LOITER"
            ack = await gcs.command_long(v.sysid, M.MAV_CMD_DO_SET_MODE, 0, 0, 0)
            assert ack.result == M.MAV_RESULT_ACCEPTED and v.mode == "AUTO.LOITER"
            ack = await gcs.command_long(v.sysid, M.MAV_CMD_DO_SET_MODE, M.MAV_MODE_FLAG_MANUAL_INPUT_ENABLED
                                         | M.MAV_MODE_FLAG_GUIDED_ENABLED, 0, 0)  # fmt: skip
            assert ack.result == M.MAV_RESULT_ACCEPTED and v.mode == "POSCTL"
            gcs.send(M.MAVLink_set_mode_message(v.sysid, CUSTOM, px4_custom(4, 6)))
            await wait_for(lambda: v.mode == "AUTO.LAND", timeout_s=5, interval_s=0.02)
            ack = await gcs.command_long(v.sysid, M.MAV_CMD_DO_REPOSITION, -1, 0, 0, 0, v.lat_deg, v.lon_deg, 10)
            assert ack.result == M.MAV_RESULT_UNSUPPORTED and v.mode == "AUTO.LAND"
        finally:
            await gcs.close()


def _bytewise(v: int) -> float:
    return float(struct.unpack("<f", struct.pack("<i", v))[0])


async def test_param_values_are_bytewise_with_their_own_index() -> None:
    """MavlinkParametersManager::send_param: param_index is always the param's used index (never 65535, also for a
    read by name and after a set), types are INT32 or REAL32, and an INT32's bytes are copied into the float."""
    async with running(flavour="px4") as fleet:
        v = fleet.vehicles[0]
        gcs = await MavClient.connect(fleet.endpoints[0])
        try:
            gcs.send(M.MAVLink_param_request_read_message(v.sysid, 1, b"FENCE_ENABLE", -1))
            pv = await gcs.recv("PARAM_VALUE", lambda m: m.param_id == "FENCE_ENABLE")
            assert pv.param_type == M.MAV_PARAM_TYPE_INT32 and pv.param_index == params.INDEX["FENCE_ENABLE"]
            assert pv.param_value == _bytewise(0)
            gcs.send(M.MAVLink_param_set_message(v.sysid, 1, b"FENCE_ENABLE", _bytewise(1), M.MAV_PARAM_TYPE_INT32))
            pv = await gcs.recv("PARAM_VALUE", lambda m: m.param_id == "FENCE_ENABLE")
            assert pv.param_value == _bytewise(1) and pv.param_index == params.INDEX["FENCE_ENABLE"]
            assert v.params["FENCE_ENABLE"] == 1.0
            gcs.send(M.MAVLink_param_set_message(v.sysid, 1, b"FENCE_RADIUS", 150.0, M.MAV_PARAM_TYPE_REAL32))
            pv = await gcs.recv("PARAM_VALUE", lambda m: m.param_id == "FENCE_RADIUS")
            assert (pv.param_type, pv.param_value) == (M.MAV_PARAM_TYPE_REAL32, 150.0)
        finally:
            await gcs.close()
