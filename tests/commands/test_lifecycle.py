"""Every result kind, end to end: real nats-server, real sim over TCP, in-process gateway."""

from __future__ import annotations

from pathlib import Path

from nats.aio.client import Client

from mavjet.drivers.mavlink.dialect import mavlink2
from mavjet.ops.natsserver import NatsServer
from tests.support import wait_for
from tests.support.commands import cmd_results, command_rig, dispositions_settled, ready_to_fly

ARM = mavlink2.MAV_CMD_COMPONENT_ARM_DISARM
TAKEOFF = mavlink2.MAV_CMD_NAV_TAKEOFF


async def test_fly_accepted_and_one_result_each(provisioned: Client, nats_server: NatsServer, tmp_path: Path) -> None:
    async with command_rig(provisioned, nats_server.url, tmp_path / "state") as rig:
        await ready_to_fly(rig.fleet)
        r = await rig.call("VID-001", "set_mode", {"mode": "GUIDED"})
        assert r.accepted, r
        r = await rig.call("VID-001", "arm")
        assert r.accepted and r.mav_result == 0 and r.attempts == 1, r
        r = await rig.call("VID-001", "takeoff", {"alt_m": 12})
        assert r.accepted, r
        assert r.latency_ms > 0
        v = rig.vehicle("VID-001")
        await wait_for(lambda: v.alt_m > 5, timeout_s=20)
        assert rig.executions("VID-001", ARM) == 1
        assert rig.executions("VID-001", TAKEOFF) == 1
        results = await wait_for_results(provisioned, 3)
    assert [d["name"] for d in results] == ["set_mode", "arm", "takeoff"]
    assert all(d["_msg_id"] == f"VID-001:cmd_result:{d['cmd_id']}" for d in results)
    assert all(d["result"] == "accepted" and d["armed"] is not None for d in results)


async def wait_for_results(nc: Client, n: int) -> list[dict[str, object]]:
    import asyncio
    import time

    deadline = time.monotonic() + 15
    while True:
        got = await cmd_results(nc)
        if len(got) >= n or time.monotonic() > deadline:
            return got
        await asyncio.sleep(0.2)


async def stream_empty(nc: Client) -> bool:
    info = await nc.jetstream().stream_info("TWIN_CMD")
    return info.state.messages == 0


async def test_invalid_commands_are_terminated_with_the_reason(
    provisioned: Client, nats_server: NatsServer, tmp_path: Path
) -> None:
    import msgpack

    from mavjet.contract.commands import encode_command

    async with command_rig(provisioned, nats_server.url, tmp_path / "state") as rig:
        c = rig.client
        c.expect("bad-msgpack")
        await c.publish_raw("VID-001", "land", b"\xc1\xc1 not msgpack", msg_id="bad-msgpack")
        unknown = await c.publish("VID-001", "selfdestruct", {}, validate=False)
        out_of_range = await c.publish("VID-001", "takeoff", {"alt_m": 900}, validate=False)
        bad_name = await c.publish("VID-001", "param_get", {"name": "rtl alt"}, validate=False)
        big = encode_command("too-big", {"name": "RTL_ALT", "pad": "x" * 70_000}, issued_ns=1)
        c.expect("too-big")
        await c.publish_raw("VID-001", "param_get", big, msg_id="too-big")
        no_issued = "no-issued"
        c.expect(no_issued)
        await c.publish_raw("VID-001", "land", msgpack.packb({"id": no_issued}), msg_id=no_issued)
        got = {k: await c.wait(k, 15) for k in ("bad-msgpack", unknown, out_of_range, bad_name, "too-big", no_issued)}
        assert {r.result for r in got.values()} == {"invalid"}
        assert got["bad-msgpack"].detail.startswith("land: body is not msgpack")
        assert got[unknown].detail.startswith("unknown command 'selfdestruct' (known: arm, disarm")
        assert got[out_of_range].detail == "takeoff: alt_m 900 outside [1, 500] m"
        assert "is not a parameter name" in got[bad_name].detail
        assert "exceeds the 65536-byte limit" in got["too-big"].detail
        assert got[no_issued].detail == "land: 'issued' is missing"
        assert rig.vehicle("VID-001").stats.commands == 0 or all(
            e.command != mavlink2.MAV_CMD_NAV_LAND for e in rig.vehicle("VID-001").executions
        )
        await wait_for_stream_empty(provisioned)
        assert await dispositions_settled(rig, "VID-001", 6) == {"term": 6}


async def wait_for_stream_empty(nc: Client) -> None:
    import asyncio
    import time

    deadline = time.monotonic() + 10
    while not await stream_empty(nc):
        assert time.monotonic() < deadline, "TWIN_CMD still holds messages"
        await asyncio.sleep(0.1)


async def test_expired_rejected_failed_timeout(provisioned: Client, nats_server: NatsServer, tmp_path: Path) -> None:
    async with command_rig(provisioned, nats_server.url, tmp_path / "state") as rig:
        await ready_to_fly(rig.fleet)
        v = rig.vehicle("VID-001")
        # expired: the deadline passed before the gateway got to it
        r = await rig.call("VID-001", "arm", deadline_s=-1.0)
        assert (r.result, r.mav_result) == ("expired", None), r
        assert "deadline passed" in r.detail
        # rejected by a precondition: never sent to the vehicle
        r = await rig.call("VID-001", "takeoff", {"alt_m": 10})
        assert (r.result, r.detail) == ("rejected", "takeoff needs the vehicle armed"), r
        assert rig.executions("VID-001", ARM) == 0 and rig.executions("VID-001", TAKEOFF) == 0
        # failed: the vehicle answers MAV_RESULT_FAILED (AUTO without a mission, armed: ArduCopter
        # accepts any mode while disarmed, ModeAuto::init's ignore_checks)
        assert (await rig.call("VID-001", "set_mode", {"mode": "GUIDED"})).accepted
        assert (await rig.call("VID-001", "arm")).accepted
        r = await rig.call("VID-001", "set_mode", {"mode": "AUTO"})
        assert (r.result, r.mav_result) == ("failed", mavlink2.MAV_RESULT_FAILED), r
        assert r.detail == "vehicle answered failed"
        # reboot needs disarmed: asked while the twin shows the vehicle armed (the sim disarms on the ground
        # after its delay, so not at the end of this test on a loaded host)
        await wait_for(lambda: rig.gw.twins["VID-001"].model.armed is True, timeout_s=5)
        r = await rig.call("VID-001", "reboot")
        assert (r.result, r.detail) == ("rejected", "reboot needs the vehicle disarmed"), r
        # rejected by the vehicle: DENIED (reposition to 0,0)
        r = await rig.call("VID-001", "goto", {"lat_deg": 0.0, "lon_deg": 0.0, "alt_m": 10})
        assert (r.result, r.mav_result) == ("rejected", mavlink2.MAV_RESULT_DENIED), r
        # timeout: every COMMAND_ACK lost, link up (non-arming command: retried, then given up)
        v.drop_next("COMMAND_ACK", 10)
        r = await rig.call("VID-001", "set_mode", {"mode": "LOITER"})
        assert (r.result, r.attempts) == ("timeout", 3), r
        assert r.detail == "no COMMAND_ACK after 3 attempts"
        results = await cmd_results(provisioned)
    assert [d["result"] for d in results] == [
        "expired", "rejected", "accepted", "accepted", "failed", "rejected", "rejected", "timeout",
    ]
    assert len({d["cmd_id"] for d in results}) == len(results)


async def test_arm_with_lost_ack_is_confirmed_by_heartbeat_not_resent(
    provisioned: Client, nats_server: NatsServer, tmp_path: Path
) -> None:
    async with command_rig(provisioned, nats_server.url, tmp_path / "state") as rig:
        await ready_to_fly(rig.fleet)
        assert (await rig.call("VID-001", "set_mode", {"mode": "GUIDED"})).accepted
        rig.vehicle("VID-001").drop_next("COMMAND_ACK", 1)
        r = await rig.call("VID-001", "arm")
        assert r.accepted, r
        assert r.detail == "confirmed by HEARTBEAT (ACK lost)"
        assert rig.executions("VID-001", ARM) == 1
        assert rig.vehicle("VID-001").armed


async def test_param_set_and_read_back(provisioned: Client, nats_server: NatsServer, tmp_path: Path) -> None:
    async with command_rig(provisioned, nats_server.url, tmp_path / "state") as rig:
        r = await rig.call("VID-001", "param_set", {"name": "RTL_ALT", "value": 2500})
        assert r.accepted and r.data["value"] == 2500, r
        assert rig.vehicle("VID-001").params["RTL_ALT"] == 2500
        r = await rig.call("VID-001", "param_get", {"name": "RTL_ALT"})
        assert r.accepted and r.data["value"] == 2500 and r.detail == "RTL_ALT = 2500", r
        # ArduPilot (up to 4.7, the sim's model) does not answer an unknown name: the gateway knows the
        # vehicle's parameter list (fetched once, drivers/mavlink/paramlist.py) and says so at once.
        r = await rig.call("VID-001", "param_get", {"name": "NO_SUCH_PARAM"})
        assert r.result == "rejected" and "no such parameter" in r.detail, r


async def test_failsafe_refuses_flight_commands_but_not_recovery(
    provisioned: Client, nats_server: NatsServer, tmp_path: Path
) -> None:
    from mavjet.sim.fleet import SimConfig

    sim = SimConfig(vehicles=1, base_port=0, speedup=10.0)
    async with command_rig(provisioned, nats_server.url, tmp_path / "state", sim=sim) as rig:
        await ready_to_fly(rig.fleet)
        for name, params in (("set_mode", {"mode": "GUIDED"}), ("arm", {}), ("takeoff", {"alt_m": 10})):
            assert (await rig.call("VID-001", name, params)).accepted
        v = rig.vehicle("VID-001")
        await wait_for(lambda: v.alt_m > 5, timeout_s=20)
        v.set_battery_pct(5.0)
        model = rig.gw.twins["VID-001"].model
        await wait_for(lambda: model.failsafe_active, timeout_s=20)
        r = await rig.call("VID-001", "goto", {"lat_deg": -35.3625, "lon_deg": 149.166, "alt_m": 20})
        assert r.result == "rejected" and "failsafe is active" in r.detail, r
        r = await rig.call("VID-001", "set_mode", {"mode": "GUIDED"})
        assert r.result == "rejected" and "failsafe is active" in r.detail, r
        assert rig.executions("VID-001", mavlink2.MAV_CMD_DO_REPOSITION) == 0
        r = await rig.call("VID-001", "rtl")
        assert r.accepted, r
