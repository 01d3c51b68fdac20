"""One TWIN_CMD consumer per gateway (`[commands] consumer = "gateway"`), on a real nats-server with sim vehicles.

- A vehicle's commands keep their order and a full lane refuses at once, while another vehicle's run;
- a crashed owner's consumer still carries its vehicles' subjects: the new owner takes them out of it
  (a work queue refuses overlapping filters), and the command that was in flight is recovered, not re-sent.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import anyio
from nats.aio.client import Client

from mavjet.contract.events import EventType
from mavjet.contract.subjects import CMD_STREAM, cmd_filter
from mavjet.drivers.mavlink.dialect import mavlink2
from mavjet.gateway.commands.recovery import CONFIRMED_DETAIL
from mavjet.gateway.config import ConsumerMode
from mavjet.ops.client import CommandClient
from mavjet.ops.natsserver import NatsServer
from mavjet.sim.fleet import SimConfig, SimFleet
from tests.ownership.support import Crashable, command_gateway, owns, sees_owner
from tests.support.commands import TEST_COMMANDS, command_rig, ready_to_fly
from tests.support.gateway import ENV, collect_events, running
from tests.support.wait import wait_for

SET_MODE = mavlink2.MAV_CMD_DO_SET_MODE
GATEWAY = dataclasses.replace(TEST_COMMANDS, consumer=ConsumerMode.GATEWAY)


async def test_a_full_lane_refuses_at_once_and_the_rest_keep_their_order(
        provisioned: Client, nats_server: NatsServer, tmp_path: Path) -> None:
    commands = dataclasses.replace(GATEWAY, max_queued_per_vehicle=2)
    async with command_rig(provisioned, nats_server.url, tmp_path / "state", vehicles=2, commands=commands) as rig:
        assert rig.service.mode is ConsumerMode.GATEWAY
        slow = rig.vehicle("VID-001")
        slow.drop_link(3.0)  # its first command retries in its lane; two wait behind it; the rest find no room
        t0 = time.monotonic()
        values = [300.0 + i for i in range(5)]
        ids = [await rig.client.publish("VID-001", "param_set", {"name": "RTL_ALT", "value": v}) for v in values]
        other = await rig.client.wait(await rig.client.publish("VID-002", "param_get", {"name": "RTL_ALT"}), 10)
        assert other.accepted and time.monotonic() - t0 < 2.5, "a slow vehicle held up another"
        results = [await rig.client.wait(i, 30) for i in ids]
        accepted = [r for r in results if r.accepted]
        refused = [r for r in results if not r.accepted]
        assert len(accepted) == 3 and len(refused) == 2, [(r.result, r.detail) for r in results]
        assert all(r.result == "rejected" and "max_queued_per_vehicle" in r.detail for r in refused)
        assert all(rr.seen_ns < ra.seen_ns for rr in refused for ra in accepted), "refused at once, not in turn"
        # The three it took ran in publish order: the vehicle ends with the last of them.
        done = sorted(accepted, key=lambda r: r.seen_ns)
        assert [r.cmd_id for r in done] == [i for i, r in zip(ids, results, strict=True) if r.accepted]
        assert slow.params["RTL_ALT"] == values[ids.index(done[-1].cmd_id)]
        assert rig.service.lanes["VID-001"].refused == 2
        info = await provisioned.jetstream().stream_info(CMD_STREAM)
        assert info.state.consumer_count == 1


async def test_new_owner_takes_the_crashed_gateways_subjects_and_recovers_its_command(
        provisioned: Client, nats_server: NatsServer, tmp_path: Path) -> None:
    js = provisioned.jetstream()
    async with SimFleet(SimConfig(vehicles=2, base_port=0, speedup=5.0)) as fleet:
        v = fleet.vehicles[0]
        await ready_to_fly(fleet)
        a, sa = command_gateway(nats_server.url, fleet.endpoints, tmp_path / "a", "gw-a", commands=GATEWAY)
        b, sb = command_gateway(nats_server.url, fleet.endpoints, tmp_path / "b", "gw-b", commands=GATEWAY)
        owner = Crashable(a)
        async with CommandClient(provisioned, ENV, issuer="pytest") as client, anyio.create_task_group() as tg:
            tg.start_soon(owner.run)
            await wait_for(lambda: owns(a, "VID-001") and owns(a, "VID-002") and bool(sa.intakes)
                           and sa.intakes[0].bound == {"VID-001", "VID-002"}, timeout_s=10)
            await wait_for(lambda: a.twins["VID-001"].model.armed is not None, timeout_s=10)
            dead = sa.intakes[0].name
            async with running(b):
                await wait_for(lambda: sees_owner(b, a, "VID-001") and sees_owner(b, a, "VID-002"), timeout_s=10)
                assert [c.name for c in await js.consumers_info(CMD_STREAM)] == [dead]  # a standby has none
                v.drop_next("COMMAND_ACK", 10)  # the vehicle acts, the owner never hears it
                cmd_id = await client.publish("VID-001", "set_mode", {"mode": "GUIDED"})
                await wait_for(lambda: sum(1 for e in v.executions if e.command == SET_MODE and e.executed) >= 1,
                               timeout_s=5)
                await owner.crash()  # SIGKILL-like: no release, its consumer left behind with both subjects
                v.clear_drops()
                await wait_for(lambda: owns(b, "VID-001") and owns(b, "VID-002")
                               and bool(sb.intakes) and sb.intakes[0].bound == {"VID-001", "VID-002"}, timeout_s=15)
                result = await client.wait(cmd_id, 30, vid="VID-001")
                assert result.accepted and result.detail == CONFIRMED_DETAIL, result
                assert sum(1 for e in v.executions if e.command == SET_MODE and e.executed) == 1, "sent again"
                assert sb.intakes[0].taken_over == 2
                consumers = await js.consumers_info(CMD_STREAM)
                assert [c.name for c in consumers] == [sb.intakes[0].name]
                assert sorted(consumers[0].config.filter_subjects or []) == [
                    cmd_filter(ENV, "VID-001"), cmd_filter(ENV, "VID-002")]
                # Both vehicles' commands go on through the new owner's one consumer.
                for vid in ("VID-001", "VID-002"):
                    assert (await client.call(vid, "param_get", {"name": "RTL_ALT"}, timeout_s=20)).accepted
            # A clean stop deletes the gateway's consumer: nothing is left for the next owner to take over.
            assert await js.consumers_info(CMD_STREAM) == []
            tg.cancel_scope.cancel()
    events = await collect_events(provisioned)
    results = [d for _, t, d, _ in events if t == EventType.CMD_RESULT and d.get("cmd_id") == cmd_id]
    assert len(results) == 1, results


def test_gateway_consumer_names_stay_unique_and_valid_for_long_holders() -> None:
    from mavjet.drivers.mavlink.transport import Endpoint
    from mavjet.gateway.commands.consumer import MAX_NAME, gateway_consumer_name
    from mavjet.gateway.config import GatewayConfig, VehicleConfig
    from mavjet.gateway.runtime.metrics import GatewayMetrics
    from mavjet.gateway.services import ServiceContext

    cfg = GatewayConfig(vehicles=(VehicleConfig(vid="V", endpoint=Endpoint.parse("udp:127.0.0.1:14550")),), env="t")

    def name(holder: str) -> str:
        ctx = ServiceContext(cfg=cfg, vehicles={}, nats=None, metrics=GatewayMetrics(), holder=holder)  # type: ignore[arg-type]
        return gateway_consumer_name(ctx)

    long_host = "edge-" + "x" * 150
    a, b = name(f"hub@{long_host}:41:aaaa1111"), name(f"hub@{long_host}:41:bbbb2222")  # differ only at the end
    assert a != b and len(a) == len(b) == len("gwx_") + MAX_NAME
    assert name("hub@edge.example:41:aaaa1111") == "gwx_hub_edge_example_41_aaaa1111"
    for n in (a, b):
        assert all(c.isalnum() or c in "_-" for c in n), n
