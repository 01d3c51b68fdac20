"""Presence: a standby shows itself, so `mavjet twin`, `mavjet fleet` and people see every gateway of a vehicle.

The owner is already visible: the lease names it (renewed every second) and
its link record (TWIN_STATE) carries its link. A standby publishes nothing,
so each standby writes a small **presence record** per vehicle it stands by
for, beside the lease in TWIN_LEASES: `fleet.<env>.veh.<vid>.gw.<gateway id>`
(`mavjet.contract.subjects.presence_key`), JSON like the lease:

    {"v": 1, "holder": "hub-b@edge-02:77:1a2b3c4d", "instance": "hub-b", "host": "edge-02", "pid": 77,
     "role": "standby", "owner": "<the holder it sees>", "link": "up", "active_link": null,
     "since": "<ISO: standby since>", "updated_at": "<ISO>", "period_s": 5.0}

Why these rules (docs/ownership.md, "Presence"):

- **Only standbys write.** A gateway alone with its vehicles (the usual case,
  and the 10,000-vehicle hub) writes no record at all; an owner's record would
  repeat its lease. A gateway that becomes the owner deletes its record.
- **Every `every_s` (5 s), spread.** Vehicles are split into `SLOTS` groups by a
  hash of the vid and one group is written each `every_s / SLOTS`, so a standby
  of N vehicles writes N / 5 records a second, evenly, never N at once; one
  write per vehicle per 5 s is a fifth of what its lease keeper already reads.
  A role change is written at once (the keeper's change kicks it); a link
  change waits for the vehicle's next turn (at most `every_s`).
- **Staleness is the reader's**: a record older than `GATEWAY_MISSED_PERIODS`
  (3) times its `period_s` is shown as gone (`mavjet.ops.read.GatewaySeen.gone`),
  the rule the link record already follows. Age is the reader's clock minus the
  server's timestamp of the record; no gateway reads another's clock.
- **Clean stop deletes**; a crashed gateway's records age out with the bucket's
  `max_age` (15 min) and are shown as gone meanwhile. A plain put and delete,
  no compare-and-set: the key is this process's alone.
"""

from __future__ import annotations

import json
import time
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

import anyio
import structlog
from anyio.abc import TaskStatus

from mavjet.contract.subjects import presence_key
from mavjet.gateway.ownership.keeper import GatewayIdentity
from mavjet.gateway.ownership.store import LeaseError

__all__ = ["PRESENCE_EVERY_S", "SLOTS", "LinkView", "PresenceStore", "PresenceValue", "PresenceWriter", "decode_presence",
           "encode_presence"]

log = structlog.get_logger("mavjet.ownership")

PRESENCE_EVERY_S = 5.0  # a standby's record is rewritten this often (readers: gone after 3 periods)
SLOTS = 10  # the period is split in this many turns, each writing the vehicles whose vid hashes to it
_FAILED_LOG_EVERY_S = 60.0
MAX_PAUSE_S = 60.0  # the longest back-off of the periodic writes while every write fails


@dataclass(frozen=True, slots=True, kw_only=True)
class PresenceValue:
    """One gateway's record for one vehicle. Shown to people; no gateway decides anything on it."""

    holder: str  # the gateway's identity, as a lease would name it
    instance: str
    host: str
    pid: int
    role: str  # "standby" (only standbys write one; kept in the record for readers and later roles)
    owner: str | None  # the owner this gateway sees (None: nobody yet)
    link: str  # this gateway's link to the vehicle: up, down, connecting, ...
    active_link: str | None  # with a backup endpoint: which one is active (primary, backup)
    since: str  # wall clock, ISO 8601 UTC: standby for this vehicle since
    updated_at: str  # wall clock of this write (the server's timestamp is what readers age)
    period_s: float  # the writer's period: readers show the record as gone after 3 of them


def encode_presence(v: PresenceValue) -> bytes:
    doc: dict[str, Any] = {"v": 1, "holder": v.holder, "instance": v.instance, "host": v.host, "pid": v.pid,
                           "role": v.role, "owner": v.owner, "link": v.link, "active_link": v.active_link,
                           "since": v.since, "updated_at": v.updated_at, "period_s": v.period_s}
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def decode_presence(raw: bytes) -> PresenceValue | None:
    """The record, or None when it is not one (shown as nothing rather than failing a reader)."""
    try:
        d = json.loads(raw)
        owner, active = d.get("owner"), d.get("active_link")
        return PresenceValue(holder=str(d["holder"]), instance=str(d.get("instance", "")), host=str(d.get("host", "")),
                             pid=int(d.get("pid", 0)), role=str(d.get("role", "standby")),
                             owner=None if owner is None else str(owner), link=str(d.get("link", "?")),
                             active_link=None if active is None else str(active), since=str(d.get("since", "")),
                             updated_at=str(d.get("updated_at", "")), period_s=float(d.get("period_s", PRESENCE_EVERY_S)))
    except (ValueError, TypeError, KeyError, AttributeError):
        return None


class PresenceStore(Protocol):
    """What the writer needs of TWIN_LEASES (`JetStreamLeaseStore` has it)."""

    async def put(self, key: str, value: bytes) -> int: ...

    async def remove(self, key: str) -> int: ...


@dataclass(frozen=True, slots=True)
class LinkView:
    """What a record says of this gateway's link to the vehicle."""

    state: str
    active_link: str | None = None


def _slot(vid: str) -> int:
    # crc32, not hash(): the same vid lands in the same turn in every process and run.
    return zlib.crc32(vid.encode()) % SLOTS


class PresenceWriter:
    """Writes this gateway's presence records for the vehicles it stands by for (module docstring)."""

    def __init__(self, store: PresenceStore, *, env: str, identity: GatewayIdentity, vids: Iterable[str],
                 standby_for: Callable[[str], str | None], link: Callable[[str], LinkView],
                 every_s: float = PRESENCE_EVERY_S, op_timeout_s: float = 0.75, concurrency: int = 64,
                 wall: Callable[[], float] = time.time) -> None:
        self.store = store
        self.env = env
        self.identity = identity
        # `standby_for(vid)`: the owner this gateway stands by for (None: it owns, or nobody does yet).
        self.standby_for = standby_for
        self.link = link
        self.every_s = every_s
        self.op_timeout_s = op_timeout_s
        self.wall = wall
        self._slots: list[list[str]] = [[] for _ in range(SLOTS)]
        for vid in vids:
            self._slots[_slot(vid)].append(vid)
        self._written: dict[str, str] = {}  # vid -> key of the record standing (written, not yet deleted)
        self._since: dict[str, str] = {}  # vid -> when this gateway became its standby (shown)
        self._kicked: set[str] = set()
        self._wake = anyio.Event()
        self._limit = anyio.CapacityLimiter(concurrency)
        self._stopped = False
        self.writes = 0
        self.deletes = 0
        self.failures = 0
        self._failed_logged = float("-inf")
        self._pause_s = 0.0  # the back-off after a turn of failures (0: none)
        self._paused_until = float("-inf")

    def key(self, vid: str) -> str:
        return presence_key(self.env, vid, self.identity.key_id)

    @property
    def standing(self) -> int:
        """How many records this gateway has standing (a standby's vehicles, as far as written)."""
        return len(self._written)

    def kick(self, vid: str) -> None:
        """`vid`'s role changed: write (or delete) its record now, not at its next turn."""
        if not self._stopped:
            self._kicked.add(vid)
            self._wake.set()

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        turn_s = self.every_s / SLOTS
        turn = 0
        next_turn = anyio.current_time()
        while not self._stopped:
            with anyio.move_on_after(max(0.0, next_turn - anyio.current_time())):
                await self._wake.wait()
            self._wake = anyio.Event()
            vids = set(self._kicked)
            self._kicked.clear()
            now = anyio.current_time()
            if now >= next_turn:
                if now >= self._paused_until:
                    vids.update(self._slots[turn])
                turn = (turn + 1) % SLOTS
                next_turn += turn_s
                # Turns delayed by slow writes are caught up one after another (every vehicle keeps its
                # turn, at the store's pace); after a stall of more than a period (a paused process) the
                # missed ones are skipped rather than burst through.
                if next_turn < now - self.every_s:
                    next_turn = now
            ok, failed = self.writes + self.deletes, self.failures
            await self._visit(vids)
            if self.failures > failed and self.writes + self.deletes == ok:
                # Nothing stored in this turn (NATS away, or a credential from before presence, whose
                # every write the server refuses and the publisher logs): back off, 5 s doubling to a
                # minute, instead of a refused write per vehicle per period. Any success resets it.
                self._pause_s = min(2 * self._pause_s or self.every_s, MAX_PAUSE_S)
                self._paused_until = anyio.current_time() + self._pause_s
            elif self.writes + self.deletes > ok:
                self._pause_s, self._paused_until = 0.0, float("-inf")

    async def _visit(self, vids: Iterable[str]) -> None:
        async with anyio.create_task_group() as tg:
            for vid in vids:
                owner = self.standby_for(vid)
                if owner is not None:
                    tg.start_soon(self._write, vid, owner)
                elif vid in self._written:
                    tg.start_soon(self._delete, vid)
                else:
                    self._since.pop(vid, None)

    def _value(self, vid: str, owner: str) -> bytes:
        now = datetime.fromtimestamp(self.wall(), UTC).isoformat(timespec="milliseconds")
        since = self._since.setdefault(vid, now)
        i, link = self.identity, self.link(vid)
        return encode_presence(PresenceValue(holder=i.holder, instance=i.instance, host=i.host, pid=i.pid,
                                             role="standby", owner=owner, link=link.state,
                                             active_link=link.active_link, since=since, updated_at=now,
                                             period_s=self.every_s))

    async def _write(self, vid: str, owner: str) -> None:
        key = self.key(vid)
        value = self._value(vid, owner)
        if await self._op(vid, "put", lambda: self.store.put(key, value)):
            self.writes += 1
            self._written[vid] = key
            if self._stopped:  # a clean stop raced this write: take it back
                await self._delete(vid)

    async def _delete(self, vid: str) -> None:
        key = self._written.get(vid)
        if key is None:
            return
        if await self._op(vid, "delete", lambda: self.store.remove(key)):
            self.deletes += 1
            self._written.pop(vid, None)
            self._since.pop(vid, None)

    async def _op(self, vid: str, what: str, op: Callable[[], Any]) -> bool:
        async with self._limit:
            try:
                with anyio.fail_after(self.op_timeout_s):
                    await op()
                return True
            except (LeaseError, TimeoutError) as exc:
                # Presence is only shown: a failed write is retried at the vehicle's next turn.
                self.failures += 1
                now = anyio.current_time()
                if now - self._failed_logged >= _FAILED_LOG_EVERY_S:
                    self._failed_logged = now
                    log.info("presence_write_failed", vehicle=vid, op=what, error=str(exc) or "timed out",
                             note="a standby's presence record is shown, never decided on; retried next period")
                return False

    async def remove_all(self, *, timeout_s: float) -> None:
        """A clean stop: write nothing more and delete every record standing, within `timeout_s` (shielded)."""
        self._stopped = True
        self._wake.set()
        with anyio.CancelScope(shield=True), anyio.move_on_after(timeout_s):
            async with anyio.create_task_group() as tg:
                for vid in list(self._written):
                    tg.start_soon(self._delete, vid)
        if self._written:
            log.info("presence_records_left", vehicles=len(self._written),
                     note="shown as gone after 3 periods, removed by the bucket's max_age")
