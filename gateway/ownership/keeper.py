"""The lease keeper: one task per gateway running the lease machine of each of its vehicles.

One loop for the whole fleet: each pass asks every machine for its next
operation, performs those that are due side by side (bounded by a capacity
limiter and each by `op_timeout_s`), feeds the answers back, and sleeps
until the earliest machine wants something. An owner's renews go out every
`renew_every_s`, each with the revision it expects; a standby reads the key
at the same period.

The daemon uses the keeper through `Ownership` (the seam): `may_act(vid)`
right before anything that acts, with no await between the check and the
write, since the answer is computed from the monotonic clock at that call
(a paused or starved process that wakes past its deadline gets False even
before this loop has run again). Changes reach an `OwnershipListener`
(events, metrics, the one log line) and anyone waiting in `changed()`.
"""

from __future__ import annotations

import os
import re
import secrets
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol

import anyio
import structlog
from anyio.abc import TaskStatus

from mavjet.contract.subjects import check_token, lease_key
from mavjet.gateway.ownership.lease import (
    ChangeKind,
    Intent,
    LeaseMachine,
    LeaseOp,
    LeaseResult,
    LeaseState,
    LeaseTiming,
    LeaseValue,
    OpKind,
    Outcome,
    OwnershipChange,
    decode_value,
    encode_value,
)
from mavjet.gateway.ownership.store import LeaseConflict, LeaseEntry, LeaseStore, LeaseUnavailable

__all__ = ["AlwaysOwner", "GatewayIdentity", "LeaseKeeper", "Ownership", "OwnershipListener"]

log = structlog.get_logger("mavjet.ownership")
MISSING_LOG_EVERY_S = 60.0


@dataclass(frozen=True, slots=True, kw_only=True)
class GatewayIdentity:
    """Who holds a lease: unique per process, even for two gateways of one instance name on one host."""

    instance: str
    host: str
    pid: int
    nonce: str  # a restarted process that got the same pid is still someone else

    @classmethod
    def of_this_process(cls, instance: str) -> GatewayIdentity:
        return cls(instance=instance, host=socket.gethostname(), pid=os.getpid(), nonce=secrets.token_hex(4))

    @property
    def holder(self) -> str:
        return f"{self.instance}@{self.host}:{self.pid}:{self.nonce}"

    @property
    def key_id(self) -> str:
        """One subject token unique per process (the holder has `@` and `:`): `<instance>-<nonce>`.

        Names this gateway's presence records (`presence_key`); the instance part is
        for people, so characters a token cannot hold become `_` and it is cut short.
        """
        return f"{re.sub(r'[^A-Za-z0-9_-]', '_', self.instance)[:48]}-{self.nonce}"


class OwnershipListener(Protocol):
    """Told of every ownership change, in order, from the keeper's task. Must be quick (set a flag)."""

    def ownership_changed(self, change: OwnershipChange) -> None: ...


class Ownership(Protocol):
    """What the daemon may ask of ownership (the seam): only the owner acts."""

    def may_act(self, vid: str) -> bool:
        """True while this gateway owns `vid` and its fence deadline is ahead (ask right before acting)."""

    def may_record(self, vid: str) -> bool:
        """True while this gateway may record (spool, publish) what `vid` says: see `LeaseMachine.may_record`."""

    def token(self, vid: str) -> int | None:
        """The fencing token of this gateway's current term for `vid`, None when it may not act."""

    def holder(self, vid: str) -> str | None:
        """The owner of `vid` as far as this gateway knows (itself, another gateway, or None)."""

    def state(self, vid: str) -> LeaseState: ...

    async def changed(self) -> None:
        """Return at the next ownership change of any vehicle."""

    async def wait_until(self, vid: str, *, owner: bool) -> None:
        """Return once `may_act(vid)` is `owner` (bound it with a timeout)."""

    async def release(self, *, timeout_s: float) -> None:
        """Stop acting for every vehicle and delete the leases held, within `timeout_s` (shielded)."""

    async def run(self, *, task_status: TaskStatus[None] = ...) -> None:
        """Keep the leases until cancelled."""


class AlwaysOwner:
    """`Ownership` without leases (`ownership = false`): one gateway certain to be alone acts for all."""

    def may_act(self, vid: str) -> bool:
        return True

    def may_record(self, vid: str) -> bool:
        return True

    def token(self, vid: str) -> int | None:
        return None

    def holder(self, vid: str) -> str | None:
        return None

    def state(self, vid: str) -> LeaseState:
        return LeaseState.OWNER

    async def changed(self) -> None:
        await anyio.sleep_forever()

    async def wait_until(self, vid: str, *, owner: bool) -> None:
        if not owner:
            await anyio.sleep_forever()

    async def release(self, *, timeout_s: float) -> None:
        return None

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        task_status.started()


class LeaseKeeper:
    """Implements `Ownership` over a `LeaseStore` for a fixed set of vehicles."""

    def __init__(
        self,
        store: LeaseStore,
        *,
        env: str,
        vids: Iterable[str],
        identity: GatewayIdentity,
        timing: LeaseTiming | None = None,
        listener: OwnershipListener | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        concurrency: int = 64,
    ) -> None:
        self.store = store
        self.env = check_token("env", env)
        self.identity = identity
        self.timing = timing or LeaseTiming()
        self.listener = listener
        self.clock = clock
        self.wall = wall
        now = clock()
        self._machines = {check_token("vid", v): LeaseMachine(vid=v, me=identity.holder, timing=self.timing, now=now)
                          for v in vids}
        self._since: dict[str, str] = {}  # wall-clock start of each term, written into the value
        self._limit = anyio.CapacityLimiter(concurrency)
        self._kick = anyio.Event()
        self._changed = anyio.Event()
        self._running = False
        self.renew_latency_s: float | None = None  # the newest successful renew's round trip (metrics)
        self.takeovers = 0
        self.ops = 0
        self._missing_logged = float("-inf")
        self._failing_since: float | None = None  # lease operations failing since (any vehicle); None: fine

    # --- the seam -------------------------------------------------------------------------------

    def may_act(self, vid: str) -> bool:
        m = self._machines.get(vid)
        return m is not None and m.may_act(self.clock())

    def may_record(self, vid: str) -> bool:
        m = self._machines.get(vid)
        return m is not None and m.may_record(self.clock())

    def token(self, vid: str) -> int | None:
        m = self._machines.get(vid)
        return m.token if m is not None and m.may_act(self.clock()) else None

    def holder(self, vid: str) -> str | None:
        m = self._machines.get(vid)
        return m.holder if m is not None else None

    def state(self, vid: str) -> LeaseState:
        return self._machines[vid].state(self.clock())

    def machine(self, vid: str) -> LeaseMachine:
        return self._machines[vid]

    async def changed(self) -> None:
        await self._changed.wait()

    def heard_release(self, vid: str) -> None:
        """A delete of `vid`'s lease was heard: standbys read now instead of at their next period."""
        m = self._machines.get(vid)
        if m is not None:
            m.heard_release(self.clock())
            self._kick.set()

    @property
    def vids(self) -> list[str]:
        return list(self._machines)

    async def wait_until(self, vid: str, *, owner: bool) -> None:
        while self.may_act(vid) != owner:
            m = self._machines[vid]
            if owner or m.deadline_s == float("-inf"):
                await self.changed()
            else:
                # The fence comes by the clock, not by a change: wake at the deadline too.
                with anyio.move_on_after(max(0.0, m.deadline_s - self.clock()) + 0.001):
                    await self.changed()

    async def release(self, *, timeout_s: float) -> None:
        now = self.clock()
        for m in self._machines.values():
            m.release(now)
        self._publish_changes()
        with anyio.CancelScope(shield=True), anyio.move_on_after(timeout_s):
            if self._running:
                self._kick.set()
                while not self._all_stopped():
                    await self.changed()
            else:
                while not self._all_stopped():
                    await self._pass()
                    await self._sleep_until_due(self.clock())
        left = [v for v, m in self._machines.items() if m.state(self.clock()) is not LeaseState.STOPPED]
        if left:
            log.warning("lease_release_incomplete", vehicles=left,
                        note="their leases expire after ttl_s; a standby takes over then")

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        self._running = True
        try:
            task_status.started()
            while True:
                await self._pass()
                await self._sleep_until_due(self.clock())
        finally:
            self._running = False

    # --- the loop -------------------------------------------------------------------------------

    def _all_stopped(self) -> bool:
        now = self.clock()
        return all(m.state(now) is LeaseState.STOPPED for m in self._machines.values())

    async def _pass(self) -> None:
        now = self.clock()
        due = [(vid, m, op) for vid, m in self._machines.items() if (op := m.next_op(now)) is not None]
        self._publish_changes()
        if not due:
            return
        async with anyio.create_task_group() as tg:
            for vid, m, op in due:
                tg.start_soon(self._perform, vid, m, op, name=f"lease {op.intent} {vid}")

    async def _sleep_until_due(self, now: float) -> None:
        wakes = [w for m in self._machines.values() if (w := m.wake_at()) is not None]
        # Nothing due (all stopped): still wake each period, so the loop is never parked for good.
        wake = min(wakes, default=now + self.timing.renew_every_s)
        with anyio.move_on_after(max(0.0, wake - now)):
            await self._kick.wait()
        if self._kick.is_set():
            self._kick = anyio.Event()

    async def _perform(self, vid: str, m: LeaseMachine, op: LeaseOp) -> None:
        key = lease_key(self.env, vid)
        result: LeaseResult
        async with self._limit:
            self.ops += 1
            try:
                with anyio.fail_after(self.timing.op_timeout_s):
                    if op.kind is OpKind.GET:
                        result = self._read(await self.store.get(key))
                    elif op.kind is OpKind.DELETE:
                        result = LeaseResult.written(await self.store.delete(key, last=op.last))
                    else:
                        result = LeaseResult.written(await self.store.write(key, self._value(vid, op), last=op.last))
            except LeaseConflict as exc:
                result = LeaseResult.conflict(exc.reason)
            except (LeaseUnavailable, TimeoutError) as exc:
                result = LeaseResult.failed(str(exc) or "timed out")
            except anyio.get_cancelled_exc_class():
                # Cancelled mid-operation (the keeper stopping): its outcome is unknown. Say so, or
                # the machine would wait for this answer for ever and a later release() do nothing.
                m.on_result(self.clock(), LeaseResult.failed("cancelled"))
                raise
        now = self.clock()
        if op.intent is Intent.RENEW and result.outcome is Outcome.WRITTEN:
            self.renew_latency_s = now - op.sent_at
        if result.outcome is Outcome.FAILED:
            log.debug("lease_op_failed", vehicle=vid, op=str(op.intent), error=result.detail)
            if self._failing_since is None:
                self._failing_since = now
            if now - self._failing_since >= self.timing.ttl_s and now - self._missing_logged >= MISSING_LOG_EVERY_S:
                # Without the lease nothing is owned, so nothing acts: say it where people look, once a minute.
                self._missing_logged = now
                missing = "missing" in result.detail
                emit = log.error if missing else log.warning
                emit("lease_bucket_missing" if missing else "lease_unavailable", vehicle=vid, error=result.detail,
                     hint="run `mavjet provision` for this env" if missing else
                     "NATS unreachable, or a credential without the lease permissions (docs/security.md)",
                     note="this gateway acts for no vehicle it cannot hold the lease of")
        else:
            self._failing_since = None
        m.on_result(now, result)
        self._publish_changes()

    def _read(self, entry: LeaseEntry) -> LeaseResult:
        if entry.value is None:
            return LeaseResult.absent(entry.revision)
        value = decode_value(entry.value)
        # Not a lease (garbage): a holder that will never renew, so it goes stale like a dead one.
        return LeaseResult.seen(entry.revision, value.holder if value is not None else "?")

    def _value(self, vid: str, op: LeaseOp) -> bytes:
        if op.intent in (Intent.ACQUIRE, Intent.TAKE_OVER) or vid not in self._since:
            self._since[vid] = datetime.fromtimestamp(self.wall(), UTC).isoformat(timespec="milliseconds")
        i = self.identity
        return encode_value(LeaseValue(holder=i.holder, instance=i.instance, host=i.host, pid=i.pid,
                                       since=self._since[vid], term=op.term))

    def _publish_changes(self) -> None:
        changes = [c for m in self._machines.values() for c in m.take_changes()]
        if not changes:
            return
        for c in changes:
            if c.kind is ChangeKind.TAKEN_OVER:
                self.takeovers += 1
            # Losing the right to act is what an operator must notice; the rest is the normal course.
            emit = log.warning if c.kind in (ChangeKind.FENCED, ChangeKind.LOST) else log.info
            emit(f"lease_{c.kind}", vehicle=c.vid, holder=c.holder, previous=c.previous, token=c.token,
                 me=self.identity.holder)
            if self.listener is not None:
                try:
                    self.listener.ownership_changed(c)
                except Exception:  # a listener's bug must not stop the leases
                    log.exception("ownership_listener_failed", vehicle=c.vid, change=str(c.kind))
        self._changed.set()
        self._changed = anyio.Event()
