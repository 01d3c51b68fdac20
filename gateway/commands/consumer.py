"""The gateway's command intake: one durable pull consumer per vehicle on TWIN_CMD.

`CommandService` is a gateway service (`mavjet.gateway.services.GatewayService`): it opens the
ledger, waits for NATS, and runs one `VehicleCommands` loop per vehicle in
its own task, so a vehicle that is slow to answer never holds up another.

Each loop owns the durable consumer `gw_<vid>` (filter
`fleet.<env>.veh.<vid>.cmd.>`), created or updated from `[commands]`
(AckWait, MaxDeliver, BackOff) and with MaxAckPending 1: the server hands
out the next command only when the previous one is finished, so commands of
one vehicle run in order, one at a time, and a command waiting for a
redelivery (nak with delay) is not overtaken by a later one.

nats-py pull subscriptions can go stale across a server restart (the fetch
request goes nowhere and every fetch just times out). The loop therefore
re-binds after every reconnect, and every `STALE_CHECK_S` of idle requests,
or at once after a request the server never ended (`gateway/commands/pull.py`
waits for the server's end of each request instead of timing out locally),
it asks the server for the consumer: missing → re-created; messages pending
but none delivered → the subscription is stale, re-bound.

Those JetStream API calls (consumer info, create, bind) go through one
limiter for the whole fleet (`API_CONCURRENCY` at a time). A thousand
vehicles starting at once would otherwise send a thousand creates while the
server is busy storing their first state; the creates time out, are
retried, and the retries add to the server's queue (seen at 1,000 vehicles:
create timeouts in the log, 519 and 612 of 1,000 consumers after 200 s).
With the limit no create times out; registration can still be slow on such
a server (docs/benchmarks.md, Commands under load).
"""

from __future__ import annotations

import random
import time
from typing import Any

import anyio
import structlog
from anyio.abc import TaskStatus
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, ConsumerInfo, DeliverPolicy
from nats.js.errors import NotFoundError

from mavjet.contract.subjects import CMD_STREAM, cmd_filter, command_consumer
from mavjet.drivers.mavlink.backoff import Backoff
from mavjet.gateway.commands.executor import CommandExecutor, keepalive_interval_s
from mavjet.gateway.commands.keepalive import KeepAlives
from mavjet.gateway.commands.ledger import CommandLedger, Ledger
from mavjet.gateway.commands.pull import PullOne
from mavjet.gateway.commands.shared import SharedLedger
from mavjet.gateway.config import CommandsConfig, GatewayConfig
from mavjet.gateway.services import ServiceContext, VehicleHandle

log = structlog.get_logger("mavjet.commands")

LEDGER_FILE = "commands.sqlite"
PRUNE_INTERVAL_S = 600.0
API_CONCURRENCY = 8  # JetStream API calls of the command loops in flight at once, fleet-wide
# How often an idle loop asks the server about its consumer. A backstop: a reconnect re-binds at once, and a
# command that waits on a stale subscription ends `expired` at its deadline, never late. At every fetch
# timeout (5 s) it was 200 requests a second at 1,000 vehicles, competing with the creates of a fleet's start.
STALE_CHECK_S = 30.0


def durable_name(vid: str) -> str:
    return command_consumer(vid)


def consumer_config(env: str, vid: str, cfg: CommandsConfig) -> ConsumerConfig:
    name = durable_name(vid)
    return ConsumerConfig(
        name=name,
        durable_name=name,
        description=f"mavjet gateway commands for {vid}",
        filter_subject=cmd_filter(env, vid),
        deliver_policy=DeliverPolicy.ALL,
        ack_policy=AckPolicy.EXPLICIT,
        ack_wait=cfg.ack_wait_s,
        max_deliver=cfg.max_deliver,
        backoff=list(cfg.backoff_s) or None,
        max_ack_pending=1,
    )


def _drifted(have: ConsumerConfig, want: ConsumerConfig) -> list[str]:
    out = []
    if have.filter_subject != want.filter_subject:
        out.append("filter_subject")
    if have.max_deliver != want.max_deliver:
        out.append("max_deliver")
    if have.max_ack_pending != want.max_ack_pending:
        out.append("max_ack_pending")
    if [round(b, 3) for b in (have.backoff or [])] != [round(b, 3) for b in (want.backoff or [])]:
        out.append("backoff")
    if not want.backoff and round(have.ack_wait or 0, 3) != round(want.ack_wait or 0, 3):
        out.append("ack_wait")
    return out


async def ensure_consumer(js: JetStreamContext, env: str, vid: str, cfg: CommandsConfig) -> ConsumerInfo:
    """Create the vehicle's consumer if missing, update it if its settings drifted from config."""
    want = consumer_config(env, vid, cfg)
    info: ConsumerInfo | None
    try:
        info = await js.consumer_info(CMD_STREAM, durable_name(vid))
    except NotFoundError:
        info = None
    if info is not None:
        drift = _drifted(info.config, want)
        if not drift:
            return info
        log.info("command_consumer_update", vehicle=vid, fields=drift)
    else:
        log.info("command_consumer_create", vehicle=vid, consumer=want.durable_name)
    created: ConsumerInfo = await js.add_consumer(CMD_STREAM, config=want)
    return created


class _Rebind(Exception):
    """The pull subscription must be bound again (reconnect, missing or stale consumer)."""


class VehicleCommands:
    """One vehicle's command loop: fetch(1), execute, ack; forever, surviving NATS outages."""

    def __init__(self, vehicle: VehicleHandle, ledger: CommandLedger, ctx: ServiceContext, keepalives: KeepAlives, *,
                 api_limiter: anyio.CapacityLimiter | None = None) -> None:
        self.vid = vehicle.vid
        self.api = api_limiter or anyio.CapacityLimiter(API_CONCURRENCY)
        self.ctx = ctx
        self.cfg = ctx.cfg
        self.executor = CommandExecutor(
            vehicle, ledger, nats=ctx.nats, metrics=ctx.metrics, cfg=ctx.cfg.commands, env=ctx.cfg.env,
            keepalives=keepalives, foreground=ctx.foreground,
        )
        self.binds = 0
        self.idle = anyio.Event()  # set while no delivery is in hand (`CommandService.drain` waits for it)
        self.idle.set()
        self.draining = False  # take nothing new (a stop handing the vehicle over)
        self.stale_rebinds = 0
        self.dispositions: dict[str, int] = {}

    async def run(self) -> None:
        backoff = Backoff(initial_s=0.2, max_s=5.0)
        ownership = self.ctx.ownership
        while True:
            sub: Any = None
            # Only the owner pulls: a standby waits here, its link open, until it owns the vehicle.
            await ownership.wait_until(self.vid, owner=True)
            if self.draining:
                await anyio.sleep_forever()
            try:
                nc, js = await self.ctx.jetstream()
                async with self.api:
                    await ensure_consumer(js, self.cfg.env, self.vid, self.cfg.commands)
                    sub = await js.pull_subscribe_bind(durable=durable_name(self.vid), stream=CMD_STREAM)
                self.binds += 1
                backoff.reset()
                await self._pull(nc, js, sub)
            except _Rebind as exc:
                log.info("command_consumer_rebind", vehicle=self.vid, reason=str(exc))
            except Exception as exc:  # nats-py raises a wide range; the loop must outlive all of it
                delay = backoff.next_delay_s()
                log.warning("command_consumer_error", vehicle=self.vid, error=f"{type(exc).__name__}: {exc}",
                            retry_in_s=round(delay, 2))
                await anyio.sleep(delay)
            finally:
                if sub is not None:
                    with anyio.CancelScope(shield=True), anyio.move_on_after(1.0):
                        try:
                            await sub.unsubscribe()
                        except Exception:  # the connection may be gone; nothing to clean up then
                            pass

    async def _pull(self, nc: Client, js: JetStreamContext, sub: Any) -> None:
        reconnects = nc.stats["reconnects"]
        timeout = self.cfg.commands.fetch_timeout_s
        # The first check at a random point of the period, so a fleet that bound together does not ask together.
        next_check = time.monotonic() + random.uniform(0.5, 1.0) * max(timeout, STALE_CHECK_S)
        pull = PullOne(sub)
        may_act = self.ctx.ownership.may_act
        while True:
            if not may_act(self.vid):
                # Unsubscribed on the way out, so the server drops this gateway's waiting pull requests.
                raise _Rebind("not the vehicle's owner any more: pulling stops")
            if nc.stats["reconnects"] != reconnects:
                raise _Rebind("NATS reconnected")
            if not nc.is_connected:
                await anyio.sleep(0.1)
                continue
            if self.draining:
                raise _Rebind("stopping: no new commands")
            msg = await pull.next(timeout)
            if msg is not None and self.draining:
                done = await self.executor.hand_back(msg, "the gateway is stopping")
                self.dispositions[done] = self.dispositions.get(done, 0) + 1
                continue
            if msg is None:
                # A request the server never ended is a sign of a stale subscription: check at once.
                if not pull.answered or time.monotonic() >= next_check:
                    next_check = time.monotonic() + max(timeout, STALE_CHECK_S)
                    await self._check_stale(js)
                continue
            self.idle = anyio.Event()
            try:
                done = await self.executor.handle(msg)
            finally:
                self.idle.set()
            self.dispositions[done] = self.dispositions.get(done, 0) + 1

    async def _check_stale(self, js: JetStreamContext) -> None:
        try:
            async with self.api:
                info = await js.consumer_info(CMD_STREAM, durable_name(self.vid),
                                              timeout=self.cfg.commands.fetch_timeout_s)
        except NotFoundError:
            raise _Rebind("consumer missing (server lost it): re-creating") from None
        if (info.num_pending or 0) > 0 and not info.num_ack_pending and not info.num_waiting:
            self.stale_rebinds += 1
            raise _Rebind(f"stale pull subscription: {info.num_pending} commands pending, none delivered")


class CommandService:
    """Gateway service: runs the command loops of every vehicle (see module docstring)."""

    def __init__(self) -> None:
        self.loops: dict[str, VehicleCommands] = {}
        self.ledger: Ledger | None = None
        self.shared: SharedLedger | None = None
        self.started = anyio.Event()

    async def run(self, ctx: ServiceContext, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        cfg: GatewayConfig = ctx.cfg
        ledger = Ledger(cfg.state_dir / LEDGER_FILE, retention_s=cfg.commands.ledger_retention_s)
        self.ledger = ledger
        try:
            await ledger.open()  # off the event loop: opening prunes and indexes the file
            api = anyio.CapacityLimiter(API_CONCURRENCY)
            keepalives = KeepAlives(keepalive_interval_s(cfg.commands))
            used: CommandLedger = ledger
            shared: SharedLedger | None = None
            if ctx.leases is not None:  # ownership: the rows also where the vehicle's next owner reads them
                used = shared = SharedLedger(ledger, ctx.leases, env=cfg.env, holder=ctx.holder,
                                             token=ctx.ownership.token)
            self.shared = shared
            for vehicle in ctx.vehicles.values():
                self.loops[vehicle.vid] = VehicleCommands(vehicle, used, ctx, keepalives, api_limiter=api)
            async with anyio.create_task_group() as tg:
                if shared is not None:
                    tg.start_soon(shared.run, name="gateway.commands.shared_outcomes")
                tg.start_soon(keepalives.run, name="gateway.commands.in_progress")
                for vid, loop in self.loops.items():
                    tg.start_soon(loop.run, name=f"vehicle[{vid}].commands")
                tg.start_soon(self._prune, ledger, name="gateway.commands.ledger_prune")
                self.started.set()
                task_status.started()
        finally:
            if self.shared is not None:
                self.shared.close()
            ledger.close()

    async def drain(self) -> None:
        """Take no new command; return once none is in hand (a stop with ownership: gateway/daemon.py)."""
        for loop in self.loops.values():
            loop.draining = True
        for loop in self.loops.values():
            await loop.idle.wait()

    async def _prune(self, ledger: Ledger) -> None:
        while True:
            await anyio.sleep(PRUNE_INTERVAL_S)
            pruned = await ledger.prune()
            if pruned:
                log.info("command_ledger_pruned", entries=pruned)
