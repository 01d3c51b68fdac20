"""The executed-id ledger: what makes command execution effectively once.

JetStream delivers a command at least once: a gateway that dies between the
vehicle's ACCEPTED and the ack gets the command again after AckWait (itself,
after a restart, or another gateway). The ledger closes that gap: the final
outcome of a command is written here (SQLite WAL, with an fsync when the
vehicle may have acted on it) *before* the message is acked, and every
delivery is checked against it before anything is sent to the vehicle. A redelivered command that is in the
ledger is acked and not executed again.

The ledger also keeps the command's `cmd_result` event (subject, msg id,
payload) and whether it already reached the durable event spool, so a crash
between the ledger write and the spool write still ends in exactly one
`cmd_result`: the redelivery re-spools the same event with the same
deterministic Nats-Msg-Id, and the stream's duplicate window drops a second
copy if the first one did get out.

Entries older than `retention_s` are pruned: TWIN_CMD's max_age (5 min)
bounds how late a redelivery can come. SQLite calls run on a worker thread,
never on the event loop.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import anyio
import anyio.to_thread


@dataclass(frozen=True, slots=True, kw_only=True)
class LedgerEntry:
    cmd_id: str
    vid: str
    name: str
    result: str
    subject: str
    msg_id: str
    payload: bytes
    spooled: bool
    at_ns: int


class Ledger:
    """Final outcomes of commands by id, in one SQLite file shared by the gateway's vehicles."""

    def __init__(self, path: Path, *, retention_s: float = 3600.0) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.retention_s = retention_s
        self._lock = threading.Lock()
        self._limiter = anyio.CapacityLimiter(1)
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")  # an entry must survive power loss, not just a crash
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS ledger (cmd_id TEXT PRIMARY KEY, vid TEXT NOT NULL, name TEXT NOT NULL, "
            "result TEXT NOT NULL, subject TEXT NOT NULL, msg_id TEXT NOT NULL, payload BLOB NOT NULL, "
            "spooled INTEGER NOT NULL DEFAULT 0, at_ns INTEGER NOT NULL)"
        )
        self._db.execute("CREATE INDEX IF NOT EXISTS ledger_at ON ledger (at_ns)")
        self.prune_sync()

    # -- synchronous core (worker thread) ----------------------------------
    def lookup_sync(self, cmd_id: str) -> LedgerEntry | None:
        with self._lock:
            row = self._db.execute(
                "SELECT cmd_id, vid, name, result, subject, msg_id, payload, spooled, at_ns FROM ledger WHERE cmd_id = ?",
                (cmd_id,),
            ).fetchone()
        if row is None:
            return None
        return LedgerEntry(
            cmd_id=str(row[0]), vid=str(row[1]), name=str(row[2]), result=str(row[3]), subject=str(row[4]),
            msg_id=str(row[5]), payload=bytes(row[6]), spooled=bool(row[7]), at_ns=int(row[8]),
        )  # fmt: skip

    def record_sync(self, entry: LedgerEntry, durable: bool = True) -> bool:
        """Write an outcome; the first write for an id wins. True if this call wrote it.

        `durable` commits with an fsync (synchronous=FULL, ~4 ms on these
        disks): an executed command must survive power loss, because its
        redelivery would execute it again. Outcomes that did not reach the
        vehicle (invalid, rejected...) only need to survive a crash.
        """
        with self._lock:
            self._db.execute(f"PRAGMA synchronous={'FULL' if durable else 'NORMAL'}")
            cur = self._db.execute(
                "INSERT OR IGNORE INTO ledger (cmd_id, vid, name, result, subject, msg_id, payload, spooled, at_ns) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (entry.cmd_id, entry.vid, entry.name, entry.result, entry.subject, entry.msg_id, entry.payload,
                 int(entry.spooled), entry.at_ns),
            )  # fmt: skip
            return cur.rowcount == 1

    def mark_spooled_sync(self, cmd_id: str) -> None:
        # No fsync: losing this mark only re-spools the result, which the stream de-duplicates.
        with self._lock:
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute("UPDATE ledger SET spooled = 1 WHERE cmd_id = ?", (cmd_id,))

    def prune_sync(self, now_ns: int | None = None) -> int:
        cutoff = (now_ns if now_ns is not None else time.time_ns()) - int(self.retention_s * 1e9)
        with self._lock:
            return int(self._db.execute("DELETE FROM ledger WHERE at_ns < ?", (cutoff,)).rowcount)

    def count_sync(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT COUNT(*) FROM ledger").fetchone()[0])

    # -- async API -------------------------------------------------------
    async def lookup(self, cmd_id: str) -> LedgerEntry | None:
        return await anyio.to_thread.run_sync(self.lookup_sync, cmd_id, limiter=self._limiter)

    async def record(self, entry: LedgerEntry, *, durable: bool = True) -> bool:
        return await anyio.to_thread.run_sync(self.record_sync, entry, durable, limiter=self._limiter)

    async def mark_spooled(self, cmd_id: str) -> None:
        await anyio.to_thread.run_sync(self.mark_spooled_sync, cmd_id, limiter=self._limiter)

    async def prune(self) -> int:
        return await anyio.to_thread.run_sync(self.prune_sync, limiter=self._limiter)

    def close(self) -> None:
        with self._lock:
            self._db.close()
