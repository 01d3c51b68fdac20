"""Helpers for the ownership tests: keepers on their own connections, an overlap watcher, a freezable relay,
and for whole gateways (tests/ownership, tests/sitl): one with a command service, its crash, a state recorder."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
from nats.aio.client import Client
from nats.aio.msg import Msg

from mavjet.contract.natsconn import open_client
from mavjet.gateway.commands.consumer import CommandService
from mavjet.gateway.config import CommandsConfig
from mavjet.gateway.daemon import Gateway as GatewayProcess
from mavjet.gateway.ownership.keeper import GatewayIdentity, LeaseKeeper
from mavjet.gateway.ownership.lease import LeaseTiming, OwnershipChange
from mavjet.gateway.ownership.store import JetStreamLeaseStore
from mavjet.ops.natsserver import free_port
from mavjet.ops.provision import DEFINITIONS_DIR, load_definitions, provision
from tests.support.gateway import gateway_config

ENV = "test"


async def provision_leases(nc: Client, *, replicas: int = 1) -> None:
    """Only the lease bucket (the other resources are not what these tests are about)."""
    defs = [d for d in load_definitions(DEFINITIONS_DIR, env=ENV, replicas=replicas) if d.name == "TWIN_LEASES"]
    assert len(defs) == 1
    await provision(nc.jetstream(), defs)


@dataclass
class Heard:
    """An `OwnershipListener` that keeps every change."""

    changes: list[OwnershipChange] = field(default_factory=list)

    def ownership_changed(self, change: OwnershipChange) -> None:
        self.changes.append(change)


@dataclass
class Gateway:
    """One keeper with its own NATS connection, as one gateway process has."""

    name: str
    nc: Client
    keeper: LeaseKeeper
    heard: Heard
    scope: anyio.CancelScope | None = None


@asynccontextmanager
async def gateway(servers: str | list[str], name: str, vids: list[str], *,
                  timing: LeaseTiming | None = None, **connect: object) -> AsyncIterator[Gateway]:
    nc = await open_client(servers, connect_timeout=2, **connect)  # type: ignore[arg-type]
    heard = Heard()
    keeper = LeaseKeeper(JetStreamLeaseStore(nc.jetstream), env=ENV, vids=vids,
                         identity=GatewayIdentity.of_this_process(name), timing=timing, listener=heard)
    try:
        yield Gateway(name=name, nc=nc, keeper=keeper, heard=heard)
    finally:
        await nc.close()


async def start(tg: anyio.abc.TaskGroup, gw: Gateway) -> None:
    """Run `gw`'s keeper in `tg` under its own cancel scope (cancelling it is a crash: no release)."""
    scope = anyio.CancelScope()
    gw.scope = scope

    async def run(*, task_status: anyio.abc.TaskStatus[None]) -> None:
        with scope:
            await gw.keeper.run(task_status=task_status)

    await tg.start(run, name=f"keeper {gw.name}")


async def owner_then_standby(tg: anyio.abc.TaskGroup, owner: Gateway, standby: Gateway, vid: str, *,
                             owns_within_s: float) -> Overlap:
    """Start `owner` and wait until it may act for `vid`, then `standby` and a watch of both."""
    await start(tg, owner)
    with anyio.fail_after(owns_within_s):
        await owner.keeper.wait_until(vid, owner=True)
    await start(tg, standby)
    watch = Overlap([owner, standby], vid)
    await tg.start(watch.run)
    return watch


@dataclass
class Overlap:
    """Samples every gateway's `may_act(vid)` every 10 ms: who acted when, and whether two ever did at once."""

    gateways: list[Gateway]
    vid: str
    both: list[float] = field(default_factory=list)
    acting: dict[str, list[float]] = field(default_factory=dict)

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
                  limit_s: float = 120.0) -> None:
        task_status.started()
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            now = time.monotonic()
            owners = [g.name for g in self.gateways if g.keeper.may_act(self.vid)]
            for name in owners:
                self.acting.setdefault(name, []).append(now)
            if len(owners) > 1:
                self.both.append(now)
            await anyio.sleep(0.01)

    def last_acting(self, name: str) -> float | None:
        times = self.acting.get(name)
        return times[-1] if times else None

    def first_acting_after(self, name: str, after: float) -> float | None:
        return next((t for t in self.acting.get(name, []) if t > after), None)


class FreezingRelay:
    """A TCP relay to nats-server that can go silent without closing anything: a partition.

    Frozen, it forwards nothing either way and keeps the sockets open, so the
    client sees no error at all (nats-py only notices after its pings go
    unanswered, minutes by default): exactly what the lease's fence is for.
    """

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = free_port()
        self.frozen = False
        self.server: asyncio.Server | None = None
        self.writers: list[asyncio.StreamWriter] = []

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
        for w in self.writers:
            w.transport.abort()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_r, up_w = await asyncio.open_connection("127.0.0.1", self.target_port)
        self.writers += [writer, up_w]
        await asyncio.gather(self._pump(reader, up_w), self._pump(up_r, writer), return_exceptions=True)

    async def _pump(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        try:
            while data := await src.read(65536):
                if self.frozen:
                    continue  # swallowed: neither end hears of it
                dst.write(data)
                await dst.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            dst.transport.abort()


# -- whole gateways ------------------------------------------------------------------------------


def command_gateway(url: str, endpoints: list[str], state_dir: Path, instance: str, *,
                    commands: CommandsConfig, **config: Any) -> tuple[GatewayProcess, CommandService]:
    """A gateway (ownership on, as by default) named `instance`, with its command service to look into."""
    cfg = dataclasses.replace(gateway_config(url, endpoints, state_dir, commands=commands, **config), instance=instance)
    gw = GatewayProcess(cfg)
    svc = CommandService()
    gw.services.append(svc)
    return gw, svc


def owns(gw: GatewayProcess, vid: str) -> bool:
    return gw.ownership is not None and gw.ownership.keeper.may_act(vid)


def holder_of(gw: GatewayProcess) -> str:
    assert gw.ownership is not None
    return gw.ownership.holder


def sees_owner(standby: GatewayProcess, owner: GatewayProcess, vid: str) -> bool:
    """Whether `standby` knows `owner` holds `vid`'s lease."""
    return (standby.ownership is not None and owner.ownership is not None
            and standby.ownership.keeper.holder(vid) == owner.ownership.holder)


class Crashable:
    """Runs a gateway that the test can crash: its tasks cancelled, no release, its lease left to go stale.

    As for a SIGKILLed process, whose sockets the kernel closes: `crash()` also closes its NATS client.
    """

    def __init__(self, gw: GatewayProcess) -> None:
        self.gw = gw
        self.scope = anyio.CancelScope()
        self.crashed_at: float | None = None

    async def run(self) -> None:
        with self.scope:
            await self.gw.run()

    async def crash(self) -> float:
        self.scope.cancel()
        self.crashed_at = time.monotonic()
        if self.gw.publisher.nc is not None:
            await self.gw.publisher.nc.close()
        return self.crashed_at


@asynccontextmanager
async def state_times(nc: Client, env: str, vid: str) -> AsyncIterator[list[float]]:
    """When each state sample of `vid` arrived (monotonic), for the gap across a takeover or handover."""
    times: list[float] = []

    async def on_state(_msg: Msg) -> None:
        times.append(time.monotonic())

    sub = await nc.subscribe(f"fleet.{env}.veh.{vid}.state.>", cb=on_state)
    try:
        yield times
    finally:
        await sub.unsubscribe()


def max_gap(times: list[float], start: float = float("-inf"), end: float = float("inf")) -> float:
    """The longest time between two samples within [start, end] (inf: fewer than two)."""
    window = [t for t in times if start <= t <= end]
    return max((b - a for a, b in itertools.pairwise(window)), default=float("inf"))
