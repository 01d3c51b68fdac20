"""The executed-id ledger on a real SQLite file."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

from mavjet.gateway.commands.ledger import Ledger, LedgerEntry


def entry(cmd_id: str, result: str = "accepted", at_ns: int | None = None) -> LedgerEntry:
    return LedgerEntry(
        cmd_id=cmd_id, vid="VID-001", name="arm", result=result, subject="fleet.t.veh.VID-001.evt.cmd_result",
        msg_id=f"VID-001:cmd_result:{cmd_id}", payload=b"\x81\xa1v\x01", spooled=False,
        at_ns=time.time_ns() if at_ns is None else at_ns,
    )


async def test_first_write_wins_and_survives_reopen(tmp_path: Path) -> None:
    path = tmp_path / "state" / "commands.sqlite"
    ledger = Ledger(path)
    assert await ledger.lookup("VID-001", "a") is None
    assert await ledger.record(entry("a", "accepted")) is True
    assert await ledger.record(entry("a", "failed")) is False
    ledger.mark_spooled("VID-001", "a")
    ledger.close()

    reopened = Ledger(path)  # as after a gateway restart
    got = await reopened.lookup("VID-001", "a")
    assert got is not None
    assert (got.result, got.spooled, got.payload) == ("accepted", True, b"\x81\xa1v\x01")
    reopened.close()


async def test_prune_drops_only_old_entries(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "l.sqlite", retention_s=600)
    now = time.time_ns()
    await ledger.record(entry("old", at_ns=now - 700 * 10**9))
    await ledger.record(entry("new", at_ns=now - 10 * 10**9))
    assert ledger.prune_sync(now) == 1
    assert await ledger.lookup("VID-001", "old") is None
    assert await ledger.lookup("VID-001", "new") is not None
    assert ledger.count_sync() == 1
    ledger.close()


async def test_concurrent_records_are_group_committed(tmp_path: Path) -> None:
    import anyio

    ledger = Ledger(tmp_path / "g.sqlite")
    calls: list[int] = []
    original = ledger.write_batch

    def counting(db: sqlite3.Connection, batch: list[tuple[LedgerEntry, bool]]) -> list[bool]:
        calls.append(len(batch))
        return original(db, batch)

    ledger.write_batch = counting  # type: ignore[method-assign]
    wrote: dict[str, bool] = {}

    async def one(i: int) -> None:
        wrote[f"c{i}"] = await ledger.record(entry(f"c{i % 15}"))

    async with anyio.create_task_group() as tg:
        for i in range(20):
            tg.start_soon(one, i)
    assert sum(calls) == 20 and len(calls) < 20  # fewer transactions than writes
    assert sum(wrote.values()) == 15  # ids 0..4 written twice: the first write won
    assert ledger.count_sync() == 15
    ledger.close()


async def test_single_rows_take_one_statement_and_marks_are_batched(tmp_path: Path) -> None:
    """A vehicle's in-flight and final rows are one statement each; spooled marks wait for a batch or a read."""
    from mavjet.gateway.commands.ledger import MARKS_BATCH, in_flight_entry

    path = tmp_path / "m.sqlite"
    ledger = Ledger(path)
    await ledger.open()
    for i in range(3):
        assert await ledger.record(in_flight_entry("VID-001", f"m{i}", "arm", time.time_ns())) is True
        assert await ledger.record(entry(f"m{i}"), durable=False) is True
        ledger.mark_spooled("VID-001", f"m{i}")
    with sqlite3.connect(path) as raw:  # a second reader: the marks are not written yet
        assert raw.execute("SELECT COUNT(*) FROM ledger WHERE spooled = 1").fetchone()[0] == 0
    got = await ledger.lookup("VID-001", "m1")  # a lookup writes them first
    assert got is not None and got.spooled and got.result == "accepted"
    for i in range(MARKS_BATCH):
        await ledger.record(entry(f"b{i}"), durable=False)
        ledger.mark_spooled("VID-001", f"b{i}")
    await ledger.record(entry("last"), durable=False)  # MARKS_BATCH pending: written with this row
    with sqlite3.connect(path) as raw:
        assert raw.execute("SELECT COUNT(*) FROM ledger WHERE spooled = 1").fetchone()[0] == 3 + MARKS_BATCH
    ledger.close()


async def test_final_row_in_the_outcome_log_survives_a_crash(tmp_path: Path) -> None:
    """A final row after this process's in-flight row is one append to the log: a killed process keeps it."""
    from mavjet.gateway.commands.ledger import in_flight_entry

    path = tmp_path / "c.sqlite"
    ledger = Ledger(path)
    await ledger.open()
    assert await ledger.record(in_flight_entry("VID-001", "k", "arm", time.time_ns())) is True
    calls: list[int] = []
    original = ledger.write_batch

    def counting(db: sqlite3.Connection, batch: list[tuple[LedgerEntry, bool]]) -> list[bool]:
        calls.append(len(batch))
        return original(db, batch)

    ledger.write_batch = counting  # type: ignore[method-assign]
    assert await ledger.record(entry("k"), durable=False) is True
    assert calls == []  # no round trip to the worker
    assert (tmp_path / "c.sqlite-outcomes").stat().st_size > 0
    got = await ledger.lookup("VID-001", "k")  # this process sees it (moved into SQLite first)
    assert got is not None and got.result == "accepted"
    assert await ledger.record(in_flight_entry("VID-001", "k2", "arm", time.time_ns())) is True
    assert await ledger.record(entry("k2", "failed"), durable=False) is True
    with (tmp_path / "c.sqlite-outcomes").open("ab") as f:  # a torn record from a write cut short
        f.write(b"\x40\x00\x00\x00\x01\x02")
    ledger._worker.close()  # as if killed: the log is not moved into SQLite, nothing is flushed

    reopened = Ledger(path)
    got = await reopened.lookup("VID-001", "k2")
    assert got is not None and (got.result, got.payload) == ("failed", b"\x81\xa1v\x01")
    assert (tmp_path / "c.sqlite-outcomes").stat().st_size == 0
    assert reopened.count_sync() == 2
    reopened.close()
