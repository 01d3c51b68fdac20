"""One command message, from delivery to ack/nak/term and its single `cmd_result`.

The lifecycle is DESIGN.md's (Commands), in this order:

1. oversize, bad msgpack, unknown name, bad params → `term`, `invalid`;
2. id already in the ledger → `ack`, nothing sent to the vehicle (its result
   is re-spooled only if a crash lost it, with the same msg id);
3. past its deadline → `term`, `expired`;
4. link down or vehicle state unknown → `nak(delay)` (redelivered later);
5. preconditions against the live model → `term`, `rejected` with the reason;
6. run it (COMMAND_LONG/INT, parameter or mission protocol) while
   `in_progress` acks keep the message; ACCEPTED → ledger, result, `ack_sync`;
   TEMPORARILY_REJECTED or the link dropped → `nak(delay)` without a result;
   DENIED/UNSUPPORTED → `term`, `rejected`; FAILED → `term`, `failed`;
   no ACK → `term`, `timeout`. At MaxDeliver a retry becomes final
   (`failed` or `timeout`) so the command still ends in one result.

Every final outcome goes to the ledger before the message is acked or
terminated, and its `cmd_result` has the deterministic Nats-Msg-Id
`<vid>:cmd_result:<cmd_id>`: whatever is redelivered, the audit trail holds
one result per command.

Test hook: with `crash_after_ledger="<command name>"` (the gateway reads it
from MAVJET_TEST_CRASH_AFTER_LEDGER) the process sends itself SIGKILL right
after the ledger write of an accepted command of that name: the vehicle has
accepted it, the message is not acked and no result is spooled — the worst
moment for a crash, which the tests reproduce.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass, field
from typing import Any

import anyio
import structlog
from nats.aio.msg import Msg
from nats.js.errors import NotFoundError

from drivers.mavlink.command import CommandConfig as MavCommandConfig
from drivers.mavlink.command import CommandResult, mav_result_name
from drivers.mavlink.dialect import mavlink2
from drivers.mavlink.mission import FENCE, RALLY, MissionRejected, MissionTimeout
from drivers.mavlink.params import ParamError, ParamMismatch, ParamTimeout
from drivers.mavlink.plan import PlanError, parse_plan
from drivers.mavlink.runner import (
    MissionMismatch,
    ProtocolConfig,
    clear_mission,
    execute_command,
    read_param,
    set_param,
    upload_and_verify,
)
from gateway.commands.catalogue import (
    Command,
    CommandInvalid,
    check_mode,
    decode_command,
    mav_action,
    precondition_failure,
    result_data,
)
from gateway.commands.ledger import Ledger, LedgerEntry
from gateway.config import CommandConfig
from gateway.contract import envelope
from gateway.contract.errors import LinkError
from gateway.contract.subjects import BLOBS_BUCKET, event_subject
from gateway.telemetry import Event
from gateway.vehicle import VehicleTwin

log = structlog.get_logger("mavjet.commands")

CRASH_ENV = "MAVJET_TEST_CRASH_AFTER_LEDGER"

_TEMPORARY = mavlink2.MAV_RESULT_TEMPORARILY_REJECTED
# Results after which the vehicle may have acted: their ledger entry must survive power loss.
_REACHED_VEHICLE = frozenset({"accepted", "failed", "timeout"})
_REJECTED = (mavlink2.MAV_RESULT_DENIED, mavlink2.MAV_RESULT_UNSUPPORTED)


@dataclass(slots=True, kw_only=True)
class Outcome:
    """How one execution attempt ended. `retry` means: not finished, nak and try again."""

    result: str
    mav_result: int | None = None
    detail: str = ""
    attempts: int = 0
    retry: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


def protocol_config(cfg: CommandConfig) -> ProtocolConfig:
    """The MAVLink protocol timeouts from the gateway's `[commands]` section."""
    return ProtocolConfig(
        command=MavCommandConfig(
            ack_timeout_s=cfg.ack_timeout_s,
            max_attempts=cfg.retries + 1,
            in_progress_timeout_s=cfg.in_progress_timeout_s,
        )
    )


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
        twin: VehicleTwin,
        ledger: Ledger,
        *,
        cfg: CommandConfig,
        env: str,
        crash_after_ledger: str | None = None,
    ) -> None:
        self.twin = twin
        self.vid = twin.vid
        self.ledger = ledger
        self.cfg = cfg
        self.env = env
        self.protocols = protocol_config(cfg)
        self.keepalive_s = keepalive_interval_s(cfg)
        self.crash_after_ledger = crash_after_ledger
        self.result_subject = event_subject(env, twin.vid, "cmd_result")
        self.handled = 0
        self.duplicates = 0
        self._run_started_mono = 0.0

    # -- entry point -------------------------------------------------------
    async def handle(self, msg: Msg) -> str:
        """Process one delivery; returns what was done with it: ack, nak, term or duplicate."""
        self.handled += 1
        name = msg.subject.split(".", 5)[-1] if msg.subject.count(".") >= 5 else msg.subject
        md = msg.metadata
        delivered = int(md.num_delivered or 1)
        headers = msg.headers or {}
        fallback_id = headers.get("Nats-Msg-Id") or f"{self.vid}:seq:{md.sequence.stream if md.sequence else 0}"
        try:
            cmd = decode_command(name, msg.data, max_payload_bytes=self.cfg.max_payload_bytes, fallback_id=fallback_id)
            if cmd.name == "set_mode":
                check_mode(str(cmd.params["mode"]), self.twin.model.modes)
        except CommandInvalid as exc:
            cmd_id = exc.cmd_id or fallback_id
            if await self._already_done(msg, cmd_id):
                return "duplicate"
            await self._final(msg, Outcome(result="invalid", detail=exc.reason), cmd_id=cmd_id, name=name,
                              issued_ns=None, delivered=delivered)
            return "term"

        if await self._already_done(msg, cmd.cmd_id):
            return "duplicate"
        if cmd.expired(time.time_ns()):
            late_ms = (time.time_ns() - (cmd.deadline_ns or 0)) / 1e6
            out = Outcome(result="expired", detail=f"deadline passed {late_ms:.0f} ms before execution")
            await self._final(msg, out, cmd_id=cmd.cmd_id, name=cmd.name, issued_ns=cmd.issued_ns, delivered=delivered)
            return "term"

        model = self.twin.model
        if not self.twin.link.is_up or model.armed is None:
            out = Outcome(result="timeout", detail="link to the vehicle is down", retry=True)
        else:
            reason = precondition_failure(cmd, model)
            if reason is not None and await self._fresh_heartbeat():
                reason = precondition_failure(cmd, model)  # judged again on the vehicle's newest state
            if reason is not None:
                out = Outcome(result="rejected", detail=reason)
                await self._final(msg, out, cmd_id=cmd.cmd_id, name=cmd.name, issued_ns=cmd.issued_ns,
                                  delivered=delivered)
                return "term"
            out = await self._run_keeping_alive(msg, cmd)

        if out.retry:
            if delivered < self.cfg.max_deliver:
                log.info("command_retry_later", vehicle=self.vid, cmd_id=cmd.cmd_id, name=cmd.name,
                         reason=out.detail, delivered=delivered, delay_s=self.cfg.nak_delay_s)
                await _quietly(msg.nak(delay=self.cfg.nak_delay_s))
                return "nak"
            out.detail = f"{out.detail}; gave up after {delivered} deliveries"
        await self._final(msg, out, cmd_id=cmd.cmd_id, name=cmd.name, issued_ns=cmd.issued_ns, delivered=delivered)
        return "ack" if out.result == "accepted" else "term"

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
        publisher = self.twin.publisher
        publisher.enqueue_event(entry.subject, entry.msg_id, entry.payload)
        await publisher.flush_pending_to_spool()
        self.ledger.mark_spooled(entry.cmd_id)

    async def _final(self, msg: Msg, out: Outcome, *, cmd_id: str, name: str, issued_ns: int | None,
                     delivered: int) -> None:
        now_ns = time.time_ns()
        latency_ms = 0.0 if issued_ns is None else (now_ns - issued_ns) / 1e6
        data = self.twin.model.snapshot()
        data.update(
            result_data(
                cmd_id=cmd_id, name=name, result=out.result, mav_result=out.mav_result, detail=out.detail,
                attempts=out.attempts, latency_ms=latency_ms, deliveries=delivered, **out.extra,
            )
        )  # fmt: skip
        msg_id = f"{self.vid}:cmd_result:{cmd_id}"
        entry = LedgerEntry(
            cmd_id=cmd_id, vid=self.vid, name=name, result=out.result, subject=self.result_subject, msg_id=msg_id,
            payload=envelope.pack(self.vid, now_ns, data), spooled=False, at_ns=now_ns,
        )  # fmt: skip
        if not await self.ledger.record(entry, durable=out.result in _REACHED_VEHICLE):
            stored = await self.ledger.lookup(cmd_id)  # another delivery finished it first
            if stored is not None:
                entry = stored
        if self.crash_after_ledger and out.result == "accepted" and name == self.crash_after_ledger:
            log.warning("test_crash_after_ledger", vehicle=self.vid, cmd_id=cmd_id)
            os.kill(os.getpid(), signal.SIGKILL)
        if not entry.spooled:
            await self._spool(entry)
        twin = self.twin
        twin.metrics.events.labels(type="cmd_result").inc()
        twin.metrics.commands.labels(name=name, result=out.result).inc()
        ev = Event("cmd_result", now_ns, data, msg_id)
        for hook in twin.on_event_hooks:
            hook(ev)
        log.info("command_finished", vehicle=self.vid, cmd_id=cmd_id, name=name, result=out.result,
                 mav_result=out.mav_result, detail=out.detail, attempts=out.attempts, deliveries=delivered,
                 latency_ms=round(latency_ms, 1))
        if out.result == "accepted":
            await _quietly(msg.ack_sync(timeout=self.cfg.fetch_timeout_s))  # double ack: the server confirms
        else:
            await _quietly(msg.term())

    async def _fresh_heartbeat(self) -> bool:
        """Wait (bounded) for the next autopilot HEARTBEAT; the model has applied it when this returns True.

        The model's armed flag and mode lag a just-accepted command by up to a
        heartbeat period (arm, then takeoff at once): a failed precondition is
        only final once a HEARTBEAT sent after it confirms the state.
        """
        link = self.twin.link
        with anyio.move_on_after(self.protocols.heartbeat_wait_s):
            async with link.listen(64) as rx:
                async for m in rx:
                    if m.get_type() == "HEARTBEAT" and m.get_srcSystem() == link.target_system and \
                            m.get_srcComponent() == link.target_component:
                        return True
        return False

    # -- execution ---------------------------------------------------------
    async def _run_keeping_alive(self, msg: Msg, cmd: Command) -> Outcome:
        result: Outcome | None = None

        async def keepalive() -> None:
            while True:
                await anyio.sleep(self.keepalive_s)
                await _quietly(msg.in_progress())

        self._run_started_mono = time.monotonic()
        async with anyio.create_task_group() as tg:
            tg.start_soon(keepalive, name=f"vehicle[{self.vid}].commands.in_progress")
            try:
                result = await self._run(cmd)
            finally:
                tg.cancel_scope.cancel()
        assert result is not None
        return result

    async def _run(self, cmd: Command) -> Outcome:
        try:
            if cmd.name == "param_get":
                pv = await read_param(self.twin.link, cmd.params["name"], config=self.protocols)
                return Outcome(result="accepted", detail=f"{pv.name} = {pv.value:g}", attempts=1,
                               extra={"value": pv.value})
            if cmd.name == "param_set":
                pv = await set_param(self.twin.link, cmd.params["name"], cmd.params["value"], config=self.protocols)
                return Outcome(result="accepted", detail=f"{pv.name} = {pv.value:g}", attempts=1,
                               extra={"value": pv.value})
            if cmd.name == "mission_upload":
                return await self._mission_upload(cmd)
            if cmd.name == "mission_clear":
                await clear_mission(self.twin.link, config=self.protocols)
                return Outcome(result="accepted", detail="mission cleared", attempts=1)
            return await self._mav_command(cmd)
        except LinkError as exc:
            return Outcome(result="timeout", detail=f"link dropped: {exc.reason}", retry=True)
        except ParamMismatch as exc:
            return Outcome(result="rejected", detail=str(exc), attempts=exc.attempts)
        except ParamTimeout as exc:
            return self._no_answer(str(exc), exc.attempts)
        except ParamError as exc:
            return Outcome(result="failed", detail=str(exc))
        except MissionRejected as exc:
            return Outcome(result="rejected", detail=str(exc), attempts=1)
        except MissionTimeout as exc:
            return self._no_answer(str(exc), exc.retries + 1)
        except MissionMismatch as exc:
            return Outcome(result="failed", detail=str(exc), attempts=1)
        except CommandInvalid as exc:
            return Outcome(result="invalid", detail=exc.reason)

    def _no_answer(self, detail: str, attempts: int) -> Outcome:
        """No answer: a link outage is retried later (nak); a vehicle that was heard and stayed silent is a timeout.

        "Heard" means a HEARTBEAT arrived after the command was first sent:
        without one the command most likely never reached the vehicle (the
        link state itself lags by the heartbeat timeout).
        """
        link = self.twin.link
        if not link.is_up or link.last_heartbeat_mono <= self._run_started_mono:
            return Outcome(result="timeout", detail=f"link down: {detail}", attempts=attempts, retry=True)
        return Outcome(result="timeout", detail=detail, attempts=attempts)

    async def _mav_command(self, cmd: Command) -> Outcome:
        action = mav_action(cmd, self.twin.model.modes)
        outcome = await execute_command(
            self.twin.link, action.command, action.params, use_int=action.use_int, frame=action.frame,
            config=self.protocols,
        )  # fmt: skip
        mr = outcome.mav_result
        if outcome.result is CommandResult.ACCEPTED:
            detail = "confirmed by HEARTBEAT (ACK lost)" if outcome.confirmed_by == "heartbeat" else ""
            return Outcome(result="accepted", mav_result=mr, detail=detail, attempts=outcome.attempts)
        if outcome.result is CommandResult.TIMEOUT:
            return self._no_answer(f"no COMMAND_ACK after {outcome.attempts} attempts", outcome.attempts)
        name = mav_result_name(mr)
        if mr == _TEMPORARY:
            return Outcome(result="failed", mav_result=mr, detail="temporarily rejected by the vehicle",
                           attempts=outcome.attempts, retry=True)
        if mr in _REJECTED:
            return Outcome(result="rejected", mav_result=mr, detail=f"vehicle answered {name}", attempts=outcome.attempts)
        return Outcome(result="failed", mav_result=mr, detail=f"vehicle answered {name}", attempts=outcome.attempts)

    async def _mission_upload(self, cmd: Command) -> Outcome:
        obj_name = str(cmd.params["object"])
        js = self.twin.publisher.js
        if js is None:
            return Outcome(result="timeout", detail="NATS not connected: cannot read the plan", retry=True)
        try:
            store = await js.object_store(BLOBS_BUCKET)
            res = await store.get(obj_name)
        except Exception as exc:  # nats-py raises a wide range; translate at the boundary
            if isinstance(exc, NotFoundError):
                return Outcome(result="invalid", detail=f"mission_upload: no object {obj_name!r} in {BLOBS_BUCKET}")
            return Outcome(result="timeout", detail=f"reading {obj_name!r}: {type(exc).__name__}: {exc}", retry=True)
        try:
            plan = parse_plan(res.data or b"")
        except PlanError as exc:
            return Outcome(result="invalid", detail=f"mission_upload: {obj_name}: {exc}")
        digest = await upload_and_verify(self.twin.link, plan.mission, config=self.protocols)
        count = len(plan.mission)
        uploaded: dict[str, Any] = {"digest": digest, "count": count}
        parts = [f"{count} items"]
        for kind, mission_type, items in (("fence", FENCE, plan.fence), ("rally", RALLY, plan.rally)):
            # Only what the plan holds: a plan without a geofence leaves the vehicle's fence alone.
            kind_digest = None
            if items:
                kind_digest = await upload_and_verify(self.twin.link, items, mission_type, config=self.protocols)
                parts.append(f"{len(items)} {kind} item{'' if len(items) == 1 else 's'}")
            uploaded[f"{kind}_digest"] = kind_digest
            uploaded[f"{kind}_count"] = len(items)
        self.twin.emit("mission_uploaded", object=obj_name, **uploaded)
        return Outcome(result="accepted", detail=f"{', '.join(parts)}, read back and verified", attempts=1,
                       extra=uploaded)


async def _quietly(aw: Any) -> None:
    """Ack/nak/term/in_progress: a failure (NATS down) only means a redelivery later, which the ledger absorbs."""
    try:
        await aw
    except Exception as exc:  # nats-py raises a wide range here; none of it may stop the vehicle's loop
        log.warning("command_ack_failed", error=f"{type(exc).__name__}: {exc}")
