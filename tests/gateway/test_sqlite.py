"""The one SQLite worker (spool, ledger) and the publisher's bounded event queue."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import anyio
import pytest

from mavjet.drivers.mavlink.transport import Endpoint
from mavjet.gateway.config import GatewayConfig, VehicleConfig
from mavjet.gateway.publish.publisher import Publisher
from mavjet.gateway.publish.spool import Spool
from mavjet.gateway.publish.sqlite import SqliteWorker
from mavjet.gateway.runtime.metrics import GatewayMetrics


async def test_worker_opens_and_runs_off_the_event_loop(tmp_path: Path) -> None:
    threads: list[int] = []

    def setup(db: sqlite3.Connection) -> None:
        threads.append(threading.get_ident())
        db.execute("CREATE TABLE t (x INTEGER)")

    worker = SqliteWorker(tmp_path / "sub" / "w.sqlite", name="test", setup=setup)
    assert not worker.opened and not (tmp_path / "sub").exists()  # constructing touches no file
    await worker.open()
    assert worker.opened and threads and threads[0] != threading.get_ident()

    def insert(db: sqlite3.Connection, x: int) -> int:
        threads.append(threading.get_ident())
        return int(db.execute("INSERT INTO t VALUES (?)", (x,)).rowcount)

    assert await worker.run(insert, 1) == 1
    assert worker.call(insert, 2) == 1  # blocking form, for sync callers
    assert len(set(threads)) == 1  # one thread owns the connection
    with pytest.raises(sqlite3.OperationalError):
        await worker.run(lambda db: db.execute("SELECT nope FROM t"))
    assert await worker.run(lambda db: db.execute("SELECT COUNT(*) FROM t").fetchone()[0]) == 2
    worker.close()
    worker.close()  # idempotent


async def test_cancelled_caller_waits_for_its_statement(tmp_path: Path) -> None:
    worker = SqliteWorker(tmp_path / "w.sqlite", name="test", setup=lambda db: db.execute("CREATE TABLE t (x)"))
    started = threading.Event()

    def slow_insert(db: sqlite3.Connection) -> None:
        started.set()
        threading.Event().wait(0.2)
        db.execute("INSERT INTO t VALUES (1)")

    with anyio.move_on_after(0.05):
        await worker.run(slow_insert)
    assert started.is_set()
    assert await worker.run(lambda db: db.execute("SELECT COUNT(*) FROM t").fetchone()[0]) == 1
    worker.close()


async def test_spool_keeps_order_and_counts_what_a_previous_run_left(tmp_path: Path) -> None:
    path = tmp_path / "spool.sqlite"
    spool = Spool(path, max_entries=100)
    assert (await spool.append([("s", "a", b"1"), ("s", "b", b"2")])).total == 0
    spool.close()
    again = Spool(path, max_entries=100)
    await again.open()
    assert again.depth == 2
    assert [e.msg_id for e in await again.peek(10)] == ["a", "b"]
    again.close()


async def test_full_event_queue_spills_to_the_spool_in_order(tmp_path: Path) -> None:
    cfg = GatewayConfig(vehicles=(VehicleConfig(vid="V", endpoint=Endpoint.parse("tcp:127.0.0.1:1")),),
                        state_dir=tmp_path)
    spool = Spool(tmp_path / "spool.sqlite", max_entries=1000)
    pub = Publisher(cfg, spool, GatewayMetrics())
    pub.events.max_pending_events = 3
    for i in range(7):  # no spool writer runs: only the bound moves events out of memory
        pub.enqueue_event("s", f"m{i}", b"x")
    assert pub.events.events_spilled == 6 and len(pub.events._pending_events) == 1
    await pub.flush_pending_to_spool()
    assert [e.msg_id for e in await spool.peek(10)] == [f"m{i}" for i in range(7)]
    spool.close()
