"""The ledger across gateways: each command's in-flight row and outcome, also where the next owner reads them.

The local ledger (`ledger.py`, SQLite in the state dir) makes a command
effectively once for the gateway that wrote it. With ownership (docs/ownership.md)
a redelivery may reach another gateway: the one that took the vehicle over
after its owner died. That gateway must find what the dead one had in flight,
so the same two rows also go to TWIN_LEASES, beside the vehicle's lease, under
`fleet.<env>.veh.<vid>.cmd.<id>` (`mavjet.contract.subjects.inflight_key`):

- **in flight**: created (compare-and-set on the key's last revision) at the
  same time as the local row's fsync, so the command still waits for one
  round trip before its first transmission, not two. A create that finds the
  key written means another gateway got there first: the executor reads it and
  follows the in-flight rules (`recovery`), never sends blindly. No answer
  (NATS away) means the command cannot be made safe across gateways: it is
  retried later, nothing sent.
- **outcome**: queued and written by one writer task in groups, concurrently,
  while the result is handed over; the command does not wait for it. If the
  owner dies before it lands, the next owner finds the in-flight row and
  recovers from the vehicle's state; the result keeps its deterministic
  Nats-Msg-Id, so the audit trail still holds one.

Only a redelivery (`num_delivered` > 1) is looked up in the bucket: the
gateways share the vehicle's durable consumer, so a first delivery cannot
have been in flight anywhere. The bucket's `max_age` (15 min) outlives
TWIN_CMD's (5 min), which bounds how late a redelivery can come.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable

import anyio
import msgpack
import structlog
from anyio.abc import TaskStatus

from mavjet.contract.errors import MavjetError
from mavjet.contract.subjects import inflight_key
from mavjet.gateway.commands.ledger import Key, Ledger, LedgerEntry
from mavjet.gateway.ownership.store import LeaseConflict, LeaseError, LeaseStore

__all__ = ["LedgerUnavailable", "SharedLedger", "decode_entry", "encode_entry"]

log = structlog.get_logger("mavjet.commands")

WRITE_TIMEOUT_S = 2.0
# How many keys' last revisions are remembered. Only a command's own rows and a redelivery soon after
# need one; a key forgotten costs a conflict and a read, never a wrong write (compare-and-set).
LAST_REVISIONS = 50_000
_VERSION = 1


class LedgerUnavailable(MavjetError):
    """The shared ledger could not be read or written: the command is retried later, nothing sent."""


def encode_entry(e: LedgerEntry, *, holder: str, token: int | None) -> bytes:
    body = [e.cmd_id, e.vid, e.name, e.result, e.subject, e.msg_id, e.payload, int(e.spooled), e.at_ns]
    return msgpack.packb({"v": _VERSION, "row": body, "holder": holder, "token": token or 0})  # type: ignore[no-any-return]


def decode_entry(raw: bytes) -> LedgerEntry | None:
    """The row in a stored record; None for something that is not one (then it is treated as absent)."""
    try:
        d = msgpack.unpackb(raw)
        f = d["row"]
        return LedgerEntry(cmd_id=str(f[0]), vid=str(f[1]), name=str(f[2]), result=str(f[3]), subject=str(f[4]),
                           msg_id=str(f[5]), payload=bytes(f[6]), spooled=bool(f[7]), at_ns=int(f[8]))
    except (ValueError, TypeError, KeyError, IndexError, msgpack.UnpackException):
        return None


class SharedLedger:
    """`Ledger`'s interface (what the executor uses), with the rows also in TWIN_LEASES (module docstring)."""

    def __init__(self, local: Ledger, store: LeaseStore, *, env: str, holder: str,
                 token: Callable[[str], int | None], last_revisions: int = LAST_REVISIONS) -> None:
        self.local = local
        self.store = store
        self.env = env
        self.holder = holder
        self.token = token  # the fencing token of this gateway's term for a vehicle (None: not the owner)
        # The key's last revision as this gateway knows it (absent: 0, never written), least recently
        # used first: bounded by evicting the oldest, so a command in flight is never forgotten mid-way.
        self._last: OrderedDict[Key, int] = OrderedDict()
        self._last_max = last_revisions
        send, recv = anyio.create_memory_object_stream[tuple[str, bytes, Key]](math.inf)
        self._outcomes_in, self._outcomes_out = send, recv
        self.outcomes_written = 0
        self.outcomes_failed = 0

    def _key(self, key: Key) -> str:
        return inflight_key(self.env, key[0], key[1])

    def _remember(self, key: Key, revision: int) -> None:
        self._last[key] = revision
        self._last.move_to_end(key)
        while len(self._last) > self._last_max:
            self._last.popitem(last=False)

    def _recall(self, key: Key) -> int | None:
        rev = self._last.get(key)
        if rev is not None:
            self._last.move_to_end(key)  # used: the last to be evicted
        return rev

    @property
    def remembered(self) -> int:
        """How many keys' revisions are held (at most `last_revisions`)."""
        return len(self._last)

    async def lookup(self, vid: str, cmd_id: str, *, redelivered: bool = True) -> LedgerEntry | None:
        entry = await self.local.lookup(vid, cmd_id)
        if entry is not None or not redelivered:
            return entry
        key = (vid, cmd_id)
        try:
            with anyio.fail_after(WRITE_TIMEOUT_S):
                stored = await self.store.get(self._key(key))
        except (LeaseError, TimeoutError) as exc:
            raise LedgerUnavailable(f"command ledger in TWIN_LEASES unreadable: {exc}") from exc
        self._remember(key, stored.revision)
        return decode_entry(stored.value) if stored.value is not None else None

    async def record(self, entry: LedgerEntry, *, durable: bool = True) -> bool:
        if not entry.in_flight:
            wrote = await self.local.record(entry, durable=durable)
            if wrote:
                self._queue_outcome(entry)
            return wrote
        key = entry.key
        shared: list[bool | BaseException] = []

        async def create() -> None:
            try:
                with anyio.fail_after(WRITE_TIMEOUT_S):
                    rev = await self.store.write(self._key(key), encode_entry(entry, holder=self.holder,
                                                                              token=self.token(entry.vid)),
                                                 last=self._recall(key) or 0)
                self._remember(key, rev)
                shared.append(True)
            except LeaseConflict:
                shared.append(False)
            except (LeaseError, TimeoutError) as exc:
                shared.append(exc)

        local = False
        async with anyio.create_task_group() as tg:  # one round trip: the fsync and the create side by side
            tg.start_soon(create, name=f"vehicle[{entry.vid}].ledger.shared")
            local = await self.local.record(entry, durable=durable)
        outcome = shared[0]
        if isinstance(outcome, BaseException):
            if local:
                await self.local.clear_in_flight(entry.vid, entry.cmd_id)
            raise LedgerUnavailable(f"command ledger in TWIN_LEASES unwritable: {outcome}") from outcome
        if not outcome:
            # Another gateway's row (in flight or final) is there: read it, so the caller sees it.
            if local:
                await self.local.clear_in_flight(entry.vid, entry.cmd_id)
            return False
        return local

    async def clear_in_flight(self, vid: str, cmd_id: str) -> None:
        key = (vid, cmd_id)
        await self.local.clear_in_flight(vid, cmd_id)
        last = self._recall(key)
        if last is None:
            return
        try:
            with anyio.fail_after(WRITE_TIMEOUT_S):
                self._remember(key, await self.store.delete(self._key(key), last=last))
        except (LeaseError, TimeoutError) as exc:
            # The row stays: the redelivery takes the careful path (recovery) instead of sending again.
            log.info("shared_in_flight_kept", vehicle=vid, cmd_id=cmd_id, reason=str(exc))

    def mark_spooled(self, vid: str, cmd_id: str) -> None:
        self.local.mark_spooled(vid, cmd_id)

    def _queue_outcome(self, entry: LedgerEntry) -> None:
        key = entry.key
        value = encode_entry(entry, holder=self.holder, token=self.token(entry.vid))
        try:
            self._outcomes_in.send_nowait((self._key(key), value, key))
        except anyio.ClosedResourceError:  # stopping: the in-flight row stays for the next owner's recovery
            self.outcomes_failed += 1

    def close(self) -> None:
        self._outcomes_in.close()
        self._outcomes_out.close()

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Write queued outcomes: each group that waited while the previous one was written, side by side."""
        task_status.started()
        with self._outcomes_in, self._outcomes_out:
            while True:
                batch = [await self._outcomes_out.receive()]
                while len(batch) < 256:
                    try:
                        batch.append(self._outcomes_out.receive_nowait())
                    except anyio.WouldBlock:
                        break
                async with anyio.create_task_group() as tg:
                    for item in batch:
                        tg.start_soon(self._write_outcome, *item)

    async def _write_outcome(self, kv_key: str, value: bytes, key: Key) -> None:
        try:
            with anyio.fail_after(WRITE_TIMEOUT_S):
                self._remember(key, await self.store.write(kv_key, value, last=self._recall(key) or 0))
            self.outcomes_written += 1
        except (LeaseError, TimeoutError) as exc:
            # The in-flight row stays; a redelivery elsewhere recovers from the vehicle (module docstring).
            self.outcomes_failed += 1
            log.info("shared_outcome_not_written", key=kv_key, reason=str(exc))
