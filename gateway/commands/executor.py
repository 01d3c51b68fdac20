"""One command message, from delivery to ack/nak/term and its single `cmd_result`.

The lifecycle, in this order (docs/commands.md):

1. oversize, bad msgpack, unknown name, bad params → `term`, `invalid`;
2. id already in the ledger → `ack`, nothing sent to the vehicle (its result
   is re-spooled only if a crash lost it, with the same msg id);
3. past its deadline → `term`, `expired`;
4. link down or vehicle state unknown → `nak(delay)` (redelivered later);
5. preconditions against the live model → `term`, `rejected` with the reason;
6. run its action (COMMAND_LONG/INT, parameter or mission protocol) while
   `in_progress` acks keep the message; ACCEPTED → ledger, result, `ack_sync`;
   TEMPORARILY_REJECTED or the link dropped → `nak(delay)` without a result;
   DENIED/UNSUPPORTED → `term`, `rejected`; FAILED → `term`, `failed`;
   no ACK → `term`, `timeout`. At MaxDeliver a retry becomes final
   (`failed` or `timeout`) so the command still ends in one result.

What each command checks and does is in `spec.COMMANDS`; this module has no
per-command branches.

Every final outcome goes to the ledger before the message is acked or
terminated, and its `cmd_result` has the deterministic Nats-Msg-Id
`<vid>:cmd_result:<cmd_id>`: whatever is redelivered, the audit trail holds
one result per command.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable
from enum import StrEnum

import anyio
import structlog
from nats.aio.msg import Msg

from gateway.commands.actions import ActionContext, Outcome, run_action
from gateway.commands.ledger import Ledger, LedgerEntry
from gateway.commands.spec import CommandDef, decode
from gateway.config import CommandConfig
from gateway.contract import envelope
from gateway.contract.commands import (
    CATALOGUE,
    CmdResult,
    Command,
    CommandInvalid,
    result_data,
)
from gateway.contract.subjects import event_subject
from gateway.metrics import GatewayMetrics
from gateway.services import NatsAccess, VehicleHandle
from gateway.telemetry import Event

log = structlog.get_logger("mavjet.commands")

# Results after which the vehicle may have acted: their ledger entry must survive power loss.
_REACHED_VEHICLE = frozenset({CmdResult.ACCEPTED, CmdResult.FAILED, CmdResult.TIMEOUT})


class Disposition(StrEnum):
    """What the executor did with one delivery (counted per vehicle in `VehicleCommands.dispositions`)."""

    ACK = "ack"  # finished, accepted: acked (double ack)
    NAK = "nak"  # not finished (link down, temporarily rejected): redelivered after nak_delay_s
    TERM = "term"  # finished, not accepted: terminated, never redelivered
    DUPLICATE = "duplicate"  # already in the ledger: acked without executing again


def keepalive_interval_s(cfg: CommandConfig) -> float:
    """How often to send `in_progress` while a command runs.

    With a BackOff list the server's ack timer for a delivery is a BackOff
    entry, not AckWait, so the interval must stay well inside the shortest.
    """
    shortest = min((cfg.ack_wait_s, *cfg.backoff_s))
    return max(0.05, min(cfg.in_progress_interval_s, shortest / 3.0))


class CommandExecutor:
    """Executes the commands of one vehicle, one message at a time."""

    def __init__(
        self,
        vehicle: VehicleHandle,
        ledger: Ledger,
        *,
        nats: NatsAccess,
        metrics: GatewayMetrics,
        cfg: CommandConfig,
        env: str,
    ) -> None:
        self.vehicle = vehicle
        self.vid = vehicle.vid
        self.ledger = ledger
        self.nats = nats
        self.metrics = metrics
        self.cfg = cfg
        self.env = env
        self.keepalive_s = keepalive_interval_s(cfg)
        self.result_subject = event_subject(env, vehicle.vid, "cmd_result")
        self.handled = 0
        self.duplicates = 0

    # -- entry point -------------------------------------------------------
    async def handle(self, msg: Msg) -> Disposition:
        """Process one delivery; returns what was done with it."""
        self.handled += 1
        name = msg.subject.split(".", 5)[-1] if msg.subject.count(".") >= 5 else msg.subject
        md = msg.metadata
        delivered = int(md.num_delivered or 1)
        headers = msg.headers or {}
        fallback_id = headers.get("Nats-Msg-Id") or f"{self.vid}:seq:{md.sequence.stream if md.sequence else 0}"
        try:
            cmd, defn = decode(name, msg.data, self.vehicle.telemetry.modes,
                               max_payload_bytes=self.cfg.max_payload_bytes, fallback_id=fallback_id)
        except CommandInvalid as exc:
            if exc.__cause__ is not None:
                log.error("command_decode_bug", vehicle=self.vid, cmd_id=exc.cmd_id, reason=exc.reason,
                          exc_info=exc.__cause__)
            cmd_id = exc.cmd_id or fallback_id
            if await self._already_done(msg, cmd_id):
                return Disposition.DUPLICATE
            await self._final(msg, Outcome(result=CmdResult.INVALID, detail=exc.reason), cmd_id=cmd_id, name=name,
                              issued_ns=None, delivered=delivered)
            return Disposition.TERM

        if await self._already_done(msg, cmd.cmd_id):
            return Disposition.DUPLICATE
        if cmd.expired(time.time_ns()):
            late_ms = (time.time_ns() - (cmd.deadline_ns or 0)) / 1e6
            out = Outcome(result=CmdResult.EXPIRED, detail=f"deadline passed {late_ms:.0f} ms before execution")
            await self._final(msg, out, cmd_id=cmd.cmd_id, name=cmd.name, issued_ns=cmd.issued_ns, delivered=delivered)
            return Disposition.TERM

        model = self.vehicle.telemetry
        if not self.vehicle.session.is_up or model.armed is None:
            out = Outcome(result=CmdResult.TIMEOUT, detail="link to the vehicle is down", retry=True)
        else:
            reason = defn.failure(cmd, model)
            # The model's armed flag and mode lag a just-accepted command by up to a heartbeat period
            # (arm, then takeoff at once): a failure is final only once a newer HEARTBEAT confirms it.
            if reason is not None and await self.vehicle.session.wait_heartbeat():
                reason = defn.failure(cmd, model)  # judged again on the vehicle's newest state
            if reason is not None:
                out = Outcome(result=CmdResult.REJECTED, detail=reason)
                await self._final(msg, out, cmd_id=cmd.cmd_id, name=cmd.name, issued_ns=cmd.issued_ns,
                                  delivered=delivered)
                return Disposition.TERM
            out = await self._run_keeping_alive(msg, cmd, defn)

        if out.retry:
            if delivered < self.cfg.max_deliver:
                log.info("command_retry_later", vehicle=self.vid, cmd_id=cmd.cmd_id, name=cmd.name,
                         reason=out.detail, delivered=delivered, delay_s=self.cfg.nak_delay_s)
                await _quietly(msg.nak(delay=self.cfg.nak_delay_s))
                return Disposition.NAK
            out.detail = f"{out.detail}; gave up after {delivered} deliveries"
        await self._final(msg, out, cmd_id=cmd.cmd_id, name=cmd.name, issued_ns=cmd.issued_ns, delivered=delivered)
        return Disposition.ACK if out.result is CmdResult.ACCEPTED else Disposition.TERM

    # -- the ledger --------------------------------------------------------
    async def _already_done(self, msg: Msg, cmd_id: str) -> bool:
        entry = await self.ledger.lookup(cmd_id)
        if entry is None:
            return False
        self.duplicates += 1
        log.info("command_duplicate", vehicle=self.vid, cmd_id=cmd_id, result=entry.result, spooled=entry.spooled)
        if not entry.spooled:  # the crash came between ledger and spool: the one result is still owed
            await self._spool(entry)
        await _quietly(msg.ack_sync(timeout=self.cfg.fetch_timeout_s))
        return True

    async def _spool(self, entry: LedgerEntry) -> None:
        self.nats.enqueue_event(entry.subject, entry.msg_id, entry.payload)
        await self.nats.flush_pending_to_spool()
        self.ledger.mark_spooled(entry.cmd_id)

    async def _final(self, msg: Msg, out: Outcome, *, cmd_id: str, name: str, issued_ns: int | None,
                     delivered: int) -> None:
        now_ns = time.time_ns()
        latency_ms = 0.0 if issued_ns is None else (now_ns - issued_ns) / 1e6
        data = self.vehicle.telemetry.snapshot()
        data.update(
            result_data(
                cmd_id=cmd_id, name=name, result=out.result, mav_result=out.mav_result, detail=out.detail,
                attempts=out.attempts, latency_ms=latency_ms, deliveries=delivered, **out.extra,
            )
        )  # fmt: skip
        msg_id = f"{self.vid}:cmd_result:{cmd_id}"
        entry = LedgerEntry(
            cmd_id=cmd_id, vid=self.vid, name=name, result=out.result.value, subject=self.result_subject, msg_id=msg_id,
            payload=envelope.pack(self.vid, now_ns, data), spooled=False, at_ns=now_ns,
        )  # fmt: skip
        if not await self.ledger.record(entry, durable=out.result in _REACHED_VEHICLE):
            stored = await self.ledger.lookup(cmd_id)  # another delivery finished it first
            if stored is not None:
                entry = stored
        if not entry.spooled:
            await self._spool(entry)
        # The name is the subject's last token, chosen by the publisher: bound the metric's label values.
        self.metrics.commands.labels(name=name if name in CATALOGUE else "unknown", result=out.result.value).inc()
        # Spooled above: counted and handed to the vehicle's subscribers only.
        self.vehicle.publish_event(Event("cmd_result", now_ns, data, msg_id), payload=entry.payload, enqueue=False)
        log.info("command_finished", vehicle=self.vid, cmd_id=cmd_id, name=name, result=out.result,
                 mav_result=out.mav_result, detail=out.detail, attempts=out.attempts, deliveries=delivered,
                 latency_ms=round(latency_ms, 1))
        if out.result is CmdResult.ACCEPTED:
            await _quietly(msg.ack_sync(timeout=self.cfg.fetch_timeout_s))  # double ack: the server confirms
        else:
            await _quietly(msg.term())

    # -- execution ---------------------------------------------------------
    async def _run_keeping_alive(self, msg: Msg, cmd: Command, defn: CommandDef) -> Outcome:
        result: Outcome | None = None

        async def keepalive() -> None:
            while True:
                await anyio.sleep(self.keepalive_s)
                await _quietly(msg.in_progress())

        ctx = ActionContext(vehicle=self.vehicle, nats=self.nats)
        async with anyio.create_task_group() as tg:
            tg.start_soon(keepalive, name=f"vehicle[{self.vid}].commands.in_progress")
            try:
                result = await run_action(defn.action, cmd, ctx)
            finally:
                tg.cancel_scope.cancel()
        assert result is not None
        return result


async def _quietly(aw: Awaitable[object]) -> None:
    """Ack/nak/term/in_progress: a failure (NATS down) only means a redelivery later, which the ledger absorbs."""
    try:
        await aw
    except Exception as exc:  # nats-py raises a wide range here; none of it may stop the vehicle's loop
        log.warning("command_ack_failed", error=f"{type(exc).__name__}: {exc}")
