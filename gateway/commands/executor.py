"""One command message, from delivery to ack/nak/term and its single `cmd_result`.

The lifecycle, in this order (docs/commands.md). A command is `(vid, cmd_id)`:

1. oversize, bad msgpack, unknown name, bad params → `term`, `invalid`;
2. a final outcome in the ledger → `ack`, nothing sent to the vehicle (its
   result is re-spooled only if a crash lost it, with the same msg id);
3. an in-flight row in the ledger (a gateway stopped mid-command) → the
   command's `recovery` rule: confirmed from the vehicle's state
   (`accepted`), run again where that is harmless, else `unknown`; never
   re-sent blindly;
4. past its deadline (its own, else `issued` + `default_deadline_s`) →
   `term`, `expired`;
5. link down or vehicle state unknown → `nak(delay)` (redelivered later);
6. preconditions against the live model → `term`, `rejected` with the reason;
7. deadline checked again, the in-flight row committed (fsync, group
   commit), then the action runs (COMMAND_LONG/INT, parameter or mission
   protocol) while `in_progress` acks keep the message; ACCEPTED → ledger,
   result, `ack_sync`; TEMPORARILY_REJECTED or the link dropped → in-flight
   row cleared, `nak(delay)` without a result; DENIED/UNSUPPORTED → `term`,
   `rejected`; FAILED → `term`, `failed`; no ACK → `term`, `timeout`. At
   MaxDeliver a retry becomes final (`failed` or `timeout`) so the command
   still ends in one result.

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

from mavjet.contract import envelope
from mavjet.contract.commands import (
    CATALOGUE,
    CmdResult,
    Command,
    CommandInvalid,
    effective_deadline_ns,
    result_data,
)
from mavjet.contract.errors import LinkError
from mavjet.contract.events import EventType
from mavjet.contract.subjects import event_subject
from mavjet.gateway.commands.actions import ActionContext, Outcome, run_action
from mavjet.gateway.commands.delivery import CommandDelivery
from mavjet.gateway.commands.ledger import CommandLedger, LedgerEntry, in_flight_entry
from mavjet.gateway.commands.recovery import CONFIRMED_DETAIL, RecoveryVerdict
from mavjet.gateway.commands.shared import LedgerUnavailable
from mavjet.gateway.commands.spec import CommandDef, decode
from mavjet.gateway.config import CommandsConfig
from mavjet.gateway.runtime.metrics import GatewayMetrics
from mavjet.gateway.services import Foreground, NatsAccess, VehicleHandle
from mavjet.gateway.twin.telemetry import Event

log = structlog.get_logger("mavjet.commands")

MAX_VEHICLE_TEXTS = 8  # status texts kept in one result
TEXT_GRACE_S = 0.1  # a refusal waits this long for its reason's text
TEXT_MAX_SEVERITY = 4  # MAV_SEVERITY_WARNING: "Mode change to AUTO failed: no mission", "PreArm: ...", CRITICAL ...


class Disposition(StrEnum):
    """What the executor did with one delivery (counted per vehicle in `VehicleCommands.dispositions`)."""

    ACK = "ack"  # finished, accepted: acked (double ack)
    NAK = "nak"  # not finished (link down, temporarily rejected): run again by its lane after nak_delay_s
    TERM = "term"  # finished, not accepted: terminated, never redelivered
    DUPLICATE = "duplicate"  # already in the ledger: acked without executing again
    # Not the vehicle's owner (a standby, or fenced mid-command): handed back at once without a result,
    # its in-flight rows kept, so the owner recovers it by the in-flight rules (docs/ownership.md).
    HANDED_BACK = "handed_back"


def keepalive_interval_s(cfg: CommandsConfig) -> float:
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
        ledger: CommandLedger,
        *,
        nats: NatsAccess,
        metrics: GatewayMetrics,
        cfg: CommandsConfig,
        env: str,
        foreground: Foreground | None = None,
    ) -> None:
        self.foreground = foreground or Foreground()
        self.vehicle = vehicle
        self.vid = vehicle.vid
        self.ledger = ledger
        self.nats = nats
        self.metrics = metrics
        self.cfg = cfg
        self.env = env
        self.result_subject = event_subject(env, vehicle.vid, EventType.CMD_RESULT)
        self.handled = 0
        self.duplicates = 0
        self.recovered = 0  # deliveries that found the command in flight (a gateway stopped mid-command)
        self.handed_back = 0  # deliveries given back because this gateway was not (or stopped being) the owner
        self._received_s = time.monotonic()  # this delivery's arrival, for mavjet_command_duration_seconds
        # What the autopilot said (STATUSTEXT) while this vehicle's command ran: its own words go into the
        # result (`vehicle_text`), e.g. "Auto: Missing Takeoff Cmd" beside a FAILED mission_start.
        self._texts: list[str] | None = None
        vehicle.subscribe(self._on_event)

    # -- entry point -------------------------------------------------------
    async def handle(self, msg: CommandDelivery) -> Disposition:
        """Process one delivery; returns what was done with it."""
        if not self.vehicle.may_act():  # a pull answered just after this gateway lost the vehicle
            return await self._hand_back(msg, "not the vehicle's owner")
        with self.foreground.running():  # state yields to it meanwhile
            try:
                return await self._handle(msg)
            except _NotOwner as exc:
                return await self._hand_back(msg, str(exc))
            except LedgerUnavailable as exc:
                # Without the shared rows the command cannot be made safe across gateways: later.
                log.warning("command_ledger_unavailable", vehicle=self.vid, error=str(exc),
                            delay_s=self.cfg.nak_delay_s)
                msg.retry_later(self.cfg.nak_delay_s)
                return Disposition.NAK

    async def hand_back(self, msg: CommandDelivery, why: str) -> Disposition:
        return await self._hand_back(msg, why)

    async def refuse(self, msg: CommandDelivery, detail: str) -> Disposition | None:
        """End a delivery the vehicle's lane has no room for: `rejected` with `detail`, sent nowhere.

        Runs beside the vehicle's running command, so it touches none of that command's state.
        A command already finished is acked as a duplicate; one in flight (a previous owner's)
        is not refused (None): it must be recovered, in its turn.
        """
        if not self.vehicle.may_act():
            return await self._hand_back(msg, "not the vehicle's owner")
        name, delivered = _name(msg.subject), msg.delivered
        cmd_id, issued_ns = _fallback_id(msg, self.vid), None
        try:
            cmd, _ = decode(name, msg.data, self.vehicle.telemetry.modes,
                            max_payload_bytes=self.cfg.max_payload_bytes, fallback_id=cmd_id)
            cmd_id, issued_ns = cmd.cmd_id, cmd.issued_ns
        except CommandInvalid as exc:
            cmd_id = exc.cmd_id or cmd_id
        try:
            prior = await self.ledger.lookup(self.vid, cmd_id, redelivered=delivered > 1)
            if prior is not None and prior.in_flight:
                return None
            if prior is not None:
                await self._already_done(msg, prior)
                return Disposition.DUPLICATE
            await self._final(msg, Outcome(result=CmdResult.REJECTED, detail=detail), cmd_id=cmd_id, name=name,
                              issued_ns=issued_ns, delivered=delivered, running=False)
        except _NotOwner as exc:
            return await self._hand_back(msg, str(exc))
        except LedgerUnavailable:
            return None  # its turn will tell whether it is known elsewhere
        return Disposition.TERM

    def _on_event(self, ev: Event) -> None:
        texts = self._texts
        if texts is not None and ev.type == EventType.STATUSTEXT and len(texts) < MAX_VEHICLE_TEXTS:
            text, severity = ev.data.get("text"), ev.data.get("severity")
            # Warnings and worse: why a command was refused or failed, not the boot chatter of INFO lines.
            if isinstance(text, str) and text and isinstance(severity, int) and severity <= TEXT_MAX_SEVERITY:
                texts.append(text)

    async def _hand_back(self, msg: CommandDelivery, why: str) -> Disposition:
        """Give the delivery back at once, nothing written: whoever owns the vehicle settles it."""
        self.handed_back += 1
        log.warning("command_handed_back", vehicle=self.vid, reason=why)
        await _quietly(msg.hand_back())
        return Disposition.HANDED_BACK

    def _check_owner(self, where: str) -> None:
        """Raise `_NotOwner` unless this gateway may act for the vehicle now."""
        if not self.vehicle.may_act():
            raise _NotOwner(f"not the vehicle's owner {where}")

    async def _handle(self, msg: CommandDelivery) -> Disposition:
        self.handled += 1
        self._received_s, received_ns = time.monotonic(), time.time_ns()
        name = _name(msg.subject)
        delivered = msg.delivered
        fallback_id = _fallback_id(msg, self.vid)
        try:
            cmd, defn = decode(name, msg.data, self.vehicle.telemetry.modes,
                               max_payload_bytes=self.cfg.max_payload_bytes, fallback_id=fallback_id)
        except CommandInvalid as exc:
            if exc.__cause__ is not None:
                log.error("command_decode_bug", vehicle=self.vid, cmd_id=exc.cmd_id, reason=exc.reason,
                          exc_info=exc.__cause__)
            cmd_id = exc.cmd_id or fallback_id
            prior = await self.ledger.lookup(self.vid, cmd_id, redelivered=delivered > 1)
            if prior is not None and not prior.in_flight:
                await self._already_done(msg, prior)
                return Disposition.DUPLICATE
            await self._final(msg, Outcome(result=CmdResult.INVALID, detail=exc.reason), cmd_id=cmd_id, name=name,
                              issued_ns=None, delivered=delivered)
            return Disposition.TERM

        # Issued to delivered: the time before the gateway (see gateway/runtime/metrics.py), by the issuer's clock.
        queued_s = max(0.0, (received_ns - cmd.issued_ns) / 1e9)
        self.metrics.command_phase.labels(phase="queue").observe(queued_s)
        prior = await self.ledger.lookup(self.vid, cmd.cmd_id, redelivered=delivered > 1)
        if prior is not None and not prior.in_flight:
            await self._already_done(msg, prior)
            return Disposition.DUPLICATE
        deadline_ns = effective_deadline_ns(cmd, self.cfg.default_deadline_s)
        if prior is not None:  # in flight when a gateway stopped: never re-sent blindly
            return await self._recover(msg, cmd, defn, prior, deadline_ns=deadline_ns, delivered=delivered)
        return await self._execute(msg, cmd, defn, deadline_ns, delivered)

    def _expired(self, msg: CommandDelivery, cmd: Command, deadline_ns: int | None, delivered: int,
                 why: str = "before execution") -> Awaitable[None] | None:
        """The `expired` ending if the deadline has passed (awaitable), else None."""
        now_ns = time.time_ns()
        if deadline_ns is None or now_ns <= deadline_ns:
            return None
        late_ms = (now_ns - deadline_ns) / 1e6
        out = Outcome(result=CmdResult.EXPIRED, detail=f"deadline passed {late_ms:.0f} ms {why}")
        return self._final(msg, out, cmd_id=cmd.cmd_id, name=cmd.name, issued_ns=cmd.issued_ns, delivered=delivered)

    async def _execute(self, msg: CommandDelivery, cmd: Command, defn: CommandDef, deadline_ns: int | None,
                       delivered: int) -> Disposition:
        expired = self._expired(msg, cmd, deadline_ns, delivered)
        if expired is not None:
            await expired
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
            # Right before the first transmission: the precondition may have waited for a HEARTBEAT.
            expired = self._expired(msg, cmd, deadline_ns, delivered, "before the first transmission")
            if expired is not None:
                await expired
                return Disposition.TERM
            # The in-flight row, durable before anything is sent: a crash from here on is recovered, not re-sent.
            started_ns, t0 = time.time_ns(), time.monotonic()
            self._check_owner("before the first transmission")
            self._texts = []
            if not await self.ledger.record(in_flight_entry(self.vid, cmd.cmd_id, cmd.name, started_ns)):
                stored = await self.ledger.lookup(self.vid, cmd.cmd_id)  # another delivery got there first
                if stored is not None and stored.in_flight:  # another gateway's, in flight: never re-sent blindly
                    return await self._recover(msg, cmd, defn, stored, deadline_ns=deadline_ns, delivered=delivered)
                if stored is not None:
                    await self._already_done(msg, stored)
                    return Disposition.DUPLICATE
            t1 = time.monotonic()
            phase = self.metrics.command_phase
            phase.labels(phase="ledger").observe(t1 - t0)
            out = await run_action(defn.action, cmd, self._action_context())
            phase.labels(phase="vehicle").observe(time.monotonic() - t1)
            if out.result is not CmdResult.ACCEPTED and out.mav_result is not None and not self._texts:
                # An autopilot says why just before or after its refusal (ArduPilot sends the text,
                # then the ACK): a moment for a text still in the link's buffers.
                await anyio.sleep(TEXT_GRACE_S)
            if out.retry:
                # Fenced while it ran: its rows stay in flight (the vehicle may have acted) for the owner's recovery.
                self._check_owner("when the command ended")
                # Not finished, and this process knows it: the redelivery runs it as usual.
                await self.ledger.clear_in_flight(self.vid, cmd.cmd_id)
        return await self._settle(msg, cmd, out, delivered)

    async def _settle(self, msg: CommandDelivery, cmd: Command, out: Outcome, delivered: int) -> Disposition:
        if out.retry:
            if delivered < self.cfg.max_deliver:
                log.info("command_retry_later", vehicle=self.vid, cmd_id=cmd.cmd_id, name=cmd.name,
                         reason=out.detail, delivered=delivered, delay_s=self.cfg.nak_delay_s)
                msg.retry_later(self.cfg.nak_delay_s)
                return Disposition.NAK
            out.detail = f"{out.detail}; gave up after {delivered} deliveries"
        await self._final(msg, out, cmd_id=cmd.cmd_id, name=cmd.name, issued_ns=cmd.issued_ns, delivered=delivered)
        return Disposition.ACK if out.result is CmdResult.ACCEPTED else Disposition.TERM

    # -- a command in flight at a crash ------------------------------------
    async def _recover(self, msg: CommandDelivery, cmd: Command, defn: CommandDef, prior: LedgerEntry, *,
                       deadline_ns: int | None, delivered: int) -> Disposition:
        """Settle a command that may have reached the vehicle (its rule: `defn.recovery`)."""
        rule = defn.recovery
        self.recovered += 1
        age_s = (time.time_ns() - prior.at_ns) / 1e9
        log.warning("command_in_flight_at_restart", vehicle=self.vid, cmd_id=cmd.cmd_id, name=cmd.name,
                    attempt_age_s=round(age_s, 1), rule=rule.rule, delivered=delivered)
        not_resent = f"in flight when its gateway stopped ({age_s:.1f} s ago); not re-sent"
        session = self.vehicle.session
        verdict: RecoveryVerdict | None = None
        why = ""
        if session.is_up and self.vehicle.telemetry.armed is not None:
            await session.wait_heartbeat()  # judge on the vehicle's state now, not a model from before
            try:
                verdict = await rule.observe(cmd, self._action_context())
            except LinkError:
                verdict = None
            except Exception as exc:  # a failed read (timeout, refused, missing plan) leaves the state unknown
                verdict, why = RecoveryVerdict.UNKNOWN, f": reading the vehicle failed ({type(exc).__name__}: {exc})"
        if verdict is None:  # the vehicle cannot be read now: later, while time is left
            past = deadline_ns is not None and time.time_ns() > deadline_ns
            if not past and delivered < self.cfg.max_deliver:
                msg.retry_later(self.cfg.nak_delay_s)
                return Disposition.NAK
            out = Outcome(result=CmdResult.UNKNOWN, detail=f"{not_resent}: the vehicle could not be read")
        elif verdict is RecoveryVerdict.DONE:
            out = Outcome(result=CmdResult.ACCEPTED, detail=CONFIRMED_DETAIL)
        elif verdict is RecoveryVerdict.NOT_DONE and rule.resend:
            expired = self._expired(msg, cmd, deadline_ns, delivered, "; the vehicle shows it did not take effect")
            if expired is not None:
                await expired
                return Disposition.TERM
            log.info("command_resent_after_restart", vehicle=self.vid, cmd_id=cmd.cmd_id, name=cmd.name)
            return await self._execute(msg, cmd, defn, deadline_ns, delivered)
        else:
            out = Outcome(result=CmdResult.UNKNOWN, detail=f"{not_resent}: {rule.rule}{why}")
        await self._final(msg, out, cmd_id=cmd.cmd_id, name=cmd.name, issued_ns=cmd.issued_ns, delivered=delivered)
        return Disposition.ACK if out.result is CmdResult.ACCEPTED else Disposition.TERM

    # -- the ledger --------------------------------------------------------
    async def _already_done(self, msg: CommandDelivery, entry: LedgerEntry) -> None:
        self.duplicates += 1
        log.info("command_duplicate", vehicle=self.vid, cmd_id=entry.cmd_id, result=entry.result,
                 spooled=entry.spooled)
        if not entry.spooled:  # the crash came between ledger and spool: the one result is still owed
            self._check_owner("to publish its result")
            await self._spool(entry)
        await _quietly(msg.ack_sync(self.cfg.fetch_timeout_s))

    async def _hand_over(self, msg: CommandDelivery, entry: LedgerEntry) -> None:
        """The result to the stream at once where that keeps the vehicle's events in order, else to the spool.

        Either way it is durable before the command is acked: in the stream, or in the spool.
        """
        published = await self.nats.publish_event_now(entry.subject, entry.msg_id, entry.payload)
        if published:
            self.ledger.mark_spooled(entry.vid, entry.cmd_id)
        else:
            await self._spool(entry)

    async def _spool(self, entry: LedgerEntry) -> None:
        self.nats.enqueue_event(entry.subject, entry.msg_id, entry.payload)
        await self.nats.flush_pending_to_spool()
        self.ledger.mark_spooled(entry.vid, entry.cmd_id)

    async def _final(self, msg: CommandDelivery, out: Outcome, *, cmd_id: str, name: str, issued_ns: int | None,
                     delivered: int, running: bool = True) -> None:
        now_ns = time.time_ns()
        latency_ms = 0.0 if issued_ns is None else (now_ns - issued_ns) / 1e6
        texts: list[str] | None = None
        if running:  # the vehicle's words belong to the command that runs (a refusal beside it has none)
            texts, self._texts = self._texts, None
        if texts:
            out.extra = {**out.extra, "vehicle_text": texts}
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
        # No fsync: a command that may have reached the vehicle has its in-flight row on disk already,
        # and a lost final row only makes its redelivery recover from that row.
        t0 = time.monotonic()
        if not await self.ledger.record(entry, durable=False):
            stored = await self.ledger.lookup(self.vid, cmd_id)  # another delivery finished it first
            if stored is not None and not stored.in_flight:
                entry = stored
        # The outcome is known and written down (here and for the next owner); its result is an event,
        # which only the owner publishes: fenced meanwhile, the delivery goes back and the owner's
        # redelivery finds this row and publishes the result (`_already_done`), with the same msg id.
        self._check_owner("at its result")
        if not entry.spooled:
            await self._hand_over(msg, entry)
        self.metrics.command_phase.labels(phase="result").observe(time.monotonic() - t0)
        # The name is the subject's last token, chosen by the publisher: bound the metric's label values.
        command = name if name in CATALOGUE else "unknown"
        self.metrics.commands.labels(command=command, result=out.result.value).inc()
        if running:
            self.metrics.command_duration.labels(command=command, result=out.result.value).observe(
                time.monotonic() - self._received_s)
        # Handed over above: counted and passed to the vehicle's subscribers only.
        self.vehicle.publish_event(Event(EventType.CMD_RESULT, now_ns, data, msg_id), payload=entry.payload, enqueue=False)
        log.info("command_finished", vehicle=self.vid, cmd_id=cmd_id, name=name, result=out.result,
                 mav_result=out.mav_result, detail=out.detail, attempts=out.attempts, deliveries=delivered,
                 latency_ms=round(latency_ms, 1))
        if out.result is CmdResult.ACCEPTED:
            await _quietly(msg.ack_sync(self.cfg.fetch_timeout_s))  # double ack: the server confirms
        else:
            await _quietly(msg.term())

    # -- execution ---------------------------------------------------------
    def _action_context(self) -> ActionContext:
        """What an action or a recovery read works with; the lane's `in_progress` acks keep the message meanwhile."""
        return ActionContext(vehicle=self.vehicle, nats=self.nats)


class _NotOwner(Exception):
    """This gateway may not act for the vehicle (any more): the delivery is handed back."""


def _name(subject: str) -> str:
    """The command's name: the last token of `fleet.<env>.veh.<vid>.cmd.<name>`."""
    return subject.split(".", 5)[-1] if subject.count(".") >= 5 else subject


def _fallback_id(msg: CommandDelivery, vid: str) -> str:
    """The command id when its body cannot say: its Nats-Msg-Id, else its stream sequence."""
    headers = msg.headers or {}
    return _id_from_msg_id(headers.get("Nats-Msg-Id"), vid) or f"{vid}:seq:{msg.stream_seq}"


def _id_from_msg_id(msg_id: str | None, vid: str) -> str | None:
    """The command id in a command's Nats-Msg-Id (`<vid>:<id>`; a bare id from an older client as is)."""
    if not msg_id:
        return None
    prefix = f"{vid}:"
    return msg_id[len(prefix):] or None if msg_id.startswith(prefix) else msg_id


async def _quietly(aw: Awaitable[object]) -> None:
    """Ack/nak/term/in_progress: a failure (NATS down) only means a redelivery later, which the ledger absorbs."""
    try:
        await aw
    except Exception as exc:  # nats-py raises a wide range here; none of it may stop the vehicle's loop
        log.warning("command_ack_failed", error=f"{type(exc).__name__}: {exc}")
