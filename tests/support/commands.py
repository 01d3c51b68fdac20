"""The command tests' rig: real nats-server + real simulated vehicles over TCP + an in-process gateway running CommandService."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.api import ConsumerInfo

from mavjet.contract import envelope
from mavjet.contract.subjects import cmd_filter, event_filter
from mavjet.gateway.commands.consumer import CommandService
from mavjet.gateway.config import CommandsConfig
from mavjet.gateway.daemon import Gateway
from mavjet.ops.client import CommandClient, Result
from mavjet.sim.fleet import SimConfig, SimFleet
from mavjet.sim.vehicle import SimVehicle
from tests.support.gateway import ENV, collect_events, gateway_config, running
from tests.support.wait import WaitTimeout, wait_for, wait_for_async

# Fast but realistic: short ACK timeout, quick redelivery, no BackOff list unless a test wants one.
TEST_COMMANDS = CommandsConfig(
    ack_wait_s=5.0, max_deliver=6, backoff_s=(), ack_timeout_s=0.5, retries=2, in_progress_timeout_s=10.0,
    in_progress_interval_s=1.0, nak_delay_s=0.3, fetch_timeout_s=1.0,
)


@dataclass
class Rig:
    fleet: SimFleet
    gw: Gateway
    service: CommandService
    client: CommandClient
    nc: Client

    def vehicle(self, vid: str) -> SimVehicle:
        return self.fleet.vehicles[int(vid.rsplit("-", 1)[1]) - 1]

    async def call(self, vid: str, name: str, params: dict[str, Any] | None = None, *, timeout_s: float = 30.0,
                   deadline_s: float | None = None) -> Result:
        return await self.client.call(vid, name, params, timeout_s=timeout_s, deadline_s=deadline_s)

    def executions(self, vid: str, command: int) -> int:
        """How many times the vehicle acted on `command` (answers forced by `reject_next` excluded)."""
        return sum(1 for e in self.vehicle(vid).executions if e.command == command and e.executed)

    def forced(self, vid: str, command: int) -> list[int]:
        """The MAV_RESULTs the vehicle answered `command` with under `reject_next`, in order."""
        return [e.result for e in self.vehicle(vid).executions if e.command == command and not e.executed]

    async def link_known(self, vid: str, timeout_s: float = 20.0) -> None:
        """The gateway's link is up and the vehicle's state known: a command is executed, not nak'd."""
        twin = self.gw.twins[vid]
        await wait_for(lambda: twin.link.is_up and twin.model.armed is not None, timeout_s=timeout_s)

    async def armed_in_guided(self, vid: str, timeout_s: float = 10.0) -> None:
        """Pre-arm checks passed, GUIDED set and the vehicle armed, as the gateway's twin sees it."""
        await ready_to_fly(self.fleet)
        for name, params in (("set_mode", {"mode": "GUIDED"}), ("arm", {})):
            assert (await self.call(vid, name, params)).accepted
        await wait_for(lambda: self.gw.twins[vid].model.armed is True, timeout_s=timeout_s)


async def ready_to_fly(fleet: SimFleet, timeout_s: float = 20.0) -> None:
    """Every vehicle has a 3D fix and a settled EKF (pre-arm checks pass)."""
    await wait_for(lambda: all(v.position_ok for v in fleet.vehicles), timeout_s=timeout_s)


@asynccontextmanager
async def command_rig(
    nc: Client,
    url: str,
    state_dir: Path,
    *,
    vehicles: int = 1,
    commands: CommandsConfig = TEST_COMMANDS,
    sim: SimConfig | None = None,
    configure: Callable[[Gateway], None] | None = None,
) -> AsyncIterator[Rig]:
    sim_cfg = sim or SimConfig(vehicles=vehicles, base_port=0, speedup=5.0)
    async with SimFleet(sim_cfg) as fleet:
        cfg = gateway_config(url, fleet.endpoints, state_dir, commands=commands)
        service = CommandService()
        gw = Gateway(cfg)
        gw.services.append(service)
        if configure is not None:
            configure(gw)
        async with running(gw), CommandClient(nc, ENV, issuer="pytest") as client:
            await wait_for(lambda: len(service.lanes) == len(fleet.vehicles) and
                           all(loop.binds for loop in service.lanes.values()), timeout_s=20)
            yield Rig(fleet=fleet, gw=gw, service=service, client=client, nc=nc)


@asynccontextmanager
async def published_results(nc: Client, vid: str = "*") -> AsyncIterator[list[dict[str, Any]]]:
    """Every cmd_result *published* while open (a core subscription: it sees copies the stream would deduplicate)."""
    seen: list[dict[str, Any]] = []

    async def on_msg(msg: Msg) -> None:
        seen.append(envelope.unpack(msg.data).data)

    sub = await nc.subscribe(event_filter(ENV, vid, "cmd_result"), cb=on_msg)
    await nc.flush()
    try:
        yield seen
    finally:
        await sub.unsubscribe()


async def consumer_idle(nc: Client, vid: str, timeout_s: float = 15.0) -> ConsumerInfo:
    """Wait until the consumer carrying the vehicle's commands holds nothing: none pending, none awaiting an ack."""
    js = nc.jetstream()
    seen: list[ConsumerInfo] = []
    mine = cmd_filter(ENV, vid)

    async def idle() -> ConsumerInfo | None:
        carrying = [c for c in await js.consumers_info("TWIN_CMD")
                    if mine in (c.config.filter_subjects or [c.config.filter_subject or ""])]
        if not carrying:
            return None
        info = carrying[0]
        seen.append(info)
        return info if not info.num_pending and not info.num_ack_pending else None

    try:
        info: ConsumerInfo = await wait_for_async(idle, timeout_s, 0.1, what=f"{vid}'s consumer idle")
    except WaitTimeout:
        raise WaitTimeout(f"{vid}'s consumer still busy: {seen[-1] if seen else None}") from None
    return info


async def dispositions_settled(rig: Rig, vid: str, total: int, timeout_s: float = 5.0) -> dict[str, int]:
    """The vehicle's dispositions once `total` deliveries are counted.

    The server sees a delivery's ack (so the consumer reads idle) a moment before the
    executor's `handle` returns and the loop counts it: read the count only when it is whole.
    """
    loop = rig.service.lanes[vid]
    await wait_for(lambda: sum(loop.dispositions.values()) >= total, timeout_s, 0.02,
                   what=f"{total} dispositions for {vid}")
    return dict(loop.dispositions)


async def cmd_results(nc: Client, vid: str = "*") -> list[dict[str, Any]]:
    """Every cmd_result stored in TWIN_EVENTS (with the msg id under `_msg_id`)."""
    events = await collect_events(nc, f"fleet.{ENV}.veh.{vid}.evt.cmd_result")
    return [{**d, "_vid": v, "_msg_id": mid} for v, _t, d, mid in events]


__all__ = [
    "ENV", "TEST_COMMANDS", "Rig", "cmd_results", "command_rig", "consumer_idle", "dispositions_settled", "published_results", "ready_to_fly",
]
