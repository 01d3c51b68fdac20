"""Parameters as ArduPilot serves them, and a reboot that keeps them."""

from __future__ import annotations

import asyncio

import pytest
from pymavlink.dialects.v20 import ardupilotmega as M

from mavjet.sim import params
from mavjet.sim.fleet import SimFleet
from tests.support import wait_for
from tests.support.sim import MavClient, ready


def pname(m: object) -> str:
    pid = m.param_id  # type: ignore[attr-defined]
    return pid.decode() if isinstance(pid, bytes) else str(pid)


async def test_param_list_read_and_set(fleet: SimFleet, gcs: MavClient) -> None:
    i = gcs.mark()
    gcs.send(M.MAVLink_param_request_list_message(1, 1))
    await wait_for(lambda: len(gcs.of("PARAM_VALUE", i)) >= len(params.SPECS), timeout_s=10, interval_s=0.02)
    values = gcs.of("PARAM_VALUE", i)
    assert {pname(m) for m in values} == {s.name for s in params.SPECS}
    assert {m.param_count for m in values} == {len(params.SPECS)}
    assert sorted(m.param_index for m in values) == list(range(len(params.SPECS)))
    # read by name and by index
    i = gcs.mark()
    gcs.send(M.MAVLink_param_request_read_message(1, 1, b"RTL_ALT", -1))
    pv = await gcs.recv("PARAM_VALUE", since=i)
    assert pname(pv) == "RTL_ALT" and pv.param_value == 1500.0 and pv.param_type == M.MAV_PARAM_TYPE_INT32
    i = gcs.mark()
    gcs.send(M.MAVLink_param_request_read_message(1, 1, b"", params.INDEX["WPNAV_SPEED"]))
    pv = await gcs.recv("PARAM_VALUE", since=i)
    assert pname(pv) == "WPNAV_SPEED" and pv.param_type == M.MAV_PARAM_TYPE_REAL32
    # set: the answer carries the stored value (an INT8 rounds)
    i = gcs.mark()
    gcs.send(M.MAVLink_param_set_message(1, 1, b"FENCE_ACTION", 2.6, M.MAV_PARAM_TYPE_INT8))
    pv = await gcs.recv("PARAM_VALUE", since=i)
    assert pname(pv) == "FENCE_ACTION" and pv.param_value == 3.0
    assert fleet.vehicles[0].params["FENCE_ACTION"] == 3.0
    i = gcs.mark()
    gcs.send(M.MAVLink_param_set_message(1, 1, b"WPNAV_SPEED", 742.25, M.MAV_PARAM_TYPE_REAL32))
    assert (await gcs.recv("PARAM_VALUE", since=i)).param_value == pytest.approx(742.25)


async def test_unknown_param_gets_no_answer(fleet: SimFleet, gcs: MavClient) -> None:
    i = gcs.mark()
    gcs.send(M.MAVLink_param_set_message(1, 1, b"NO_SUCH_PARAM", 1.0, M.MAV_PARAM_TYPE_REAL32))
    gcs.send(M.MAVLink_param_request_read_message(1, 1, b"NO_SUCH_PARAM", -1))
    await asyncio.sleep(0.5)
    assert not [m for m in gcs.of("PARAM_VALUE", i) if m.param_id == "NO_SUCH_PARAM"]  # others: unsolicited
    assert "NO_SUCH_PARAM" not in fleet.vehicles[0].params


async def test_reboot_drops_clients_resets_state_and_keeps_params(fleet: SimFleet, gcs: MavClient) -> None:
    v = fleet.vehicles[0]
    await ready(fleet)
    i = gcs.mark()
    gcs.send(M.MAVLink_param_set_message(1, 1, b"RTL_ALT", 2500, M.MAV_PARAM_TYPE_INT32))
    await gcs.recv("PARAM_VALUE", since=i)
    await gcs.command_long(1, M.MAV_CMD_SET_MESSAGE_INTERVAL, 33, 100_000)
    await gcs.set_mode(1, 4)
    # refused while armed
    await gcs.command_long(1, M.MAV_CMD_COMPONENT_ARM_DISARM, 1)
    assert (await gcs.command_long(1, M.MAV_CMD_PREFLIGHT_REBOOT_SHUTDOWN, 1)).result == M.MAV_RESULT_FAILED
    await gcs.command_long(1, M.MAV_CMD_COMPONENT_ARM_DISARM, 0)
    ack = await gcs.command_long(1, M.MAV_CMD_PREFLIGHT_REBOOT_SHUTDOWN, 1)
    assert ack.result == M.MAV_RESULT_ACCEPTED
    await gcs.wait_closed(timeout_s=5)
    await gcs.close()
    # comes back ~1 s of sim time later; reconnect with bounded retries
    client = None
    for _ in range(100):
        try:
            client = await MavClient.connect(fleet.endpoints[0])
            break
        except OSError:
            await asyncio.sleep(0.05)
    assert client is not None, "vehicle did not come back"
    try:
        hb = await client.recv("HEARTBEAT")
        assert hb.custom_mode == 0  # STABILIZE again
        assert v.reboots == 1 and v.mode == "STABILIZE" and not v.armed
        assert v.schedule.interval(33) is None  # streams must be requested again
        await asyncio.sleep(0.3)
        assert not client.of("GLOBAL_POSITION_INT")
        i = client.mark()
        client.send(M.MAVLink_param_request_read_message(1, 1, b"RTL_ALT", -1))
        assert (await client.recv("PARAM_VALUE", since=i)).param_value == 2500.0
    finally:
        await client.close()
