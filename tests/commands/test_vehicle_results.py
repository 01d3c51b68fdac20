"""The vehicle's own MAV_RESULT decides ack / nak / term, end to end.

The sim's `reject_next` makes the vehicle answer the next commands of one
MAV_CMD with a chosen result without acting on them, so every branch of the
lifecycle's step 6 is driven by a real COMMAND_ACK over TCP through a real
nats-server. Each test checks both the audit trail (TWIN_EVENTS) and every
cmd_result *published* (a core subscription, which also sees copies the
stream would deduplicate): exactly one result per command.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from nats.aio.client import Client

from mavjet.drivers.mavlink.dialect import mavlink2
from mavjet.ops.natsserver import NatsServer
from tests.support.commands import (
    TEST_COMMANDS,
    cmd_results,
    command_rig,
    consumer_idle,
    published_results,
    ready_to_fly,
)

SET_MODE = mavlink2.MAV_CMD_DO_SET_MODE
TEMPORARILY_REJECTED = mavlink2.MAV_RESULT_TEMPORARILY_REJECTED
VID = "VID-001"
QUIET_S = 1.5  # several nak delays: long enough for a wrong redelivery to show


async def test_temporarily_rejected_is_nakd_redelivered_then_accepted(
    provisioned: Client, nats_server: NatsServer, tmp_path: Path
) -> None:
    async with command_rig(provisioned, nats_server.url, tmp_path / "state") as rig, \
            published_results(provisioned) as published:  # fmt: skip
        await ready_to_fly(rig.fleet)
        v = rig.vehicle(VID)
        v.reject_next(SET_MODE, TEMPORARILY_REJECTED)
        cmd_id = await rig.client.publish(VID, "set_mode", {"mode": "GUIDED"})
        r = await rig.client.wait(cmd_id, 20)
        assert (r.result, r.mav_result, r.detail) == ("accepted", mavlink2.MAV_RESULT_ACCEPTED, ""), r
        assert r.data["deliveries"] >= 2
        assert r.latency_ms >= TEST_COMMANDS.nak_delay_s * 1000  # the nak's delay was honoured
        assert v.mode == "GUIDED"
        # The vehicle answered TEMPORARILY_REJECTED once without acting, then executed the redelivery once.
        assert rig.forced(VID, SET_MODE) == [TEMPORARILY_REJECTED]
        assert rig.executions(VID, SET_MODE) == 1
        await consumer_idle(provisioned, VID)
        await asyncio.sleep(QUIET_S)
        loop = rig.service.lanes[VID]
        assert loop.dispositions.get("nak", 0) == r.data["deliveries"] - 1 and loop.dispositions.get("ack") == 1
        assert loop.dispositions.get("term", 0) == 0
        stored = await cmd_results(provisioned)
    assert [d["cmd_id"] for d in published] == [cmd_id]
    assert [(d["cmd_id"], d["result"]) for d in stored] == [(cmd_id, "accepted")]


@pytest.mark.parametrize(
    ("mav_result", "name"),
    [(mavlink2.MAV_RESULT_UNSUPPORTED, "unsupported"), (mavlink2.MAV_RESULT_DENIED, "denied")],
)
async def test_unsupported_and_denied_are_terminated_as_rejected(
    provisioned: Client, nats_server: NatsServer, tmp_path: Path, mav_result: int, name: str
) -> None:
    async with command_rig(provisioned, nats_server.url, tmp_path / "state") as rig, \
            published_results(provisioned) as published:  # fmt: skip
        await rig.link_known(VID)
        v = rig.vehicle(VID)
        v.reject_next(SET_MODE, mav_result, count=3)  # more than one: a redelivery would be answered the same
        cmd_id = await rig.client.publish(VID, "set_mode", {"mode": "ALT_HOLD"})
        r = await rig.client.wait(cmd_id, 20)
        assert (r.result, r.mav_result, r.detail) == ("rejected", mav_result, f"vehicle answered {name}"), r
        assert r.data["deliveries"] == 1 and r.attempts == 1
        # Terminated: never delivered again, so the vehicle heard it exactly once.
        await consumer_idle(provisioned, VID)
        await asyncio.sleep(QUIET_S)
        assert rig.forced(VID, SET_MODE) == [mav_result]
        assert v.forced_pending(SET_MODE) == 2
        assert rig.executions(VID, SET_MODE) == 0 and v.mode == "STABILIZE"
        loop = rig.service.lanes[VID]
        assert loop.dispositions == {"term": 1} and loop.executor.handled == 1
        stored = await cmd_results(provisioned)
    assert [d["cmd_id"] for d in published] == [cmd_id]
    assert [(d["cmd_id"], d["result"], d["mav_result"]) for d in stored] == [(cmd_id, "rejected", mav_result)]


async def test_temporarily_rejected_until_max_deliver_ends_in_one_failed_result(
    provisioned: Client, nats_server: NatsServer, tmp_path: Path
) -> None:
    max_deliver = TEST_COMMANDS.max_deliver
    async with command_rig(provisioned, nats_server.url, tmp_path / "state") as rig, \
            published_results(provisioned) as published:  # fmt: skip
        await rig.link_known(VID)
        v = rig.vehicle(VID)
        spare = 4
        v.reject_next(SET_MODE, TEMPORARILY_REJECTED, count=max_deliver + spare)
        t0 = time.monotonic()
        cmd_id = await rig.client.publish(VID, "set_mode", {"mode": "ALT_HOLD"})
        r = await rig.client.wait(cmd_id, 25)
        took_s = time.monotonic() - t0
        # The documented outcome: at MaxDeliver a TEMPORARILY_REJECTED retry becomes final as `failed`.
        assert (r.result, r.mav_result) == ("failed", TEMPORARILY_REJECTED), r
        assert r.detail == f"temporarily rejected by the vehicle; gave up after {max_deliver} deliveries"
        assert r.data["deliveries"] == max_deliver
        assert took_s >= (max_deliver - 1) * TEST_COMMANDS.nak_delay_s
        # Nothing after the final result: the message is gone and the vehicle is not asked again.
        info = await consumer_idle(provisioned, VID)
        await asyncio.sleep(QUIET_S)
        assert rig.forced(VID, SET_MODE) == [TEMPORARILY_REJECTED] * max_deliver
        assert v.forced_pending(SET_MODE) == spare
        assert rig.executions(VID, SET_MODE) == 0 and v.mode == "STABILIZE"
        loop = rig.service.lanes[VID]
        assert loop.dispositions == {"nak": max_deliver - 1, "term": 1}
        assert loop.executor.handled == max_deliver
        assert (await provisioned.jetstream().stream_info("TWIN_CMD")).state.messages == 0
        assert info.num_redelivered == 0  # nothing left waiting for redelivery
        stored = await cmd_results(provisioned)
    assert [d["cmd_id"] for d in published] == [cmd_id]
    assert [(d["cmd_id"], d["result"]) for d in stored] == [(cmd_id, "failed")]


@pytest.mark.parametrize(("name", "params"), [("arm", {}), ("takeoff", {"alt_m": 10.0})])
async def test_a_temporarily_rejected_arm_or_takeoff_is_final_never_retried(
    provisioned: Client, nats_server: NatsServer, tmp_path: Path, name: str, params: dict[str, float]
) -> None:
    """PX4 answers a refused arm with TEMPORARILY_REJECTED: arming (or taking off) on a redelivery seconds later,
    once a check happens to clear, is a blind retry. One `rejected` result, the vehicle asked once."""
    mav_cmd = mavlink2.MAV_CMD_COMPONENT_ARM_DISARM if name == "arm" else mavlink2.MAV_CMD_NAV_TAKEOFF
    async with command_rig(provisioned, nats_server.url, tmp_path / "state") as rig, \
            published_results(provisioned) as published:  # fmt: skip
        await ready_to_fly(rig.fleet)
        v = rig.vehicle(VID)
        if name == "takeoff":
            for step, p in (("set_mode", {"mode": "GUIDED"}), ("arm", {})):
                assert (await rig.call(VID, step, p)).accepted
        v.reject_next(mav_cmd, TEMPORARILY_REJECTED, count=3)  # a redelivery would be refused the same
        cmd_id = await rig.client.publish(VID, name, params)
        r = await rig.client.wait(cmd_id, 20)
        assert (r.result, r.mav_result) == ("rejected", TEMPORARILY_REJECTED), r
        assert r.data["deliveries"] == 1, r
        await consumer_idle(provisioned, VID)
        await asyncio.sleep(QUIET_S)
        assert rig.forced(VID, mav_cmd) == [TEMPORARILY_REJECTED]  # asked once, never again
        assert rig.executions(VID, mav_cmd) == 0
    assert [d["cmd_id"] for d in published if d["cmd_id"] == cmd_id] == [cmd_id]
