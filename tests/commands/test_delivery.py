"""Delivery guarantees: order per vehicle, independence across vehicles, link and NATS outages."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from pathlib import Path

import nats.errors
import pytest
from nats.aio.client import Client

from mavjet.contract.subjects import CMD_STREAM, cmd_filter
from mavjet.drivers.mavlink.dialect import mavlink2
from mavjet.gateway.commands.intake import API_CONCURRENCY
from mavjet.gateway.config import ConsumerMode
from mavjet.ops.natsserver import NatsServer
from mavjet.sim.fleet import SimConfig
from tests.support import wait_for
from tests.support.commands import ENV, TEST_COMMANDS, cmd_results, command_rig, ready_to_fly

SET_MODE = mavlink2.MAV_CMD_DO_SET_MODE


async def test_commands_of_one_vehicle_run_in_order(provisioned: Client, nats_server: NatsServer, tmp_path: Path) -> None:
    values = [100.0 * (i + 1) for i in range(12)]
    async with command_rig(provisioned, nats_server.url, tmp_path / "state") as rig:
        ids = [await rig.client.publish("VID-001", "param_set", {"name": "RTL_ALT", "value": v}) for v in values]
        results = [await rig.client.wait(i, 30) for i in ids]
        assert all(r.accepted for r in results), [r.detail for r in results if not r.accepted]
        assert rig.vehicle("VID-001").params["RTL_ALT"] == values[-1]
        stored = await cmd_results(provisioned)
    # The audit trail holds the results in the order the commands were published.
    assert [d["cmd_id"] for d in stored] == ids
    assert [d["value"] for d in stored] == values
    finished = [r.seen_ns for r in results]
    assert finished == sorted(finished)


async def test_vehicles_never_wait_on_each_other_and_a_dropped_link_is_redelivered(
    provisioned: Client, nats_server: NatsServer, tmp_path: Path
) -> None:
    async with command_rig(provisioned, nats_server.url, tmp_path / "state", vehicles=3) as rig:
        await ready_to_fly(rig.fleet)
        slow = rig.vehicle("VID-001")
        slow.drop_link(4.0)  # silent both ways: nothing the gateway sends arrives
        t0 = time.monotonic()
        stuck = await rig.client.publish("VID-001", "set_mode", {"mode": "GUIDED"})
        others = [await rig.client.publish(vid, "set_mode", {"mode": "GUIDED"}) for vid in ("VID-002", "VID-003")]
        for cmd_id in others:
            r = await rig.client.wait(cmd_id, 10)
            assert r.accepted, r
        others_done_s = time.monotonic() - t0
        assert rig.client.result(stuck) is None  # still waiting for its vehicle
        r = await rig.client.wait(stuck, 30)
        stuck_done_s = time.monotonic() - t0
        assert r.accepted, r
        assert r.data["deliveries"] >= 2  # nak'd while the link was down, redelivered, completed
        assert others_done_s < 3.0 < stuck_done_s
        # Executed once: the vehicle never heard the attempts made while its link was down.
        assert rig.executions("VID-001", SET_MODE) == 1
        assert all(rig.executions(v, SET_MODE) == 1 for v in ("VID-002", "VID-003"))
        results = await cmd_results(provisioned)
    assert sorted(d["cmd_id"] for d in results) == sorted([stuck, *others])


async def test_consumer_survives_nats_server_restart(provisioned: Client, nats_server: NatsServer, tmp_path: Path) -> None:
    async with command_rig(provisioned, nats_server.url, tmp_path / "state", vehicles=2) as rig:
        assert (await rig.call("VID-001", "param_get", {"name": "RTL_ALT"})).accepted
        # Queue commands the vehicle cannot run yet, then restart the server under them.
        rig.vehicle("VID-002").drop_link(30.0)
        queued = [await rig.client.publish("VID-002", "param_set", {"name": "RTL_ALT", "value": 700.0 + i})
                  for i in range(3)]
        await asyncio.sleep(0.5)
        binds_before = {vid: loop.binds for vid, loop in rig.service.lanes.items()}
        nats_server.restart()
        await wait_for(lambda: provisioned.is_connected and rig.gw.publisher.is_connected, timeout_s=20)
        await wait_for(lambda: all(loop.binds > binds_before[vid] for vid, loop in rig.service.lanes.items()),
                       timeout_s=20)
        await rig.client.start()
        # Commands published after the restart are served...
        r = await rig.call("VID-001", "param_set", {"name": "RTL_ALT", "value": 1234})
        assert r.accepted, r
        # ...and so are the ones that were queued before it, once the vehicle is back.
        rig.vehicle("VID-002").restore_link()
        for cmd_id in queued:
            r = await rig.client.wait(cmd_id, 30)
            assert r.accepted, r
        assert rig.vehicle("VID-002").params["RTL_ALT"] == 702.0
        results = await cmd_results(provisioned)
    ids = [d["cmd_id"] for d in results]
    assert len(ids) == len(set(ids)) == 5


async def test_in_progress_acks_keep_a_long_command(provisioned: Client, nats_server: NatsServer, tmp_path: Path) -> None:
    # AckWait 1 s, but the takeoff is answered IN_PROGRESS until the climb ends (seconds):
    # only the in_progress acks keep JetStream from redelivering it meanwhile.
    commands = replace(TEST_COMMANDS, ack_wait_s=1.0, in_progress_interval_s=0.3, in_progress_timeout_s=20.0)
    sim = SimConfig(vehicles=1, base_port=0, speedup=2.0,
                    in_progress_commands=frozenset({mavlink2.MAV_CMD_NAV_TAKEOFF}))
    async with command_rig(provisioned, nats_server.url, tmp_path / "state", commands=commands, sim=sim) as rig:
        await ready_to_fly(rig.fleet)
        assert (await rig.call("VID-001", "set_mode", {"mode": "GUIDED"})).accepted
        assert (await rig.call("VID-001", "arm")).accepted
        t0 = time.monotonic()
        cmd_id = await rig.client.publish("VID-001", "takeoff", {"alt_m": 15})
        # A second puller on the same consumer (a standby gateway) must not be handed the running command.
        rival = await provisioned.jetstream().pull_subscribe_bind(durable="gw_VID-001", stream="TWIN_CMD")
        try:
            await asyncio.sleep(0.3)
            stolen = await rival.fetch(1, timeout=2.5)
        except nats.errors.TimeoutError:
            stolen = []
        finally:
            await rival.unsubscribe()
        assert stolen == [], "the command was redelivered while it was running"
        r = await rig.client.wait(cmd_id, 60)
        took_s = time.monotonic() - t0
        assert r.accepted, r
        assert took_s > 2.0  # far longer than AckWait
        assert r.data["deliveries"] == 1
        assert rig.executions("VID-001", mavlink2.MAV_CMD_NAV_TAKEOFF) == 1
        assert rig.vehicle("VID-001").alt_m >= 14.0


@pytest.mark.parametrize("mode", [ConsumerMode.GATEWAY, ConsumerMode.VEHICLE])
async def test_a_fleet_registers_its_consumers_through_one_bounded_limiter(
    provisioned: Client, nats_server: NatsServer, tmp_path: Path, mode: ConsumerMode
) -> None:
    """A gateway of 12 vehicles pulls through one consumer whose filter names each of them (or, per vehicle,
    12 consumers whose API calls share one limiter, so a large fleet starting at once cannot queue more
    creates on the server than it answers within their timeout); every vehicle is served."""
    commands = replace(TEST_COMMANDS, consumer=mode)
    async with command_rig(provisioned, nats_server.url, tmp_path / "state", vehicles=12, commands=commands) as rig:
        intakes = rig.service.intakes
        assert len({id(i.api) for i in intakes}) == 1
        limiter = intakes[0].api
        assert limiter.total_tokens == API_CONCURRENCY and limiter.borrowed_tokens <= API_CONCURRENCY
        js = provisioned.jetstream()
        info = await js.stream_info(CMD_STREAM)
        assert info.state.consumer_count == (1 if mode is ConsumerMode.GATEWAY else 12)
        if mode is ConsumerMode.GATEWAY:
            consumer = await js.consumer_info(CMD_STREAM, intakes[0].name)
            assert sorted(consumer.config.filter_subjects or []) == sorted(
                cmd_filter(ENV, vid) for vid in rig.service.lanes)
        ids = {vid: await rig.client.publish(vid, "param_get", {"name": "RTL_ALT"}) for vid in rig.service.lanes}
        for cmd_id in ids.values():
            assert (await rig.client.wait(cmd_id, 20)).accepted
