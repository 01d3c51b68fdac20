"""Two real gateways for one sim vehicle on a real nats-server: one owner acts, the other stands by.

Each gateway has its own state dir, NATS connection and TCP link to the
vehicle, as two processes on a hub would; they run in this process so the test
can look at each one's counters and crash one (cancelled: no release, its
lease goes stale as a SIGKILLed process's would).
"""

from __future__ import annotations

import time
from pathlib import Path

import anyio
from nats.aio.client import Client

from mavjet.contract.events import EventType
from mavjet.contract.subjects import LEASES_BUCKET, inflight_key
from mavjet.drivers.mavlink.dialect import mavlink2
from mavjet.gateway.commands.consumer import CommandService
from mavjet.gateway.commands.recovery import CONFIRMED_DETAIL
from mavjet.gateway.daemon import Gateway
from mavjet.ops.client import CommandClient
from mavjet.ops.natsserver import NatsServer
from mavjet.ops.read import current_state
from mavjet.sim.fleet import SimConfig, SimFleet
from tests.ownership.support import (
    Crashable,
    command_gateway,
    holder_of,
    max_gap,
    owns,
    sees_owner,
    state_times,
)
from tests.support.commands import TEST_COMMANDS, ready_to_fly
from tests.support.gateway import ENV, collect_events, running
from tests.support.wait import wait_for, wait_for_async

VID = "VID-001"
SET_MODE = mavlink2.MAV_CMD_DO_SET_MODE


def _gateway(url: str, fleet: SimFleet, state_dir: Path, instance: str) -> tuple[Gateway, CommandService]:
    return command_gateway(url, fleet.endpoints, state_dir, instance, commands=TEST_COMMANDS)


def _owner(gw: Gateway) -> bool:
    return owns(gw, VID)


def _holder(gw: Gateway) -> str:
    return holder_of(gw)


def _executions(fleet: SimFleet, command: int) -> int:
    return sum(1 for e in fleet.vehicles[0].executions if e.command == command and e.executed)


async def test_second_gateway_stands_by_and_only_the_owner_executes(
        provisioned: Client, nats_server: NatsServer, tmp_path: Path) -> None:
    async with SimFleet(SimConfig(vehicles=1, base_port=0, speedup=5.0)) as fleet:
        await ready_to_fly(fleet)
        a, sa = _gateway(nats_server.url, fleet, tmp_path / "a", "gw-a")
        b, sb = _gateway(nats_server.url, fleet, tmp_path / "b", "gw-b")
        async with running(a):
            await wait_for(lambda: _owner(a), timeout_s=10)
            async with running(b), CommandClient(provisioned, ENV, issuer="pytest") as client:
                assert b.ownership is not None
                await wait_for(lambda: sees_owner(b, a, VID), timeout_s=10)
                await wait_for(lambda: b.twins[VID].link.is_up and b.twins[VID].model.armed is not None, timeout_s=10)
                before = _executions(fleet, SET_MODE)
                modes = ["GUIDED", "LOITER"] * 10
                for mode in modes:
                    r = await client.call(VID, "set_mode", {"mode": mode}, timeout_s=20)
                    assert r.accepted, r
                # Every command ran once, all of them by the owner; the standby neither pulled nor sent.
                assert _executions(fleet, SET_MODE) - before == len(modes)
                assert sa.lanes[VID].executor.handled == len(modes)
                assert VID not in sb.lanes or sb.lanes[VID].executor.handled == 0
                assert b.twins[VID].link.stats.refused_not_owner == 0
                assert not _owner(b)
                # The link record (what `mavjet fleet` shows as OWNER) comes from the owner, with its term.
                async def link_record() -> dict[str, object] | None:
                    r = (await current_state(provisioned.jetstream(), ENV, VID)).get((VID, "link"))
                    return r.data if r is not None else None

                link = await wait_for_async(link_record, timeout_s=5)
                assert link["owner"] == _holder(a) and link["gateway"] == "gw-a" and link["token"] > 0
                # /metrics of each: owner 1 and 0, the standby's state and the owner it knows.
                ra, rb = a.metrics.registry, b.metrics.registry
                assert ra.get_sample_value("mavjet_vehicle_owner", {"vehicle": VID}) == 1.0
                assert rb.get_sample_value("mavjet_vehicle_owner", {"vehicle": VID}) == 0.0
                assert rb.get_sample_value("mavjet_vehicle_lease_state",
                                           {"vehicle": VID, "state": "standby", "holder": _holder(a)}) == 1.0
                # Exported once a renew has been answered (the first is 1 s after acquiring; 20 set_modes may be quicker).
                await wait_for(lambda: ra.get_sample_value("mavjet_lease_renew_latency_seconds") is not None, timeout_s=3)
        events = await collect_events(provisioned)
        acquired = [d for v, t, d, _ in events if t == EventType.OWNER_ACQUIRED]
        assert [d["holder"] for d in acquired] == [_holder(a)], acquired
        started = [d["gateway"] for v, t, d, _ in events if t == EventType.GATEWAY_STARTED]
        assert started == ["gw-a"], "a standby says nothing about a vehicle it does not serve"


async def test_crashed_owner_is_replaced_and_its_command_in_flight_is_not_sent_again(
        provisioned: Client, nats_server: NatsServer, tmp_path: Path) -> None:
    """The owner dies while set_mode waits for its ACK: the new owner confirms it from the vehicle, never re-sends."""
    js = provisioned.jetstream()
    async with SimFleet(SimConfig(vehicles=1, base_port=0, speedup=5.0)) as fleet:
        v = fleet.vehicles[0]
        await ready_to_fly(fleet)
        a, _ = _gateway(nats_server.url, fleet, tmp_path / "a", "gw-a")
        b, sb = _gateway(nats_server.url, fleet, tmp_path / "b", "gw-b")
        owner = Crashable(a)
        async with (state_times(provisioned, ENV, VID) as states,
                    CommandClient(provisioned, ENV, issuer="pytest") as client, anyio.create_task_group() as tg):
            tg.start_soon(owner.run)
            await wait_for(lambda: _owner(a), timeout_s=10)
            await wait_for(lambda: a.twins[VID].model.armed is not None, timeout_s=10)
            async with running(b):
                await wait_for(lambda: sees_owner(b, a, VID), timeout_s=10)
                v.drop_next("COMMAND_ACK", 10)  # the vehicle acts, the owner never hears it
                cmd_id = await client.publish(VID, "set_mode", {"mode": "GUIDED"})
                key = inflight_key(ENV, VID, cmd_id)

                async def in_flight_shared() -> bool:
                    try:
                        await js.get_msg(f"KV_{LEASES_BUCKET}", subject=f"$KV.{LEASES_BUCKET}.{key}")
                    except Exception:
                        return False
                    return True

                await wait_for_async(in_flight_shared, timeout_s=10, interval_s=0.01)
                await wait_for(lambda: _executions(fleet, SET_MODE) >= 1, timeout_s=5)
                crashed = await owner.crash()  # SIGKILL-like: no release, no result
                v._drop_out.clear()
                sent_by_the_dead = _executions(fleet, SET_MODE)
                await wait_for(lambda: _owner(b), timeout_s=12)
                took_over_s = time.monotonic() - crashed
                assert took_over_s <= 7.0 + 0.5, took_over_s  # TTL 5 s + 2 s, measured from the crash
                result = await client.wait(cmd_id, 30, vid=VID)
                assert result.accepted and result.detail == CONFIRMED_DETAIL, result
                assert _executions(fleet, SET_MODE) == sent_by_the_dead, "the new owner sent it again"
                assert sb.lanes[VID].executor.recovered == 1
                # Commands go on, through the new owner.
                assert (await client.call(VID, "set_mode", {"mode": "LOITER"}, timeout_s=20)).accepted
        events = await collect_events(provisioned)
        results = [d for _, t, d, _ in events if t == EventType.CMD_RESULT and d.get("cmd_id") == cmd_id]
        assert len(results) == 1, results
        taken = [d for _, t, d, _ in events if t == EventType.OWNER_ACQUIRED and d["takeover"]]
        assert [(d["holder"], d["previous"]) for d in taken] == [(_holder(b), _holder(a))]
        assert taken[0]["token"] > 0
        # State kept flowing: no gap longer than the takeover itself (plus a publish period).
        assert max_gap(states) <= took_over_s + 1.0, max_gap(states)


async def test_clean_stop_hands_the_vehicle_over_in_under_a_second(
        provisioned: Client, nats_server: NatsServer, tmp_path: Path) -> None:
    async with SimFleet(SimConfig(vehicles=1, base_port=0, speedup=5.0)) as fleet:
        a, _ = _gateway(nats_server.url, fleet, tmp_path / "a", "gw-a")
        b, _ = _gateway(nats_server.url, fleet, tmp_path / "b", "gw-b")
        async with state_times(provisioned, ENV, VID) as states, running(b):
            async with running(a):
                await wait_for(lambda: _owner(a) or _owner(b), timeout_s=10)
                if _owner(b):  # b started first and won: the test stops whoever owns
                    a, b = b, a
                await wait_for(lambda: sees_owner(b, a, VID), timeout_s=10)
                await anyio.sleep(2.0)  # steady state published by the owner
                stopped = time.monotonic()
                a.request_stop("rolling update")
                released = taken = None
                with anyio.fail_after(10):
                    while taken is None:
                        now = time.monotonic()
                        if released is None and not _owner(a):
                            released = now
                        if _owner(b):
                            taken = now
                        await anyio.sleep(0.005)
                assert released is not None
                handover_s = taken - released
                assert handover_s < 1.0, handover_s
            await anyio.sleep(2.0)
        assert max_gap(states, stopped - 1.0, taken + 2.0) < 1.0, max_gap(states, stopped - 1.0, taken + 2.0)
        events = await collect_events(provisioned)
        released_ev = [d for _, t, d, _ in events if t == EventType.OWNER_RELEASED]
        # a stepped down, then b (at the end of the test): each while it owned the vehicle
        assert [d["holder"] for d in released_ev] == [_holder(a), _holder(b)]
        stopped_ev = [d["gateway"] for _, t, d, _ in events if t == EventType.GATEWAY_STOPPED]
        assert stopped_ev == [_holder(a).split("@")[0], _holder(b).split("@")[0]], "only an owner reports its stop"
