"""Telemetry over real TCP: nothing but HEARTBEAT until asked, then the requested rates."""

from __future__ import annotations

import asyncio
import time

import pytest
from pymavlink.dialects.v20 import ardupilotmega as M

from mavjet.sim.fleet import SimFleet
from tests.support.sim import MavClient, ready, running


async def test_heartbeat_only_until_streams_requested(fleet: SimFleet, gcs: MavClient) -> None:
    hb = await gcs.recv("HEARTBEAT", lambda m: m.system_status == M.MAV_STATE_STANDBY)  # after BOOT
    await asyncio.sleep(0.5)  # 5 s of sim time
    types = {m.get_type() for m in gcs.messages}
    # ArduPilot's unsolicited traffic on an idle link (recordings): no telemetry stream
    assert types <= {"HEARTBEAT", "STATUSTEXT", "HOME_POSITION", "GPS_GLOBAL_ORIGIN", "PARAM_VALUE", "TIMESYNC"}, types
    assert len(gcs.of("HEARTBEAT")) >= 3
    assert hb.type == M.MAV_TYPE_QUADROTOR
    assert hb.autopilot == M.MAV_AUTOPILOT_ARDUPILOTMEGA
    assert hb.custom_mode == 0  # STABILIZE
    assert hb.base_mode & M.MAV_MODE_FLAG_CUSTOM_MODE_ENABLED
    assert not hb.base_mode & M.MAV_MODE_FLAG_SAFETY_ARMED
    assert hb.system_status == M.MAV_STATE_STANDBY
    assert hb.get_srcSystem() == 1 and hb.get_srcComponent() == 1


async def _rate(gcs: MavClient, mtype: str, window_s: float) -> float:
    i = gcs.mark()
    t0 = time.monotonic()
    await asyncio.sleep(window_s)
    return len(gcs.of(mtype, i)) / (time.monotonic() - t0)


async def test_set_message_interval_rates_and_disable() -> None:
    # speedup 1 so sim rates are wall rates
    async with running(speedup=1.0) as fleet:
        gcs = await MavClient.connect(fleet.endpoints[0])
        try:
            ack = await gcs.command_long(1, M.MAV_CMD_SET_MESSAGE_INTERVAL, 33, 100_000)  # GLOBAL_POSITION_INT 10 Hz
            assert ack.result == M.MAV_RESULT_ACCEPTED
            ack = await gcs.command_long(1, M.MAV_CMD_SET_MESSAGE_INTERVAL, 1, 500_000)  # SYS_STATUS 2 Hz
            assert ack.result == M.MAV_RESULT_ACCEPTED
            await gcs.recv("SYS_STATUS")
            pos_hz = await _rate(gcs, "GLOBAL_POSITION_INT", 2.0)
            assert 7.0 <= pos_hz <= 13.0
            sys_hz = await _rate(gcs, "SYS_STATUS", 2.0)
            assert 1.0 <= sys_hz <= 3.5
            assert (await gcs.command_long(1, M.MAV_CMD_SET_MESSAGE_INTERVAL, 33, -1)).result == M.MAV_RESULT_ACCEPTED
            await asyncio.sleep(0.2)
            assert await _rate(gcs, "GLOBAL_POSITION_INT", 0.6) == 0.0
            # GET_MESSAGE_INTERVAL reports what is configured
            i = gcs.mark()
            await gcs.command_long(1, M.MAV_CMD_GET_MESSAGE_INTERVAL, 1)
            mi = await gcs.recv("MESSAGE_INTERVAL", since=i)
            assert (mi.message_id, mi.interval_us) == (1, 500_000)
            # a message the vehicle does not stream is refused
            assert (await gcs.command_long(1, M.MAV_CMD_SET_MESSAGE_INTERVAL, 9999, 100_000)).result == M.MAV_RESULT_FAILED
        finally:
            await gcs.close()


async def test_request_data_stream_groups() -> None:
    async with running(speedup=1.0) as fleet:
        gcs = await MavClient.connect(fleet.endpoints[0])
        try:
            gcs.send(M.MAVLink_request_data_stream_message(1, 1, M.MAV_DATA_STREAM_POSITION, 4, 1))
            gcs.send(M.MAVLink_request_data_stream_message(1, 1, M.MAV_DATA_STREAM_EXTRA1, 4, 1))
            gcs.send(M.MAVLink_request_data_stream_message(1, 1, M.MAV_DATA_STREAM_EXTENDED_STATUS, 2, 1))
            await gcs.recv("ATTITUDE")
            i = gcs.mark()
            t0 = time.monotonic()
            await asyncio.sleep(2.5)
            dt = time.monotonic() - t0
            counts = {t: len(gcs.of(t, i)) / dt for t in ("GLOBAL_POSITION_INT", "ATTITUDE", "GPS_RAW_INT", "SYS_STATUS", "EXTENDED_SYS_STATE", "VFR_HUD")}
            assert 2.5 <= counts["GLOBAL_POSITION_INT"] <= 5.5
            assert 2.5 <= counts["ATTITUDE"] <= 5.5
            assert 1.0 <= counts["GPS_RAW_INT"] <= 3.0
            assert 1.0 <= counts["SYS_STATUS"] <= 3.0
            assert 1.0 <= counts["EXTENDED_SYS_STATE"] <= 3.0
            assert counts["VFR_HUD"] == 0  # EXTRA2 was not requested
            gcs.send(M.MAVLink_request_data_stream_message(1, 1, M.MAV_DATA_STREAM_ALL, 0, 0))
            await asyncio.sleep(0.3)
            i = gcs.mark()
            await asyncio.sleep(1.2)
            unsolicited = {"HEARTBEAT", "STATUSTEXT", "TIMESYNC", "PARAM_VALUE", "GPS_GLOBAL_ORIGIN", "HOME_POSITION"}
            assert {m.get_type() for m in gcs.messages[i:]} <= unsolicited
        finally:
            await gcs.close()


async def test_time_sync_system_time_and_requested_messages(fleet: SimFleet, gcs: MavClient) -> None:
    await ready(fleet)
    assert (await gcs.command_long(1, M.MAV_CMD_SET_MESSAGE_INTERVAL, 2, 200_000)).result == M.MAV_RESULT_ACCEPTED
    st = await gcs.recv("SYSTEM_TIME", lambda m: m.time_unix_usec > 0)
    # UTC starts at the real time and runs at the speedup: within a minute of now here
    assert abs(st.time_unix_usec / 1e6 - time.time()) < 60
    assert st.time_boot_ms > 0
    i = gcs.mark()
    gcs.send(M.MAVLink_timesync_message(0, 123456789))
    ts = await gcs.recv("TIMESYNC", since=i)
    assert ts.ts1 == 123456789 and ts.tc1 > 0
    assert abs(ts.tc1 / 1e6 - st.time_boot_ms) < 60_000  # both are the boot clock
    i = gcs.mark()
    assert (await gcs.command_long(1, M.MAV_CMD_REQUEST_MESSAGE, M.MAVLINK_MSG_ID_AUTOPILOT_VERSION)).result == M.MAV_RESULT_ACCEPTED
    av = await gcs.recv("AUTOPILOT_VERSION", since=i)
    assert av.flight_sw_version >> 24 == 4 and av.uid != 0
    assert av.capabilities & M.MAV_PROTOCOL_CAPABILITY_MISSION_INT
    i = gcs.mark()
    assert (await gcs.command_long(1, M.MAV_CMD_REQUEST_MESSAGE, M.MAVLINK_MSG_ID_HOME_POSITION)).result == M.MAV_RESULT_ACCEPTED
    home = await gcs.recv("HOME_POSITION", since=i)
    v = fleet.vehicles[0]
    assert home.latitude == round(v.lat_deg * 1e7) and home.altitude == pytest.approx(584_000, abs=1)


async def test_gps_fix_and_sensors_in_telemetry(fleet: SimFleet, gcs: MavClient) -> None:
    gcs.send(M.MAVLink_request_data_stream_message(1, 1, M.MAV_DATA_STREAM_EXTENDED_STATUS, 5, 1))
    gps = await gcs.recv("GPS_RAW_INT", lambda m: m.fix_type >= 3, timeout_s=10)
    assert gps.satellites_visible > 0
    assert gps.lat == pytest.approx(-353632610, abs=2000)
    ess = await gcs.recv("EXTENDED_SYS_STATE")
    assert ess.landed_state == M.MAV_LANDED_STATE_ON_GROUND
    ss = await gcs.recv("SYS_STATUS", lambda m: m.onboard_control_sensors_health & M.MAV_SYS_STATUS_PREARM_CHECK)
    assert 15_000 < ss.voltage_battery < 17_000 and 90 <= ss.battery_remaining <= 100


async def test_multiple_clients_each_get_the_stream(fleet: SimFleet) -> None:
    a = await MavClient.connect(fleet.endpoints[0])
    b = await MavClient.connect(fleet.endpoints[0])
    try:
        await a.command_long(1, M.MAV_CMD_SET_MESSAGE_INTERVAL, 30, 100_000)
        await b.recv("ATTITUDE")
        await a.recv("ATTITUDE")
        # an answer to one goes to both (a serial-port autopilot cannot tell them apart)
        i = b.mark()
        await a.command_long(1, M.MAV_CMD_REQUEST_MESSAGE, M.MAVLINK_MSG_ID_AUTOPILOT_VERSION)
        await b.recv("AUTOPILOT_VERSION", since=i)
    finally:
        await a.close()
        await b.close()


async def test_several_vehicles_have_their_own_ports_and_sysids() -> None:
    async with running(vehicles=3) as fleet:
        assert len(set(fleet.endpoints)) == 3
        for k, ep in enumerate(fleet.endpoints):
            c = await MavClient.connect(ep)
            try:
                hb = await c.recv("HEARTBEAT")
                assert hb.get_srcSystem() == k + 1
            finally:
                await c.close()
        # they start apart on the ground
        v0, v1 = fleet.vehicles[0], fleet.vehicles[1]
        assert (v0.lat_deg, v0.lon_deg) != (v1.lat_deg, v1.lon_deg)


async def test_px4_flavour_heartbeat_encoding() -> None:
    async with running(flavour="px4") as fleet:
        gcs = await MavClient.connect(fleet.endpoints[0])
        try:
            hb = await gcs.recv("HEARTBEAT")
            assert hb.autopilot == M.MAV_AUTOPILOT_PX4
            assert hb.custom_mode == (4 << 16) | (3 << 24)  # AUTO.LOITER
            await ready(fleet)
            ack = await gcs.set_mode(1, 4, 4)  # AUTO.MISSION without a mission
            assert ack.result == M.MAV_RESULT_TEMPORARILY_REJECTED  # PX4's Commander for a denied switch
            ack = await gcs.set_mode(1, 3)  # POSCTL
            assert ack.result == M.MAV_RESULT_ACCEPTED
            hb = await gcs.recv("HEARTBEAT", lambda m: m.custom_mode == 3 << 16)
            assert fleet.vehicles[0].mode == "POSCTL"
        finally:
            await gcs.close()
