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

Writes are group-committed: outcomes that arrive while a commit (and its
fsync) is under way go into the next transaction together, so an edge hub's
vehicles share fsyncs instead of queueing for one each. Every id is also
kept in memory, so the common lookup (a new command) costs no SQLite call;
one gateway process owns a state dir.

Entries older than `retention_s` are pruned: TWIN_CMD's max_age (5 min)
bounds how late a redelivery can come. SQLite calls run on a worker thread,
never on the event loop.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import anyio
import anyio.to_thread

MAX_INDEXED = 200_000


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
        self._pending: list[tuple[LedgerEntry, bool, asyncio.Future[bool]]] = []
        self._writing = False
        self._marks: set[str] = set()  # spooled flags not yet written (applied with the next commit)
        self._ids: set[str] | None = None
        self.prune_sync()
        # Every id in the ledger, in memory: the common case (a new command) is answered without SQLite.
        # Sound because one gateway process owns a state dir; above MAX_INDEXED it falls back to queries.
        with self._lock:
            rows = self._db.execute("SELECT cmd_id FROM ledger LIMIT ?", (MAX_INDEXED + 1,)).fetchall()
        self._ids = {str(r[0]) for r in rows} if len(rows) <= MAX_INDEXED else None

    # -- synchronous core (worker thread) ----------------------------------
    def lookup_sync(self, cmd_id: str) -> LedgerEntry | None:
        self.flush_marks_sync()  # a lookup must see every mark made so far
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
        """Write an outcome; the first write for an id wins. True if this call wrote it."""
        return self.record_many_sync([(entry, durable)])[0]

    def record_many_sync(self, batch: list[tuple[LedgerEntry, bool]]) -> list[bool]:
        """Write outcomes in one transaction (group commit); one fsync if any entry is `durable`.

        `durable` commits with an fsync (synchronous=FULL, ~4 ms on these
        disks): an executed command must survive power loss, because its
        redelivery would execute it again. Outcomes that did not reach the
        vehicle (invalid, rejected...) only need to survive a crash.
        """
        durable = any(d for _, d in batch)
        out: list[bool] = []
        with self._lock:
            marks, self._marks = self._marks, set()
            self._db.execute(f"PRAGMA synchronous={'FULL' if durable else 'NORMAL'}")
            self._db.execute("BEGIN")
            try:
                self._db.executemany("UPDATE ledger SET spooled = 1 WHERE cmd_id = ?", [(m,) for m in marks])
                for entry, _ in batch:
                    cur = self._db.execute(
                        "INSERT OR IGNORE INTO ledger (cmd_id, vid, name, result, subject, msg_id, payload, spooled, "
                        "at_ns) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                        (entry.cmd_id, entry.vid, entry.name, entry.result, entry.subject, entry.msg_id,
                         entry.payload, int(entry.spooled), entry.at_ns),
                    )  # fmt: skip
                    out.append(cur.rowcount == 1)
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                self._marks |= marks
                raise
            if self._ids is not None:
                self._ids.update(e.cmd_id for e, _ in batch)
        return out

    def mark_spooled(self, cmd_id: str) -> None:
        """Note that `cmd_id`'s result is in the durable spool; written with the next commit (or at close).

        Losing a mark (a crash first) only means a redelivery re-spools the
        result, which the stream de-duplicates by its msg id.
        """
        with self._lock:
            self._marks.add(cmd_id)

    def flush_marks_sync(self) -> None:
        with self._lock:
            marks, self._marks = self._marks, set()
            if marks:
                self._db.execute("PRAGMA synchronous=NORMAL")
                self._db.executemany("UPDATE ledger SET spooled = 1 WHERE cmd_id = ?", [(m,) for m in marks])

    def prune_sync(self, now_ns: int | None = None) -> int:
        cutoff = (now_ns if now_ns is not None else time.time_ns()) - int(self.retention_s * 1e9)
        with self._lock:
            self._db.execute("PRAGMA synchronous=NORMAL")
            ids = self._ids
            if ids is not None:
                gone = self._db.execute("SELECT cmd_id FROM ledger WHERE at_ns < ?", (cutoff,)).fetchall()
                ids.difference_update(str(r[0]) for r in gone)
            return int(self._db.execute("DELETE FROM ledger WHERE at_ns < ?", (cutoff,)).rowcount)

    def count_sync(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT COUNT(*) FROM ledger").fetchone()[0])

    # -- async API -------------------------------------------------------
    async def lookup(self, cmd_id: str) -> LedgerEntry | None:
        ids = self._ids
        if ids is not None and cmd_id not in ids:
            return None
        return await anyio.to_thread.run_sync(self.lookup_sync, cmd_id, limiter=self._limiter)

    async def record(self, entry: LedgerEntry, *, durable: bool = True) -> bool:
        """Write an outcome. Concurrent calls (many vehicles) share one transaction and one fsync."""
        fut: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._pending.append((entry, durable, fut))
        if not self._writing:
            self._writing = True
            try:
                # Shielded: the batch may hold other vehicles' entries, which must be written and answered.
                with anyio.CancelScope(shield=True):
                    while self._pending:
                        batch, self._pending = self._pending, []
                        try:
                            done = await anyio.to_thread.run_sync(
                                self.record_many_sync, [(e, d) for e, d, _ in batch], limiter=self._limiter
                            )
                        except Exception as exc:  # sqlite3 errors go to every caller in the batch
                            for _, _, f in batch:
                                f.set_exception(exc)
                            continue
                        for (_, _, f), wrote in zip(batch, done, strict=True):
                            f.set_result(wrote)
            finally:
                self._writing = False
        return await fut


    async def prune(self) -> int:
        return await anyio.to_thread.run_sync(self.prune_sync, limiter=self._limiter)

    def close(self) -> None:
        self.flush_marks_sync()
        with self._lock:
            self._db.close()

