"""Durable, bounded, ordered on-disk spool for events and command results.

Every event goes through the spool before it is published, so ordering is one
rule (oldest first) and an outage or a restart loses nothing: SQLite in WAL
mode with synchronous=NORMAL survives process crashes. The file is opened and
used on one worker thread (`gateway.sqlite`), never on the event loop. When the bound is reached the oldest
entries are dropped, counted and logged: the bound protects the companion
computer's disk, which matters more than a week-old statustext.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from pathlib import Path

from gateway.sqlite import SqliteWorker


@dataclass(frozen=True, slots=True)
class SpoolEntry:
    rowid: int
    subject: str
    msg_id: str
    payload: bytes


class Spool:
    def __init__(self, path: Path, *, max_entries: int) -> None:
        self.path = path
        self.max_entries = max_entries
        self.dropped = 0
        self.depth = 0  # known once the worker has opened the file (`open()` or the first call)
        self._db = SqliteWorker(path, name="spool", setup=self._setup)

    def _setup(self, db: sqlite3.Connection) -> None:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        db.execute(
            "CREATE TABLE IF NOT EXISTS spool (id INTEGER PRIMARY KEY AUTOINCREMENT, subject TEXT NOT NULL, "
            "msg_id TEXT NOT NULL, payload BLOB NOT NULL)"
        )
        self.depth = int(db.execute("SELECT COUNT(*) FROM spool").fetchone()[0])

    # -- on the worker thread ------------------------------------------------
    def _append(self, db: sqlite3.Connection, entries: list[tuple[str, str, bytes]]) -> int:
        db.execute("BEGIN")
        db.executemany("INSERT INTO spool (subject, msg_id, payload) VALUES (?, ?, ?)", entries)
        self.depth += len(entries)
        dropped = 0
        if self.depth > self.max_entries:
            dropped = self.depth - self.max_entries
            db.execute("DELETE FROM spool WHERE id IN (SELECT id FROM spool ORDER BY id LIMIT ?)", (dropped,))
            self.depth -= dropped
            self.dropped += dropped
        db.execute("COMMIT")
        return dropped

    def _peek(self, db: sqlite3.Connection, limit: int) -> list[SpoolEntry]:
        rows = db.execute("SELECT id, subject, msg_id, payload FROM spool ORDER BY id LIMIT ?", (limit,)).fetchall()
        return [SpoolEntry(int(r[0]), str(r[1]), str(r[2]), bytes(r[3])) for r in rows]

    def _remove_upto(self, db: sqlite3.Connection, rowid: int) -> None:
        cur = db.execute("DELETE FROM spool WHERE id <= ?", (rowid,))
        self.depth = max(0, self.depth - cur.rowcount)

    # -- blocking (tests, tools) -------------------------------------------------
    def append_sync(self, entries: list[tuple[str, str, bytes]]) -> int:
        """Append (subject, msg_id, payload) rows; returns how many old rows were dropped."""
        return self._db.call(self._append, entries)

    def peek_sync(self, limit: int) -> list[SpoolEntry]:
        return self._db.call(self._peek, limit)

    def remove_upto_sync(self, rowid: int) -> None:
        self._db.call(self._remove_upto, rowid)

    # -- async API -------------------------------------------------------------
    async def open(self) -> None:
        """Open the file and count what an earlier run left (on the worker thread)."""
        await self._db.open()

    async def append(self, entries: list[tuple[str, str, bytes]]) -> int:
        return await self._db.run(self._append, entries)

    async def peek(self, limit: int) -> list[SpoolEntry]:
        return await self._db.run(self._peek, limit)

    async def remove_upto(self, rowid: int) -> None:
        await self._db.run(self._remove_upto, rowid)

    def close(self) -> None:
        self._db.close()
