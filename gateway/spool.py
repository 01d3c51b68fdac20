"""Durable, bounded, ordered on-disk spool for events and command results.

Every event goes through the spool before it is published, so ordering is one
rule (oldest first) and an outage or a restart loses nothing: SQLite in WAL
mode with synchronous=NORMAL survives process crashes. SQLite calls run on one
worker thread, never on the event loop. When the bound is reached the oldest
entries are dropped, counted and logged: the bound protects the companion
computer's disk, which matters more than a week-old statustext.
"""

from __future__ import annotations

import sqlite3
import threading
from dataclasses import dataclass
from pathlib import Path

import anyio
import anyio.to_thread


@dataclass(frozen=True, slots=True)
class SpoolEntry:
    rowid: int
    subject: str
    msg_id: str
    payload: bytes


class Spool:
    def __init__(self, path: Path, *, max_entries: int) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.max_entries = max_entries
        self.dropped = 0
        self._lock = threading.Lock()
        self._limiter = anyio.CapacityLimiter(1)
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS spool (id INTEGER PRIMARY KEY AUTOINCREMENT, subject TEXT NOT NULL, "
            "msg_id TEXT NOT NULL, payload BLOB NOT NULL)"
        )
        self.depth = self._count()

    def _count(self) -> int:
        with self._lock:
            row = self._db.execute("SELECT COUNT(*) FROM spool").fetchone()
        return int(row[0])

    def append_sync(self, entries: list[tuple[str, str, bytes]]) -> int:
        """Append (subject, msg_id, payload) rows; returns how many old rows were dropped."""
        with self._lock:
            self._db.execute("BEGIN")
            self._db.executemany("INSERT INTO spool (subject, msg_id, payload) VALUES (?, ?, ?)", entries)
            self.depth += len(entries)
            dropped = 0
            if self.depth > self.max_entries:
                dropped = self.depth - self.max_entries
                self._db.execute(
                    "DELETE FROM spool WHERE id IN (SELECT id FROM spool ORDER BY id LIMIT ?)", (dropped,)
                )
                self.depth -= dropped
                self.dropped += dropped
            self._db.execute("COMMIT")
        return dropped

    def peek_sync(self, limit: int) -> list[SpoolEntry]:
        with self._lock:
            rows = self._db.execute(
                "SELECT id, subject, msg_id, payload FROM spool ORDER BY id LIMIT ?", (limit,)
            ).fetchall()
        return [SpoolEntry(int(r[0]), str(r[1]), str(r[2]), bytes(r[3])) for r in rows]

    def remove_upto_sync(self, rowid: int) -> None:
        with self._lock:
            cur = self._db.execute("DELETE FROM spool WHERE id <= ?", (rowid,))
            self.depth = max(0, self.depth - cur.rowcount)

    async def append(self, entries: list[tuple[str, str, bytes]]) -> int:
        return await anyio.to_thread.run_sync(self.append_sync, entries, limiter=self._limiter)

    async def peek(self, limit: int) -> list[SpoolEntry]:
        return await anyio.to_thread.run_sync(self.peek_sync, limit, limiter=self._limiter)

    async def remove_upto(self, rowid: int) -> None:
        await anyio.to_thread.run_sync(self.remove_upto_sync, rowid, limiter=self._limiter)

    def close(self) -> None:
        with self._lock:
            self._db.close()
