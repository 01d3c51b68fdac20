"""The sim against a real ArduCopter: each test checks one behaviour with the values a real ArduCopter
V4.7.0-dev SITL sent in the recorded sessions (named in each test), so that gateway code written against
the sim meets the same wire as against the real autopilot. The checklist is in docs/sim.md ("Fidelity to
ArduCopter"); the read-back normalisation has its own tests in test_ardupilot_behaviour.py.
"""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path
from typing import Any

from pymavlink.dialects.v20 import ardupilotmega as M

from mavjet.sim.missions import SimMissionItem, ardupilot_form, ardupilot_refusal
from mavjet.sim.model import VehicleModel, VehicleOptions
from mavjet.sim.modes import ARDUPILOT
from tests.sim.test_missions import download, item, upload
from tests.support import wait_for
from tests.support.sim import MavClient, ready, running

ARM = M.MAV_CMD_COMPONENT_ARM_DISARM
GCS = (255, 190)
READBACK = Path(__file__).parents[1] / "drivers" / "fixtures" / "ardupilot_readback.json"


# ---------------------------------------------------------------- sans-IO helpers
def model(**kw: Any) -> VehicleModel:
    opts: dict[str, Any] = {"sysid": 1, "flavour": ARDUPILOT, "lat_deg": -35.363261, "lon_deg": 149.16523,
                            "ground_amsl_m": 584.0, **kw}  # fmt: skip
    return VehicleModel(VehicleOptions(**opts))


def decoded(v: VehicleModel) -> list[tuple[str, dict[str, Any]]]:
    """Everything the model said since the last call, as (message name, fields); clears `out`."""
    got: list[tuple[str, dict[str, Any]]] = []
    for m in v.out:
        if isinstance(m, tuple):
            cls = M.mavlink_map[m[0].msg_id]
            got.append((m[0].name, dict(zip(cls.fieldnames, m[1], strict=True))))
        else:
            got.append((m.get_type(), {f: getattr(m, f) for f in m.get_fieldnames()}))
    v.out.clear()
    return got


def heartbeats(got: list[tuple[str, dict[str, Any]]]) -> list[tuple[int, int, int]]:
    """(base_mode, custom_mode, system_status) of each HEARTBEAT."""
    return [(f["base_mode"], f["custom_mode"], f["system_status"]) for n, f in got if n == "HEARTBEAT"]


def command(v: VehicleModel, cmd: int, *params: float) -> list[tuple[str, dict[str, Any]]]:
    p = [*params, *([0.0] * (7 - len(params)))]
    v.out.clear()
    v.handle(M.MAVLink_command_long_message(1, 1, cmd, 0, *p), GCS, v.now, 0.0)
    return decoded(v)


def run_until(v: VehicleModel, t: float) -> list[tuple[str, dict[str, Any]]]:
    v.step(t)
    return decoded(v)


# ---------------------------------------------------------------- boot
def test_boot_window_heartbeats_and_ready_text() -> None:
    """boot_and_arm_refused / mode_and_flight: BOOT (1) with base_mode 0x59 in STABILIZE, then
    "ArduPilot Ready" and STANDBY (3) with 0x51 about 3 s of vehicle time after start."""
    v = model()
    got = run_until(v, 2.5)
    assert set(heartbeats(got)) == {(0x59, 0, M.MAV_STATE_BOOT)}
    got = run_until(v, 4.0)
    texts = [f["text"] for n, f in got if n == "STATUSTEXT"]
    assert "ArduPilot Ready" in texts
    assert heartbeats(got)[-1] == (0x51, 0, M.MAV_STATE_STANDBY)


def test_mode_set_during_boot_is_overridden_and_arm_refused_before_the_ack() -> None:
    v = model()
    v.step(0.5)
    assert [f["result"] for n, f in command(v, M.MAV_CMD_DO_SET_MODE, 1, 4) if n == "COMMAND_ACK"] == [0]
    got = command(v, ARM, 1)
    names = [n for n, _ in got]
    assert names.index("STATUSTEXT") < names.index("COMMAND_ACK")
    assert ("STATUSTEXT", "Arm: System not initialised", 2) in [(n, f.get("text"), f.get("severity")) for n, f in got]
    assert v.mode == "GUIDED"
    run_until(v, 4.0)
    assert v.mode == "STABILIZE" and v.initialised  # the boot mode wins when the vehicle becomes ready


# ---------------------------------------------------------------- heartbeat over a flight
def test_heartbeat_and_landed_state_over_arm_takeoff_rtl() -> None:
    """mode_and_flight: GUIDED 0x59 STANDBY -> armed 0xd9 still STANDBY -> ACTIVE once flying ->
    RTL 0xd9 ACTIVE -> after the landing's disarm 0x51, custom_mode still 6, STANDBY; vtol_state 3."""
    v = model(ekf_settle_s=2.0)
    v.schedule.set_interval(M.MAVLINK_MSG_ID_EXTENDED_SYS_STATE, 1e6, 0.0)
    run_until(v, 5.0)
    command(v, M.MAV_CMD_DO_SET_MODE, 1, 4)
    assert heartbeats(run_until(v, 6.0))[-1] == (0x59, 4, M.MAV_STATE_STANDBY)
    command(v, ARM, 1)
    assert heartbeats(run_until(v, 7.0))[-1] == (0xD9, 4, M.MAV_STATE_STANDBY)
    command(v, M.MAV_CMD_NAV_TAKEOFF, 0, 0, 0, 0, 0, 0, 10)
    got = run_until(v, 14.0)
    assert heartbeats(got)[-1] == (0xD9, 4, M.MAV_STATE_ACTIVE)
    states = [f["landed_state"] for n, f in got if n == "EXTENDED_SYS_STATE"]
    assert M.MAV_LANDED_STATE_TAKEOFF in states and states[-1] == M.MAV_LANDED_STATE_IN_AIR
    assert {f["vtol_state"] for n, f in got if n == "EXTENDED_SYS_STATE"} == {M.MAV_VTOL_STATE_MC}
    command(v, M.MAV_CMD_NAV_RETURN_TO_LAUNCH)
    got = run_until(v, 15.0)
    assert heartbeats(got)[-1] == (0xD9, 6, M.MAV_STATE_ACTIVE)
    for k in range(1, 120):  # bounded: RTL from 10 m lands within a minute of sim time
        got += run_until(v, 15.0 + k)
        if not v.armed:
            break
    assert not v.armed
    states = [f["landed_state"] for n, f in got if n == "EXTENDED_SYS_STATE"]
    assert M.MAV_LANDED_STATE_LANDING in states
    assert not [n for n, _ in got if n in ("MISSION_ITEM_REACHED", "MISSION_CURRENT")]  # none outside AUTO
    got = run_until(v, v.now + 1.5)
    assert heartbeats(got)[-1] == (0x51, 6, M.MAV_STATE_STANDBY)
    assert [f["landed_state"] for n, f in got if n == "EXTENDED_SYS_STATE"][-1] == M.MAV_LANDED_STATE_ON_GROUND


def test_land_keeps_the_guided_flag_after_its_disarm() -> None:
    """log_download: LAND (9) read 0xd9 in flight and 0x59 after landing and disarming."""
    v = model(ekf_settle_s=2.0)
    run_until(v, 5.0)
    command(v, M.MAV_CMD_DO_SET_MODE, 1, 4)
    command(v, ARM, 1)
    command(v, M.MAV_CMD_NAV_TAKEOFF, 0, 0, 0, 0, 0, 0, 3)
    run_until(v, 8.0)
    command(v, M.MAV_CMD_DO_SET_MODE, 1, 9)
    assert heartbeats(run_until(v, 9.0))[-1] == (0xD9, 9, M.MAV_STATE_ACTIVE)
    for k in range(1, 60):
        run_until(v, 9.0 + k)
        if not v.armed:
            break
    assert heartbeats(run_until(v, v.now + 1.5))[-1] == (0x59, 9, M.MAV_STATE_STANDBY)


# ---------------------------------------------------------------- arming
def test_guided_arm_before_the_ekf_has_a_position_names_it_after_the_ack() -> None:
    """boot_and_arm_refused_guided: COMMAND_ACK 4 (result_param2 0) then CRITICAL "Arm: Need Position Estimate"."""
    v = model(ekf_settle_s=1e6)
    run_until(v, 4.0)
    command(v, M.MAV_CMD_DO_SET_MODE, 1, 4)
    got = command(v, ARM, 1)
    assert [(n, f.get("result"), f.get("result_param2"), f.get("text"), f.get("severity")) for n, f in got] == [
        ("COMMAND_ACK", M.MAV_RESULT_FAILED, 0, None, None),
        ("STATUSTEXT", None, None, "Arm: Need Position Estimate", M.MAV_SEVERITY_CRITICAL),
    ]


def test_armed_on_the_ground_disarms_itself_after_disarm_delay() -> None:
    """README: an armed copter that does not take off disarms after DISARM_DELAY (default 10 s of vehicle time)."""
    v = model(ekf_settle_s=2.0)
    run_until(v, 5.0)
    assert v.params["DISARM_DELAY"] == 10.0
    command(v, M.MAV_CMD_DO_SET_MODE, 1, 4)
    command(v, ARM, 1)
    run_until(v, 14.5)
    assert v.armed
    got = run_until(v, 15.5)
    assert not v.armed
    assert "Disarming motors" in [f["text"] for n, f in got if n == "STATUSTEXT"]


def test_identity_and_accepted_message_intervals() -> None:
    """AUTOPILOT_VERSION flight_sw_version 0x04070000 (4.7.0, type dev); SET_MESSAGE_INTERVAL ACCEPTED for
    SYS_STATUS, GLOBAL_POSITION_INT, TERRAIN_REQUEST, TERRAIN_REPORT and EXTENDED_SYS_STATE (mission_roundtrip)."""
    v = model(boot_s=0.0)
    got = command(v, M.MAV_CMD_REQUEST_MESSAGE, M.MAVLINK_MSG_ID_AUTOPILOT_VERSION)
    assert [f["flight_sw_version"] for n, f in got if n == "AUTOPILOT_VERSION"] == [0x04070000]
    for msg_id in (1, 33, 133, 136, 245):
        acks = [f["result"] for n, f in command(v, M.MAV_CMD_SET_MESSAGE_INTERVAL, msg_id, 1e6) if n == "COMMAND_ACK"]
        assert acks == [M.MAV_RESULT_ACCEPTED], msg_id


# ---------------------------------------------------------------- unsolicited traffic
def test_timesync_requests_origin_and_home_on_an_idle_link() -> None:
    """All recordings: TIMESYNC tc1=0 every 10 s of vehicle time (ts1 = boot time in ns, e.g. 10001831001);
    GPS_GLOBAL_ORIGIN + HOME_POSITION when the EKF origin is set and again at each arming."""
    v = model(ekf_settle_s=12.0)
    got = run_until(v, 25.0)
    ts = [f for n, f in got if n == "TIMESYNC"]
    assert [f["tc1"] for f in ts] == [0, 0]
    assert [round(f["ts1"] / 1e9) for f in ts] == [10, 20]
    names = [n for n, _ in got]
    assert names.count("GPS_GLOBAL_ORIGIN") == 1 and names.index("GPS_GLOBAL_ORIGIN") < names.index("HOME_POSITION")
    command(v, M.MAV_CMD_DO_SET_MODE, 1, 4)
    names = [n for n, _ in command(v, ARM, 1)]
    assert "GPS_GLOBAL_ORIGIN" in names and "HOME_POSITION" in names


# ---------------------------------------------------------------- mission protocol
def _fixture_item(d: dict[str, Any], mission_type: int, seq: int) -> SimMissionItem:
    def f(v: float | None) -> float:
        return math.nan if v is None else float(v)

    return SimMissionItem(seq=seq, frame=d["frame"], command=d["command"], current=d["current"], autocontinue=d["autocontinue"],
                          param1=f(d["param1"]), param2=f(d["param2"]), param3=f(d["param3"]), param4=f(d["param4"]),
                          x=d["x"], y=d["y"], z=f(d["z"]), mission_type=mission_type)  # fmt: skip


def test_every_recorded_item_reads_back_as_arducopter_returned_it() -> None:
    """mission_roundtrip: all 18 items sent (mission, fence, rally, terrain frame) against their read-back."""
    fixture = json.loads(READBACK.read_text())
    for rec in fixture["items"]:
        sent = _fixture_item(rec["sent"], rec["mission_type"], rec["seq"])
        assert ardupilot_refusal(sent) is None, rec
        want = _fixture_item(rec["read_back"], rec["mission_type"], rec["seq"])
        assert ardupilot_form(sent) == want, rec
    for rec in fixture["refused"]:
        assert ardupilot_refusal(_fixture_item(rec["sent"], rec["mission_type"], rec["seq"])) == rec["mission_ack"]


async def test_uploads_are_requested_with_mission_request_and_announce_their_totals() -> None:
    """mission_roundtrip: MISSION_REQUEST (40) for every item, never _INT; "Flight plan received" after the
    mission's ACK; MIS_TOTAL broadcast while it grows; fence: "Fence Indexed OK" (severity 7) and
    FENCE_TOTAL 7 for a 4-vertex polygon and a circle; rally: RALLY_TOTAL 1 (all PARAM_VALUE index 65535).
    Before the vehicle has a home, seq 0 reads back as 0/0/0."""
    async with running(ekf_settle_s=1e6) as fleet:
        gcs = await MavClient.connect(fleet.endpoints[0])
        try:
            await wait_for(lambda: fleet.vehicles[0].initialised, timeout_s=5, interval_s=0.02)
            lat, lon = -35.3632610, 149.1652300
            items = [item(0, M.MAV_CMD_NAV_WAYPOINT, lat, lon, 584.0, frame=0)]
            items += [item(k, M.MAV_CMD_NAV_WAYPOINT, lat + k * 1e-4, lon, 30.0) for k in range(1, 4)]
            i = gcs.mark()
            ack, served = await upload(gcs, items)
            assert ack.type == M.MAV_MISSION_ACCEPTED and served == [0, 1, 2, 3]
            assert len(gcs.of("MISSION_REQUEST", i)) == 4 and not gcs.of("MISSION_REQUEST_INT", i)
            await gcs.recv("STATUSTEXT", lambda m: m.text == "Flight plan received", since=i)
            totals = [m for m in gcs.of("PARAM_VALUE", i) if m.param_id == "MIS_TOTAL"]
            assert totals and totals[-1].param_value == 4
            assert {(m.param_type, m.param_index) for m in totals} == {(M.MAV_PARAM_TYPE_INT16, 65535)}
            home = (await download(gcs))[0]
            assert (home.x, home.y, home.z, home.current) == (0, 0, 0.0, 0)

            fence = [item(k, M.MAV_CMD_NAV_FENCE_POLYGON_VERTEX_INCLUSION, lat + 2e-4 * (k in (0, 1)) - 2e-4 * (k in (2, 3)),
                          lon + 2e-4 * (k in (1, 2)) - 2e-4 * (k in (0, 3)), p1=4, frame=0, mtype=1) for k in range(4)]
            fence.append(item(4, M.MAV_CMD_NAV_FENCE_CIRCLE_EXCLUSION, lat + 1e-4, lon, p1=25, frame=0, mtype=1))  # fmt: skip
            i = gcs.mark()
            assert (await upload(gcs, fence, 1))[0].type == M.MAV_MISSION_ACCEPTED
            text = await gcs.recv("STATUSTEXT", lambda m: m.text == "Fence Indexed OK", since=i)
            assert text.severity == M.MAV_SEVERITY_DEBUG
            pv = await gcs.recv("PARAM_VALUE", lambda m: m.param_id == "FENCE_TOTAL", since=i)
            assert (pv.param_value, pv.param_type, pv.param_index) == (7, M.MAV_PARAM_TYPE_INT8, 65535)

            i = gcs.mark()
            rally = [item(0, M.MAV_CMD_NAV_RALLY_POINT, lat - 5e-4, lon, 30.0, mtype=2)]
            assert (await upload(gcs, rally, 2))[0].type == M.MAV_MISSION_ACCEPTED
            pv = await gcs.recv("PARAM_VALUE", lambda m: m.param_id == "RALLY_TOTAL", since=i)
            assert (pv.param_value, pv.param_index) == (1, 65535)
        finally:
            await gcs.close()


# ---------------------------------------------------------------- parameters and links
async def test_param_reads_sets_and_broadcasts_as_arducopter() -> None:
    """param_set_and_unsolicited: reads by name answer index 65535 with MAV_SYSID 1 (INT16), FENCE_ENABLE 0
    (INT8), RTL_ALT 1500 (INT32); a set from SERIAL1 reaches SERIAL0 too; +inf: no reply, value kept;
    FLT_MAX on an INT8: 127."""
    async with running() as fleet:
        a = await MavClient.connect(fleet.endpoints[0])
        b = await MavClient.connect(fleet.endpoints[0], compid=191)
        try:
            got = {}
            for name in ("MAV_SYSID", "FENCE_ENABLE", "RTL_ALT"):
                i = a.mark()
                a.send(M.MAVLink_param_request_read_message(1, 1, name.encode(), -1))
                pv = await a.recv("PARAM_VALUE", lambda m, n=name: m.param_id == n, since=i)
                got[name] = (pv.param_value, pv.param_type, pv.param_index)
            assert got == {"MAV_SYSID": (1, M.MAV_PARAM_TYPE_INT16, 65535), "FENCE_ENABLE": (0, M.MAV_PARAM_TYPE_INT8, 65535),
                           "RTL_ALT": (1500, M.MAV_PARAM_TYPE_INT32, 65535)}  # fmt: skip
            i = a.mark()
            b.send(M.MAVLink_param_set_message(1, 1, b"RTL_ALT", 3000.0, M.MAV_PARAM_TYPE_INT32))
            pv = await a.recv("PARAM_VALUE", lambda m: m.param_id == "RTL_ALT", since=i)  # the other link hears it
            assert (pv.param_value, pv.param_index) == (3000, 65535)
            i = a.mark()
            a.send(M.MAVLink_param_set_message(1, 1, b"FENCE_ENABLE", math.inf, M.MAV_PARAM_TYPE_INT8))
            await asyncio.sleep(0.3)  # 3 s of vehicle time, as long as the recording waited
            assert not [m for m in a.of("PARAM_VALUE", i) if m.param_id == "FENCE_ENABLE"]
            assert fleet.vehicles[0].params["FENCE_ENABLE"] == 0
            a.send(M.MAVLink_param_set_message(1, 1, b"FENCE_ENABLE", 3.4028235e38, M.MAV_PARAM_TYPE_INT8))
            pv = await a.recv("PARAM_VALUE", lambda m: m.param_id == "FENCE_ENABLE", since=i)
            assert pv.param_value == 127
        finally:
            await a.close()
            await b.close()


async def test_a_ground_stations_heartbeat_is_forwarded_to_the_other_links_byte_for_byte() -> None:
    """param_set_and_unsolicited / signing: each GCS's HEARTBEATs reach the other link unchanged (sysid 255,
    the other compid, same seq); nothing else of theirs is forwarded."""
    async with running() as fleet:
        a = await MavClient.connect(fleet.endpoints[0])
        b = await MavClient.connect(fleet.endpoints[0], compid=191)
        try:
            await a.recv("HEARTBEAT")
            hb = M.MAVLink_heartbeat_message(M.MAV_TYPE_GCS, M.MAV_AUTOPILOT_INVALID, 0, 0, 0, 3)
            b.mav.seq = 42
            b.send(hb)
            got = await a.recv("HEARTBEAT", lambda m: m.get_srcSystem() == 255)
            assert (got.get_srcComponent(), got.get_seq(), got.type) == (191, 42, M.MAV_TYPE_GCS)
            assert bytes(got.get_msgbuf()) == bytes(hb.get_msgbuf())
            i = a.mark()
            b.send(M.MAVLink_param_request_read_message(1, 1, b"RTL_ALT", -1))
            await b.recv("PARAM_VALUE", lambda m: m.param_id == "RTL_ALT")
            assert not [m for m in a.messages[i:] if m.get_srcSystem() == 255]
            assert not [m for m in b.messages if m.get_srcComponent() == 191]  # never echoed to its sender
        finally:
            await a.close()
            await b.close()


async def test_ready_vehicle_over_tcp_reports_standby_after_boot() -> None:
    """The boot window over a real socket at SITL's speedup 5: BOOT first, STANDBY from ~3 s of vehicle time."""
    async with running(speedup=5.0) as fleet:
        gcs = await MavClient.connect(fleet.endpoints[0])
        try:
            first = await gcs.recv("HEARTBEAT", timeout_s=3)
            assert (first.system_status, first.base_mode) == (M.MAV_STATE_BOOT, 0x59)
            await gcs.recv("STATUSTEXT", lambda m: m.text == "ArduPilot Ready", timeout_s=3)
            hb = await gcs.recv("HEARTBEAT", timeout_s=3)
            assert (hb.system_status, hb.base_mode, hb.custom_mode) == (M.MAV_STATE_STANDBY, 0x51, 0)
            await ready(fleet)
        finally:
            await gcs.close()


async def test_forwarded_heartbeats_keep_their_own_signing_state() -> None:
    """signing / signing.serial1: with signing on, SERIAL0's unsigned heartbeats still reach SERIAL1 (unsigned);
    SERIAL1's unsigned ones are dropped, its signed ones reach SERIAL0 with their own signature."""
    from tests.sim.test_signing import KEY, _now_ticks, _signer

    async with running() as fleet:
        v = fleet.vehicles[0]
        s0 = await MavClient.connect(fleet.endpoints[0])
        s1 = await MavClient.connect(await v.listen_serial(1), compid=191)
        try:
            await s0.recv("HEARTBEAT")
            s0.send(M.MAVLink_setup_signing_message(v.sysid, 1, KEY, _now_ticks()))
            await wait_for(lambda: v.signing.enabled, timeout_s=2)
            hb = M.MAVLink_heartbeat_message(M.MAV_TYPE_GCS, M.MAV_AUTOPILOT_INVALID, 0, 0, 0, 3)
            s0.send(hb)
            got = await s1.recv("HEARTBEAT", lambda m: m.get_srcSystem() == 255)
            assert not bytes(got.get_msgbuf())[2] & 1 and got.get_srcComponent() == 190
            i = s0.mark()
            s1.send(hb)  # unsigned on SERIAL1: ignored, so not forwarded either
            signed = hb.pack(_signer(1, 191))
            s1.writer.write(signed)
            fwd = await s0.recv("HEARTBEAT", lambda m: m.get_srcSystem() == 255, since=i)
            assert bytes(fwd.get_msgbuf()) == signed  # byte for byte, its own signature (link_id 1)
            assert len([m for m in s0.of("HEARTBEAT", i) if m.get_srcSystem() == 255]) == 1
        finally:
            await s0.close()
            await s1.close()
