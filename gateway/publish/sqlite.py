"""One SQLite connection owned by one worker thread (spool, command ledger).

SQLite calls block (a commit with an fsync takes milliseconds), so none of
them may run on the event loop, and that includes opening the file: `connect`,
the pragmas and `CREATE TABLE` run on the worker too. The worker is a single
dedicated thread, so the connection is only ever used by the thread that
created it and calls run in the order they were submitted, without a lock.

An awaited call is not abandoned when its caller is cancelled: the caller
waits for the statement to finish, so a transaction is never left half done
and the next call never finds the connection in the middle of one.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Concatenate, ParamSpec, TypeVar

import anyio

T = TypeVar("T")
P = ParamSpec("P")

Setup = Callable[[sqlite3.Connection], None]


class SqliteWorker:
    """Runs `fn(db, ...)` on the one thread that owns the database connection."""

    def __init__(self, path: Path, *, name: str, setup: Setup | None = None) -> None:
        self.path = path
        self.name = name
        self._setup = setup
        self._db: sqlite3.Connection | None = None
        self._closed = False
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"sqlite-{name}")
        self._thread_id: int | None = None

    @property
    def opened(self) -> bool:
        return self._db is not None

    # -- on the worker thread ------------------------------------------------
    def _connection(self) -> sqlite3.Connection:
        if self._db is None:
            self._thread_id = threading.get_ident()
            self.path.parent.mkdir(parents=True, exist_ok=True)
            db = sqlite3.connect(str(self.path), isolation_level=None)
            try:
                if self._setup is not None:
                    self._setup(db)
            except BaseException:
                db.close()
                raise
            self._db = db
        return self._db

    def _invoke(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        if self._closed:
            raise sqlite3.ProgrammingError(f"{self.name}: the database is closed")
        return fn(self._connection())

    def _close(self) -> None:
        self._closed = True  # set here, in queue order: a call queued after close() must not reopen the file
        if self._db is not None:
            self._db.close()
            self._db = None

    # -- from the event loop -------------------------------------------------
    async def open(self) -> None:
        """Connect and run `setup` on the worker thread (also done by the first call)."""
        await self.run(lambda _db: None)

    async def run(self, fn: Callable[Concatenate[sqlite3.Connection, P], T], *args: P.args, **kwargs: P.kwargs) -> T:
        """`fn(db, *args)` on the worker thread; the result or the exception comes back here."""
        fut = self._pool.submit(self._invoke, lambda db: fn(db, *args, **kwargs))
        # Shielded: the caller waits for the call it started even when cancelled (see module docstring).
        with anyio.CancelScope(shield=True):
            result = await asyncio.wrap_future(fut)
        return result

    # -- from other threads (tests, shutdown) ----------------------------------
    def call(self, fn: Callable[Concatenate[sqlite3.Connection, P], T], *args: P.args, **kwargs: P.kwargs) -> T:
        """`fn(db, *args)` on the worker thread, blocking the caller. Never call it from inside `fn`."""
        if threading.get_ident() == self._thread_id:
            raise RuntimeError(f"{self.name}: call() from the worker thread would deadlock; call fn directly")
        return self._pool.submit(self._invoke, lambda db: fn(db, *args, **kwargs)).result()

    def close(self) -> None:
        """Close the connection on its thread and stop the thread; calls after this raise."""
        if self._closed:
            return
        self._pool.submit(self._close).result()
        self._pool.shutdown(wait=True)


__all__ = ["Setup", "SqliteWorker"]
