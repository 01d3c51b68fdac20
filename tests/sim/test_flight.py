"""Commands, modes and flight over real TCP, checked against what ArduCopter answers."""

from __future__ import annotations

import asyncio

import pytest
from pymavlink.dialects.v20 import ardupilotmega as M

from mavjet.sim import geo
from mavjet.sim.fleet import SimFleet
from tests.support import wait_for
from tests.support.sim import MavClient, airborne, ready, running

ARM = M.MAV_CMD_COMPONENT_ARM_DISARM
OK = M.MAV_RESULT_ACCEPTED
FAILED = M.MAV_RESULT_FAILED
GUIDED, AUTO, LOITER, RTL, LAND = 4, 3, 5, 6, 9


async def test_arming_refused_before_ekf_then_accepted() -> None:
    async with running(ekf_settle_s=30.0) as fleet:  # 3 s wall at 10x
        gcs = await MavClient.connect(fleet.endpoints[0])
        try:
            i = gcs.mark()
            ack = await gcs.command_long(1, ARM, 1)
            assert ack.result == FAILED
            text = await gcs.recv("STATUSTEXT", lambda m: m.text.startswith("Arm: "), since=i)
            assert text.severity == M.MAV_SEVERITY_CRITICAL
            assert not fleet.vehicles[0].armed
            await ready(fleet)
            assert (await gcs.command_long(1, ARM, 1)).result == OK
            hb = await gcs.recv("HEARTBEAT", lambda m: m.base_mode & M.MAV_MODE_FLAG_SAFETY_ARMED)
            assert hb.system_status == M.MAV_STATE_STANDBY  # ArduCopter: STANDBY until it leaves the ground
            # disarm on the ground is fine
            assert (await gcs.command_long(1, ARM, 0)).result == OK
            assert not fleet.vehicles[0].armed
        finally:
            await gcs.close()


async def test_forced_arm_skips_checks() -> None:
    async with running(ekf_settle_s=300.0, gps_fix_s=300.0) as fleet:
        gcs = await MavClient.connect(fleet.endpoints[0])
        try:
            await wait_for(lambda: fleet.vehicles[0].initialised, timeout_s=5, interval_s=0.02)  # past BOOT
            assert (await gcs.command_long(1, ARM, 1)).result == FAILED
            # Disarmed, ArduCopter accepts any mode (its arming checks guard the flight): the
            # guided recording shows GUIDED accepted at STANDBY before the EKF has a position.
            assert (await gcs.set_mode(1, GUIDED)).result == OK
            assert (await gcs.command_long(1, ARM, 1)).result == FAILED  # but arming there is refused
            assert (await gcs.command_long(1, ARM, 1, 21196)).result == OK
            assert fleet.vehicles[0].armed
        finally:
            await gcs.close()


async def test_arming_refused_in_rtl_and_land(fleet: SimFleet, gcs: MavClient) -> None:
    await ready(fleet)
    for mode in (RTL, LAND):
        assert (await gcs.set_mode(1, mode)).result == OK
        i = gcs.mark()
        assert (await gcs.command_long(1, ARM, 1)).result == FAILED
        await gcs.recv("STATUSTEXT", lambda m: "Mode not armable" in m.text, since=i)
    assert not fleet.vehicles[0].armed


async def test_takeoff_needs_armed_and_guided(fleet: SimFleet, gcs: MavClient) -> None:
    await ready(fleet)
    takeoff = M.MAV_CMD_NAV_TAKEOFF
    assert (await gcs.command_long(1, takeoff, 0, 0, 0, 0, 0, 0, 10)).result == FAILED  # disarmed
    assert (await gcs.command_long(1, ARM, 1)).result == OK  # in STABILIZE
    assert (await gcs.command_long(1, takeoff, 0, 0, 0, 0, 0, 0, 10)).result == FAILED  # STABILIZE has no user takeoff
    assert fleet.vehicles[0].alt_m == 0.0


async def test_takeoff_reaches_altitude_and_reports_landed_state(fleet: SimFleet, gcs: MavClient) -> None:
    v = fleet.vehicles[0]
    await gcs.command_long(1, M.MAV_CMD_SET_MESSAGE_INTERVAL, 245, 100_000)  # EXTENDED_SYS_STATE
    await gcs.command_long(1, M.MAV_CMD_SET_MESSAGE_INTERVAL, 33, 100_000)
    await gcs.recv("EXTENDED_SYS_STATE", lambda m: m.landed_state == M.MAV_LANDED_STATE_ON_GROUND)
    i = gcs.mark()
    await airborne(fleet, gcs, alt_m=12.0)
    seen = [m.landed_state for m in gcs.of("EXTENDED_SYS_STATE", i)]
    assert M.MAV_LANDED_STATE_TAKEOFF in seen
    await gcs.recv("EXTENDED_SYS_STATE", lambda m: m.landed_state == M.MAV_LANDED_STATE_IN_AIR)
    pos = await gcs.recv("GLOBAL_POSITION_INT")
    assert pos.relative_alt == pytest.approx(12_000, abs=200)
    assert pos.alt == pytest.approx(584_000 + 12_000, abs=200)
    assert v.alt_m == pytest.approx(12.0, abs=0.1)
    # disarming in the air is refused unless forced
    assert (await gcs.command_long(1, ARM, 0)).result == FAILED
    assert v.armed


async def test_mode_changes_by_command_and_set_mode_message(fleet: SimFleet, gcs: MavClient) -> None:
    v = fleet.vehicles[0]
    await ready(fleet)
    assert (await gcs.set_mode(1, GUIDED)).result == OK
    await gcs.recv("HEARTBEAT", lambda m: m.custom_mode == GUIDED)
    assert v.mode == "GUIDED"
    i = gcs.mark()
    gcs.send(M.MAVLink_set_mode_message(1, M.MAV_MODE_FLAG_CUSTOM_MODE_ENABLED, LOITER))
    ack = await gcs.recv("COMMAND_ACK", lambda m: m.command == M.MAVLINK_MSG_ID_SET_MODE, since=i)
    assert ack.result == OK and v.mode == "LOITER"
    # Disarmed, ArduCopter skips AUTO's mission check (ModeAuto::init with ignore_checks).
    assert (await gcs.set_mode(1, AUTO)).result == OK
    assert (await gcs.set_mode(1, LOITER)).result == OK
    assert (await gcs.set_mode(1, 42)).result == FAILED  # no such mode
    assert (await gcs.command_long(1, M.MAV_CMD_DO_SET_MODE, 0, GUIDED)).result == M.MAV_RESULT_UNSUPPORTED
    assert v.mode == "LOITER"


async def test_unknown_command_is_unsupported_and_other_targets_ignored(fleet: SimFleet, gcs: MavClient) -> None:
    ack = await gcs.command_long(1, 31337)
    assert ack.result == M.MAV_RESULT_UNSUPPORTED and ack.target_system == 255 and ack.target_component == 190
    i = gcs.mark()
    gcs.send(M.MAVLink_command_long_message(7, 1, ARM, 0, 1, 0, 0, 0, 0, 0, 0))  # another vehicle's command
    await asyncio.sleep(0.3)
    assert not gcs.of("COMMAND_ACK", i)


async def test_goto_flies_to_the_target(fleet: SimFleet, gcs: MavClient) -> None:
    v = fleet.vehicles[0]
    await airborne(fleet, gcs, alt_m=10.0)
    lat, lon = geo.offset(v.lat_deg, v.lon_deg, 60.0, -20.0)
    ack = await gcs.command_int(1, M.MAV_CMD_DO_REPOSITION, M.MAV_FRAME_GLOBAL_RELATIVE_ALT_INT, -1, 0, 0, 0, round(lat * 1e7), round(lon * 1e7), 25.0)
    assert ack.result == OK
    await wait_for(lambda: geo.distance_m(v.lat_deg, v.lon_deg, lat, lon) < 0.5 and abs(v.alt_m - 25.0) < 0.2, timeout_s=15, interval_s=0.02)
    assert v.mode == "GUIDED"
    # ~5 m/s: 63 m took at least 10 s of sim time
    assert 4.0 <= v.params["WPNAV_SPEED"] / 100 <= 6.0


async def test_reposition_outside_guided_needs_the_change_mode_flag(fleet: SimFleet, gcs: MavClient) -> None:
    v = fleet.vehicles[0]
    await airborne(fleet, gcs, alt_m=10.0)
    assert (await gcs.set_mode(1, LOITER)).result == OK
    lat, lon = geo.offset(v.lat_deg, v.lon_deg, 30.0, 0.0)
    x, y = round(lat * 1e7), round(lon * 1e7)
    frame = M.MAV_FRAME_GLOBAL_RELATIVE_ALT_INT
    ack = await gcs.command_int(1, M.MAV_CMD_DO_REPOSITION, frame, -1, 0, 0, 0, x, y, 10.0)
    assert ack.result == M.MAV_RESULT_DENIED  # as ArduPilot: not in GUIDED and no CHANGE_MODE flag
    ack = await gcs.command_int(1, M.MAV_CMD_DO_REPOSITION, frame, -1, M.MAV_DO_REPOSITION_FLAGS_CHANGE_MODE, 0, 0, x, y, 10.0)
    assert ack.result == OK and v.mode == "GUIDED"
    await wait_for(lambda: geo.distance_m(v.lat_deg, v.lon_deg, lat, lon) < 0.5, timeout_s=15, interval_s=0.02)


async def test_land_descends_and_disarms(fleet: SimFleet, gcs: MavClient) -> None:
    v = fleet.vehicles[0]
    await airborne(fleet, gcs, alt_m=8.0)
    assert (await gcs.command_long(1, M.MAV_CMD_NAV_LAND)).result == OK
    assert v.mode == "LAND"
    await wait_for(lambda: not v.armed, timeout_s=20, interval_s=0.02)
    assert v.alt_m == 0.0 and v.landed_state == M.MAV_LANDED_STATE_ON_GROUND


async def test_rtl_returns_home_and_lands(fleet: SimFleet, gcs: MavClient) -> None:
    v = fleet.vehicles[0]
    await airborne(fleet, gcs, alt_m=10.0)
    home = v.home
    assert home is not None
    lat, lon = geo.offset(home[0], home[1], 40.0, 40.0)
    assert v.goto(lat, lon, 10.0) == OK
    await wait_for(lambda: geo.distance_m(v.lat_deg, v.lon_deg, lat, lon) < 1.0, timeout_s=15, interval_s=0.02)
    assert (await gcs.command_long(1, M.MAV_CMD_NAV_RETURN_TO_LAUNCH)).result == OK
    await wait_for(lambda: v.alt_m > 14.0, timeout_s=10, interval_s=0.02)  # climbs to RTL_ALT (15 m) first
    await wait_for(lambda: not v.armed, timeout_s=40, interval_s=0.02)
    assert geo.distance_m(v.lat_deg, v.lon_deg, home[0], home[1]) < 1.0


async def test_low_battery_failsafe_rtl_then_lands_and_disarms(fleet: SimFleet, gcs: MavClient) -> None:
    v = fleet.vehicles[0]
    await airborne(fleet, gcs, alt_m=10.0)
    home = v.home
    assert home is not None
    lat, lon = geo.offset(home[0], home[1], 30.0, 0.0)
    v.goto(lat, lon, 10.0)
    await wait_for(lambda: geo.distance_m(v.lat_deg, v.lon_deg, home[0], home[1]) > 10.0, timeout_s=10, interval_s=0.02)
    i = gcs.mark()
    v.set_battery_pct(20.0)
    text = await gcs.recv("STATUSTEXT", lambda m: m.text.startswith("Battery failsafe"), since=i)
    assert text.severity == M.MAV_SEVERITY_CRITICAL
    hb = await gcs.recv("HEARTBEAT", lambda m: m.custom_mode == RTL, since=i)
    assert hb.system_status == M.MAV_STATE_CRITICAL
    assert v.mode_reason == "battery_failsafe"
    await wait_for(lambda: not v.armed, timeout_s=40, interval_s=0.02)
    assert geo.distance_m(v.lat_deg, v.lon_deg, home[0], home[1]) < 1.0
    # still failsafe: arming is refused until the battery is replaced
    assert (await gcs.set_mode(1, GUIDED)).result == OK
    assert (await gcs.command_long(1, ARM, 1)).result == FAILED
    v.set_battery_pct(100.0)
    assert (await gcs.command_long(1, ARM, 1)).result == OK


async def test_takeoff_can_answer_in_progress_first() -> None:
    async with running(in_progress_commands=frozenset({M.MAV_CMD_NAV_TAKEOFF})) as fleet:
        gcs = await MavClient.connect(fleet.endpoints[0])
        try:
            v = fleet.vehicles[0]
            await ready(fleet)
            await gcs.set_mode(1, GUIDED)
            await gcs.command_long(1, ARM, 1)
            i = gcs.mark()
            first = await gcs.command_long(1, M.MAV_CMD_NAV_TAKEOFF, 0, 0, 0, 0, 0, 0, 20, final=False)
            assert first.result == M.MAV_RESULT_IN_PROGRESS
            final = await gcs.recv("COMMAND_ACK", lambda a: a.command == M.MAV_CMD_NAV_TAKEOFF and a.result != M.MAV_RESULT_IN_PROGRESS, since=i, timeout_s=15)
            assert final.result == OK and v.alt_m == pytest.approx(20.0, abs=0.1)
        finally:
            await gcs.close()


async def test_forced_disarm_in_flight_falls(fleet: SimFleet, gcs: MavClient) -> None:
    v = fleet.vehicles[0]
    await airborne(fleet, gcs, alt_m=5.0)
    assert (await gcs.command_long(1, ARM, 0, 21196)).result == OK
    await wait_for(lambda: v.alt_m == 0.0, timeout_s=5, interval_s=0.02)
    assert not v.armed
