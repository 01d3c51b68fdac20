"""The command ledger: what makes command execution effectively once.

A command's identity is `(vid, cmd_id)`: the same id sent to two vehicles is
two commands. JetStream delivers a command at least once: a gateway that dies
while a command runs gets it again (itself after a restart, or another
gateway). The ledger closes that gap in two steps:

- **in flight**: before the first transmission to the vehicle, the row
  `(vid, cmd_id, "in_flight", attempt started)` is committed with an fsync.
  A redelivery that finds it knows the vehicle may have acted, and never
  re-sends blindly (`spec.CommandDef.recovery` decides what to do);
- **final**: the outcome and its `cmd_result` event (subject, msg id,
  payload), written before the message is acked or terminated. A redelivery
  that finds it is acked and not executed again.

Only one fsync per command: the in-flight row carries the power-loss
guarantee, so the final row of a command that had one is written without
an fsync (it survives a crash; after a power loss the redelivery finds the
in-flight row and recovers from it). Final rows of commands that never had
one (invalid, rejected, expired) need no fsync either. And only one round
trip to the worker thread per command: the final row of a command this
process put in flight is appended to a plain file, the outcome log, from
the event loop (one `write`, as crash-safe as a commit without fsync), and
enters SQLite with the next transaction (`Ledger.record`). The log lives here
because it shares the ledger's locks.

The ledger also records whether a final result was handed over (reached the
durable event spool, or was stored by the stream), so a crash between the
ledger write and the hand-over still ends in exactly one `cmd_result`: the
redelivery re-spools the same event with the same deterministic
Nats-Msg-Id, and the stream drops a second copy.

Writes are group-committed: rows that arrive while a commit (and its fsync)
is under way go into the next transaction together, so an edge hub's
vehicles share fsyncs instead of queueing for one each. Every key is also
kept in memory, so the common lookup (a new command) costs no SQLite call;
one gateway process owns a state dir.

Entries older than `retention_s` are pruned: TWIN_CMD's max_age (5 min)
bounds how late a redelivery can come. Every SQLite call, opening the file
included, runs on the ledger's one `SqliteWorker` thread, never on the event
loop.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import struct
import threading
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import anyio
import msgpack

from mavjet.gateway.publish.sqlite import SqliteWorker

MAX_INDEXED = 200_000
MARKS_BATCH = 128  # spooled marks written once this many are pending (or earlier, with a multi-row commit)
IN_FLIGHT = "in_flight"  # the `result` of a row written before the first transmission

_COLUMNS = "cmd_id, vid, name, result, subject, msg_id, payload, spooled, at_ns"
_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS ledger (cmd_id TEXT NOT NULL, vid TEXT NOT NULL, name TEXT NOT NULL, "
    "result TEXT NOT NULL, subject TEXT NOT NULL, msg_id TEXT NOT NULL, payload BLOB NOT NULL, "
    "spooled INTEGER NOT NULL DEFAULT 0, at_ns INTEGER NOT NULL, PRIMARY KEY (vid, cmd_id))"
)
# A new row, or one replacing an in-flight row; a final row is never replaced (the first outcome wins).
_UPSERT = (
    f"INSERT INTO ledger ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (vid, cmd_id) DO UPDATE SET "
    "name = excluded.name, result = excluded.result, subject = excluded.subject, msg_id = excluded.msg_id, "
    f"payload = excluded.payload, spooled = excluded.spooled, at_ns = excluded.at_ns WHERE result = '{IN_FLIGHT}'"
)

Key = tuple[str, str]  # (vid, cmd_id): a command's identity
_FRAME = struct.Struct("<II")  # outcome log record header: length, crc32 of the msgpack body


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
    at_ns: int  # when the outcome was written; for an in-flight row, when the attempt started

    @property
    def key(self) -> Key:
        return (self.vid, self.cmd_id)

    @property
    def in_flight(self) -> bool:
        return self.result == IN_FLIGHT


def _row(e: LedgerEntry) -> tuple[str, str, str, str, str, str, bytes, int, int]:
    return (e.cmd_id, e.vid, e.name, e.result, e.subject, e.msg_id, e.payload, int(e.spooled), e.at_ns)


def outcome_log_path(path: Path) -> Path:
    """The outcome log next to the ledger file `path` (see `Ledger.record`)."""
    return path.with_name(path.name + "-outcomes")


def read_outcome_log(path: Path) -> list[LedgerEntry]:
    """The final rows in the outcome log at `path`, oldest first; a torn last record is skipped."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    out, at = [], 0
    while at + _FRAME.size <= len(data):
        size, crc = _FRAME.unpack_from(data, at)
        body = data[at + _FRAME.size: at + _FRAME.size + size]
        if len(body) != size or zlib.crc32(body) != crc:
            break
        f = msgpack.unpackb(body)
        out.append(LedgerEntry(cmd_id=f[0], vid=f[1], name=f[2], result=f[3], subject=f[4], msg_id=f[5],
                               payload=f[6], spooled=bool(f[7]), at_ns=f[8]))
        at += _FRAME.size + size
    return out


def in_flight_entry(vid: str, cmd_id: str, name: str, at_ns: int) -> LedgerEntry:
    """The row written before a command's first transmission."""
    return LedgerEntry(cmd_id=cmd_id, vid=vid, name=name, result=IN_FLIGHT, subject="", msg_id="", payload=b"",
                       spooled=False, at_ns=at_ns)


class CommandLedger(Protocol):
    """What the executor uses of a ledger: this gateway's own (`Ledger`) or shared across gateways
    (`mavjet.gateway.commands.shared.SharedLedger`, with ownership)."""

    async def lookup(self, vid: str, cmd_id: str, *, redelivered: bool = True) -> LedgerEntry | None:
        """The command's row; `redelivered=False` (a first delivery) may skip what only a redelivery can find."""

    async def record(self, entry: LedgerEntry, *, durable: bool = True) -> bool:
        """Write a row; the first final row for a key wins. True if this call wrote it."""

    async def clear_in_flight(self, vid: str, cmd_id: str) -> None: ...

    def mark_spooled(self, vid: str, cmd_id: str) -> None: ...


class Ledger:
    """Commands by `(vid, cmd_id)` (in flight or final), in one SQLite file shared by the gateway's vehicles.

    Constructing it touches no file; `open()` (or the first call) opens it
    on the worker thread.
    """

    def __init__(self, path: Path, *, retention_s: float = 3600.0) -> None:
        self.path = path
        self.retention_s = retention_s
        self._worker = SqliteWorker(path, name="ledger", setup=self._setup)
        self._marks_lock = threading.Lock()  # `_marks` is added to on the loop, drained on the worker
        self._marks: set[Key] = set()  # spooled flags not yet written (see `mark_spooled`)
        self._sync: str | None = None  # the connection's `synchronous` setting (worker thread)
        self._pending: list[tuple[LedgerEntry, bool, asyncio.Future[bool]]] = []
        self._writing = False
        # Every id in the ledger, in memory: the common case (a new command) is answered without SQLite.
        # Sound because one gateway process owns a state dir; None until opened, or above MAX_INDEXED
        # (then every lookup queries).
        self._ids: set[Key] | None = None
        # The outcome log (see `record`): final rows appended by the loop, moved into SQLite by the worker.
        self._log_path = outcome_log_path(path)
        self._log_fd: int | None = None
        self._log_lock = threading.Lock()  # appends (loop) against take-and-truncate (worker)
        self._unflushed: dict[Key, LedgerEntry] = {}  # in the outcome log, not yet in SQLite
        self._mine: set[Key] = set()  # in-flight rows this process wrote and has not finished

    # -- on the worker thread ----------------------------------------------
    def _replay_log(self, db: sqlite3.Connection) -> None:
        """Move what a previous process left in the outcome log into SQLite (a torn last record is skipped)."""
        rows = [_row(e) for e in read_outcome_log(self._log_path)]
        if rows:
            self._set_sync(db, "FULL")
            db.execute("BEGIN")
            db.executemany(_UPSERT, rows)
            db.execute("COMMIT")
        self._log_fd = os.open(self._log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.ftruncate(self._log_fd, 0)

    def _flush_finals(self, db: sqlite3.Connection) -> list[LedgerEntry]:
        """Write the logged final rows into SQLite (before a batch or a read); `_forget_finals` after the commit."""
        with self._log_lock:
            finals = list(self._unflushed.values())
        if finals:
            db.executemany(_UPSERT, [_row(e) for e in finals])
        return finals

    def _forget_finals(self, finals: list[LedgerEntry]) -> None:
        """They are committed: drop them from memory, and empty the log once nothing in it is pending."""
        if not finals:
            return
        with self._log_lock:
            for e in finals:
                if self._unflushed.get(e.key) is e:
                    del self._unflushed[e.key]
            if not self._unflushed and self._log_fd is not None:
                os.ftruncate(self._log_fd, 0)  # under the lock: no append can fall between the check and this

    def _set_sync(self, db: sqlite3.Connection, mode: str) -> None:
        # Only when it changes: each statement is one more round of the GIL between worker and loop.
        if self._sync != mode:
            db.execute(f"PRAGMA synchronous={mode}")
            self._sync = mode

    def _setup(self, db: sqlite3.Connection) -> None:
        self._sync = None  # a new connection
        db.execute("PRAGMA journal_mode=WAL")
        self._set_sync(db, "FULL")  # an in-flight entry must survive power loss, not just a crash
        pk = {str(r[1]): int(r[5]) for r in db.execute("PRAGMA table_info(ledger)").fetchall()}
        if pk and not pk.get("vid"):  # a ledger keyed on the id alone (before ids were per vehicle): re-key it
            db.execute("ALTER TABLE ledger RENAME TO ledger_by_id")
            db.execute("DROP INDEX IF EXISTS ledger_at")
            db.execute(_SCHEMA)
            db.execute(f"INSERT OR IGNORE INTO ledger ({_COLUMNS}) SELECT {_COLUMNS} FROM ledger_by_id")
            db.execute("DROP TABLE ledger_by_id")
        db.execute(_SCHEMA)
        db.execute("CREATE INDEX IF NOT EXISTS ledger_at ON ledger (at_ns)")
        self._replay_log(db)
        self._prune(db, time.time_ns())
        rows = db.execute("SELECT vid, cmd_id FROM ledger LIMIT ?", (MAX_INDEXED + 1,)).fetchall()
        self._ids = {(str(r[0]), str(r[1])) for r in rows} if len(rows) <= MAX_INDEXED else None

    def _take_marks(self) -> set[Key]:
        with self._marks_lock:
            marks, self._marks = self._marks, set()
        return marks

    def _flush_marks(self, db: sqlite3.Connection) -> None:
        marks = self._take_marks()
        if marks:
            self._set_sync(db, "NORMAL")
            db.executemany("UPDATE ledger SET spooled = 1 WHERE vid = ? AND cmd_id = ?", list(marks))

    def _lookup(self, db: sqlite3.Connection, key: Key) -> LedgerEntry | None:
        self._set_sync(db, "NORMAL")
        self._forget_finals(self._flush_finals(db))  # autocommit: committed when it returns
        self._flush_marks(db)  # a lookup must see every mark made so far
        row = db.execute(f"SELECT {_COLUMNS} FROM ledger WHERE vid = ? AND cmd_id = ?", key).fetchone()
        if row is None:
            return None
        return LedgerEntry(
            cmd_id=str(row[0]), vid=str(row[1]), name=str(row[2]), result=str(row[3]), subject=str(row[4]),
            msg_id=str(row[5]), payload=bytes(row[6]), spooled=bool(row[7]), at_ns=int(row[8]),
        )  # fmt: skip

    def write_batch(self, db: sqlite3.Connection, batch: list[tuple[LedgerEntry, bool]]) -> list[bool]:
        """Write rows in one transaction (group commit); one fsync if any entry is `durable`.

        The first final row for a key wins (it replaces an in-flight row);
        the result says which entries this call wrote. `durable` commits with
        an fsync (synchronous=FULL, ~0.3-4 ms depending on the disk): an
        in-flight row must survive power loss, because without it a
        redelivery would send the command again.

        One vehicle's command costs two of these (in flight, final), each a
        round trip to this thread, so the common single row is one statement
        (plus a `synchronous` switch): each statement releases and retakes
        the GIL, and under load each retake waits for the event loop.
        """
        durable = any(d for _, d in batch)
        with self._marks_lock:
            take = len(self._marks) >= MARKS_BATCH or (bool(self._marks) and len(batch) > 1)
        marks = self._take_marks() if take else set()
        rows = [_row(e) for e, _ in batch]
        self._set_sync(db, "FULL" if durable else "NORMAL")
        with self._log_lock:
            logged = bool(self._unflushed)
        if len(rows) == 1 and not marks and not logged:  # autocommit: the statement is its own transaction
            out = [db.execute(_UPSERT, rows[0]).rowcount == 1]
        else:
            db.execute("BEGIN")
            finals: list[LedgerEntry] = []
            try:
                finals = self._flush_finals(db)  # first: they were finished before anything in this batch
                if marks:
                    db.executemany("UPDATE ledger SET spooled = 1 WHERE vid = ? AND cmd_id = ?", list(marks))
                out = [db.execute(_UPSERT, row).rowcount == 1 for row in rows]
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                with self._marks_lock:
                    self._marks |= marks
                raise
            self._forget_finals(finals)
        if self._ids is not None:
            self._ids.update(e.key for e, _ in batch)
        return out

    def _prune(self, db: sqlite3.Connection, now_ns: int) -> int:
        cutoff = now_ns - int(self.retention_s * 1e9)
        self._set_sync(db, "NORMAL")
        self._forget_finals(self._flush_finals(db))
        self._flush_marks(db)
        ids = self._ids
        if ids is not None:
            gone = db.execute("SELECT vid, cmd_id FROM ledger WHERE at_ns < ?", (cutoff,)).fetchall()
            ids.difference_update((str(r[0]), str(r[1])) for r in gone)
        return int(db.execute("DELETE FROM ledger WHERE at_ns < ?", (cutoff,)).rowcount)

    @staticmethod
    def _count(db: sqlite3.Connection) -> int:
        return int(db.execute("SELECT COUNT(*) FROM ledger").fetchone()[0])

    # -- async API -------------------------------------------------------
    async def open(self) -> None:
        """Open the file, create the table, prune and index the ids, all on the worker thread."""
        await self._worker.open()

    async def lookup(self, vid: str, cmd_id: str, *, redelivered: bool = True) -> LedgerEntry | None:
        key = (vid, cmd_id)
        ids = self._ids
        if ids is not None and key not in ids:
            return None
        return await self._worker.run(self._lookup, key)

    async def record(self, entry: LedgerEntry, *, durable: bool = True) -> bool:
        """Write a row; the first final row for a key wins. True if this call wrote it.

        Concurrent calls (many vehicles) share one transaction and one fsync.

        The final row of a command whose in-flight row this process wrote
        (the common case) is appended to the outcome log instead, a plain
        file written here with one `write` (no fsync): once it returns, the
        row survives a crash of this process, as a synchronous=NORMAL commit
        would, without a round trip to the worker thread. The worker moves
        it into SQLite with its next transaction (usually the next
        command's in-flight row, whose fsync then covers it too), before a
        lookup, and when the file is next opened. A power loss may lose it,
        as it may lose a NORMAL commit: the redelivery then recovers from
        the in-flight row.
        """
        key = entry.key
        if not durable and not entry.in_flight and key in self._mine and self._log_fd is not None:
            self._mine.discard(key)
            body = msgpack.packb(list(_row(entry)))
            record = _FRAME.pack(len(body), zlib.crc32(body)) + body
            with self._log_lock:
                n = os.write(self._log_fd, record)
                if n == len(record):
                    self._unflushed[key] = entry
                else:  # short write (disk full): undo it, so no torn record hides later ones; SQLite instead
                    os.ftruncate(self._log_fd, os.lseek(self._log_fd, 0, os.SEEK_END) - n)
            if n == len(record):
                if self._ids is not None:
                    self._ids.add(key)
                return True
        wrote = await self._write(entry, durable)
        if entry.in_flight and wrote:
            self._mine.add(key)
        else:
            self._mine.discard(key)
        return wrote

    async def _write(self, entry: LedgerEntry, durable: bool) -> bool:
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
                            done = await self._worker.run(self.write_batch, [(e, d) for e, d, _ in batch])
                        except Exception as exc:  # sqlite3 errors go to every caller in the batch
                            for _, _, f in batch:
                                f.set_exception(exc)
                            continue
                        for (_, _, f), wrote in zip(batch, done, strict=True):
                            f.set_result(wrote)
            finally:
                self._writing = False
        return await fut

    async def clear_in_flight(self, vid: str, cmd_id: str) -> None:
        """Forget an in-flight row: the attempt ended without an outcome (nak'd, retried later).

        Not fsynced: if a power loss brings the row back, the redelivery only
        takes the careful path (`recovery`) instead of sending again.
        """
        self._mine.discard((vid, cmd_id))
        await self._worker.run(self._clear_in_flight, (vid, cmd_id))

    def _clear_in_flight(self, db: sqlite3.Connection, key: Key) -> None:
        self._set_sync(db, "NORMAL")
        cur = db.execute(f"DELETE FROM ledger WHERE vid = ? AND cmd_id = ? AND result = '{IN_FLIGHT}'", key)
        if cur.rowcount and self._ids is not None:
            self._ids.discard(key)

    def mark_spooled(self, vid: str, cmd_id: str) -> None:
        """Note that the command's result is in the durable spool or the stream; written later, in batches.

        Marks are written once `MARKS_BATCH` are pending, with a multi-row
        commit, before a lookup or a prune, and at close. Deferring them
        costs no safety: a mark matters only to a redelivery, and the
        command is acked right after its mark, so a crash that could cause
        a redelivery always finds its mark unwritten, however soon the next
        commit comes. Losing a mark only means a redelivery re-spools the
        result, which the stream de-duplicates by its msg id.
        """
        with self._marks_lock:
            self._marks.add((vid, cmd_id))

    async def prune(self) -> int:
        return await self._worker.run(self._prune, time.time_ns())

    # -- blocking (tests, benchmark, shutdown) -----------------------------
    def prune_sync(self, now_ns: int | None = None) -> int:
        return self._worker.call(self._prune, time.time_ns() if now_ns is None else now_ns)

    def count_sync(self) -> int:
        return self._worker.call(self._count)

    def _shutdown(self, db: sqlite3.Connection) -> None:
        self._set_sync(db, "NORMAL")
        self._forget_finals(self._flush_finals(db))
        self._flush_marks(db)
        if self._log_fd is not None:
            os.close(self._log_fd)
            self._log_fd = None

    def close(self) -> None:
        """Write the logged final rows and pending spooled marks, and close the files (only if opened)."""
        if self._worker.opened:
            self._worker.call(self._shutdown)
        self._worker.close()
