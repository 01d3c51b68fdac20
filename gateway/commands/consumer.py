"""The gateway's command intake: lanes per vehicle, fed by TWIN_CMD consumers.

`CommandService` is a gateway service (`mavjet.gateway.services.GatewayService`): it opens the
ledger, and runs one `VehicleLane` per vehicle (one command at a time, in
order, its own task: a vehicle that is slow to answer never holds up
another) and the intake(s) that pull the commands: one consumer for the
whole gateway, or one per vehicle (`[commands] consumer`,
`gateway/commands/intake.py`).
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import socket

import anyio
import structlog
from anyio.abc import TaskStatus
from nats.js.api import ConsumerConfig

from mavjet.contract.subjects import command_consumer
from mavjet.gateway.commands.executor import CommandExecutor, keepalive_interval_s
from mavjet.gateway.commands.intake import API_CONCURRENCY, Intake, gateway_intakes
from mavjet.gateway.commands.intake import consumer_config as intake_config
from mavjet.gateway.commands.keepalive import KeepAlives
from mavjet.gateway.commands.lane import VehicleLane
from mavjet.gateway.commands.ledger import CommandLedger, Ledger
from mavjet.gateway.commands.shared import SharedLedger
from mavjet.gateway.config import CommandsConfig, ConsumerMode, GatewayConfig
from mavjet.gateway.services import ServiceContext

log = structlog.get_logger("mavjet.commands")

LEDGER_FILE = "commands.sqlite"
PRUNE_INTERVAL_S = 600.0
MAX_NAME = 120  # of the holder part of a gateway consumer's name


def durable_name(vid: str) -> str:
    return command_consumer(vid)


def consumer_config(env: str, vid: str, cfg: CommandsConfig) -> ConsumerConfig:
    """A vehicle's own consumer `gw_<vid>` (`consumer = "vehicle"`)."""
    return intake_config(durable_name(vid), env, frozenset([vid]), cfg, max_ack_pending=1, inactive_s=None)


def mode_for(cfg: GatewayConfig) -> ConsumerMode:
    mode = cfg.commands.consumer
    if mode is ConsumerMode.AUTO:
        return ConsumerMode.VEHICLE if len(cfg.vehicles) == 1 else ConsumerMode.GATEWAY
    return mode


def gateway_consumer_name(ctx: ServiceContext) -> str:
    """`gwx_<holder>`: unique per process, as the lease holder is (two gateways on one host differ)."""
    holder = ctx.holder or f"{ctx.cfg.instance}@{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
    name = re.sub(r"[^A-Za-z0-9_-]", "_", holder)
    if len(name) > MAX_NAME:  # a long instance or host name: cut it, and keep it unique by a digest of the whole
        name = f"{name[:MAX_NAME - 13]}_{hashlib.sha256(holder.encode()).hexdigest()[:12]}"
    return "gwx_" + name  # `_<i>` follows: one per 500 vehicles


class CommandService:
    """Gateway service: the lanes of every vehicle and the intakes that feed them (see module docstring)."""

    def __init__(self) -> None:
        self.lanes: dict[str, VehicleLane] = {}
        self.intakes: list[Intake] = []
        self.mode: ConsumerMode | None = None
        self.ledger: Ledger | None = None
        self.shared: SharedLedger | None = None
        self.started = anyio.Event()

    async def run(self, ctx: ServiceContext, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        cfg: GatewayConfig = ctx.cfg
        ledger = Ledger(cfg.state_dir / LEDGER_FILE, retention_s=cfg.commands.ledger_retention_s)
        self.ledger = ledger
        try:
            await ledger.open()  # off the event loop: opening prunes and indexes the file
            keepalives = KeepAlives(keepalive_interval_s(cfg.commands))
            used: CommandLedger = ledger
            shared: SharedLedger | None = None
            if ctx.leases is not None:  # ownership: the rows also where the vehicle's next owner reads them
                used = shared = SharedLedger(ledger, ctx.leases, env=cfg.env, holder=ctx.holder,
                                             token=ctx.ownership.token)
            self.shared = shared
            for vehicle in ctx.vehicles.values():
                executor = CommandExecutor(vehicle, used, nats=ctx.nats, metrics=ctx.metrics, cfg=cfg.commands,
                                           env=cfg.env, foreground=ctx.foreground)
                self.lanes[vehicle.vid] = VehicleLane(vehicle, executor, keepalives,
                                                      max_queued=cfg.commands.max_queued_per_vehicle)
            self.intakes = self._intakes(ctx)
            async with anyio.create_task_group() as tg:
                if shared is not None:
                    tg.start_soon(shared.run, name="gateway.commands.shared_outcomes")
                tg.start_soon(keepalives.run, name="gateway.commands.in_progress")
                for vid, lane in self.lanes.items():
                    tg.start_soon(lane.run, name=f"vehicle[{vid}].commands")
                for intake in self.intakes:
                    tg.start_soon(intake.run, name=f"gateway.commands.intake[{intake.name}]")
                tg.start_soon(self._prune, ledger, name="gateway.commands.ledger_prune")
                self.started.set()
                task_status.started()
        finally:
            if self.shared is not None:
                self.shared.close()
            ledger.close()

    def _intakes(self, ctx: ServiceContext) -> list[Intake]:
        api = anyio.CapacityLimiter(API_CONCURRENCY)
        self.mode = mode_for(ctx.cfg)
        if self.mode is ConsumerMode.VEHICLE:
            return [Intake(ctx, self.lanes, name=durable_name(vid), vids=(vid,), max_ack_pending=1, inactive_s=None,
                           api=api) for vid in self.lanes]
        return gateway_intakes(ctx, self.lanes, base_name=gateway_consumer_name(ctx), api=api,
                               max_ack_pending=ctx.cfg.commands.max_ack_pending)

    async def drain(self) -> None:
        """Take no new command; return once none is in hand (a stop with ownership: gateway/daemon.py)."""
        for intake in self.intakes:
            intake.stop_pulling()
        for lane in self.lanes.values():
            lane.draining = True
            lane.kick()
        for lane in self.lanes.values():
            await lane.idle.wait()
        for intake in self.intakes:
            await intake.close()

    async def _prune(self, ledger: Ledger) -> None:
        while True:
            await anyio.sleep(PRUNE_INTERVAL_S)
            pruned = await ledger.prune()
            if pruned:
                log.info("command_ledger_pruned", entries=pruned)
