"""The spool over its bound: by class, fair across vehicles, in order, logged once per episode (real SQLite files)."""

from __future__ import annotations

import random
import sqlite3
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from mavjet.contract.subjects import event_subject
from mavjet.drivers.mavlink.transport import Endpoint
from mavjet.gateway.config import GatewayConfig, VehicleConfig
from mavjet.gateway.publish import spool as spool_module
from mavjet.gateway.publish.publisher import Publisher
from mavjet.gateway.publish.spool import (
    EVENT_CLASS,
    Spool,
    SpoolClass,
    classify,
    fair_take,
    plan_drops,
)
from mavjet.gateway.runtime.metrics import GatewayMetrics


class _Log:
    """Stands in for the spool's logger: (level, event, fields) per line."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, str, dict[str, Any]]] = []

    def error(self, event: str, **kw: Any) -> None:
        self.lines.append(("error", event, kw))

    def warning(self, event: str, **kw: Any) -> None:
        self.lines.append(("warning", event, kw))

    def events(self) -> list[str]:
        return [e for _, e, _ in self.lines]


@pytest.fixture
def spool_log(monkeypatch: pytest.MonkeyPatch) -> _Log:
    rec = _Log()
    monkeypatch.setattr(spool_module, "log", rec)
    return rec


def ev(vid: str, etype: str, n: int) -> tuple[str, str, bytes]:
    return event_subject("test", vid, etype), f"{vid}:{etype}:{n}", f"{vid}/{etype}/{n}".encode()


def held(spool: Spool) -> list[str]:
    return [e.msg_id for e in spool.peek_sync(1_000_000)]


def test_classes_are_one_table() -> None:
    assert classify(event_subject("prod", "V1", "cmd_result")) == (SpoolClass.CMD_RESULT, "V1")
    for etype in ("failsafe", "link_lost", "armed", "disarmed", "events_suppressed"):
        assert EVENT_CLASS[etype] is SpoolClass.SAFETY
        assert classify(event_subject("prod", "V2", etype)) == (SpoolClass.SAFETY, "V2")
    assert classify(event_subject("prod", "V3", "statustext")) == (SpoolClass.INFO, "V3")
    assert classify("not.a.fleet.subject") == (SpoolClass.INFO, "")
    assert classify("fleet.prod.veh.V4.state.cmd_result") == (SpoolClass.INFO, "V4")  # only events are ranked


def test_fair_take_cuts_the_fullest_first() -> None:
    assert fair_take({"a": 100, "b": 5, "c": 5}, 50) == {"a": 50}
    assert fair_take({"a": 10, "b": 8, "c": 1}, 5) == {"a": 4, "b": 1}  # both down to 6 and 7 -> a to 6, b to 7
    assert fair_take({"a": 3, "b": 3}, 3) == {"a": 2, "b": 1}  # ties: by vid
    assert fair_take({"a": 3, "b": 4}, 99) == {"a": 3, "b": 4}
    assert fair_take({"a": 3}, 0) == {}
    rng = random.Random(11)
    for _ in range(2000):
        counts = {f"v{i}": rng.randrange(0, 40) for i in range(rng.randrange(1, 8))}
        n = rng.randrange(0, sum(counts.values()) + 3)
        take = fair_take(counts, n)
        assert sum(take.values()) == min(n, sum(counts.values()))
        left = {k: c - take.get(k, 0) for k, c in counts.items()}
        assert all(v >= 0 for v in left.values())
        top = max(left.values())
        # Nobody loses an event while another vehicle holds two more than it is left with.
        assert all(left[k] >= top - 1 for k in take), (counts, n, take)


def test_plan_drops_class_by_class() -> None:
    counts = {(SpoolClass.INFO, "a"): 3, (SpoolClass.SAFETY, "a"): 4, (SpoolClass.SAFETY, "b"): 2,
              (SpoolClass.CMD_RESULT, "b"): 9}
    assert plan_drops(counts, 2) == ({(SpoolClass.INFO, "a"): 2}, 0)
    assert plan_drops(counts, 6) == ({(SpoolClass.INFO, "a"): 3, (SpoolClass.SAFETY, "a"): 3}, 0)
    # Results go last and oldest first, whatever their vehicle: the count is left to the database.
    assert plan_drops(counts, 11) == ({(SpoolClass.INFO, "a"): 3, (SpoolClass.SAFETY, "a"): 4,
                                       (SpoolClass.SAFETY, "b"): 2}, 2)


def test_a_flooding_vehicle_loses_its_own_informational_events(tmp_path: Path, spool_log: _Log) -> None:
    spool = Spool(tmp_path / "spool.sqlite", max_entries=100)
    mine = [ev("V1", "cmd_result", 0), ev("V1", "armed", 0), ev("V1", "failsafe", 0)]
    mine += [ev("V1", "statustext", i) for i in range(10)]
    quiet = [ev("V3", "mode_changed", i) for i in range(20)]
    flood = [ev("V2", "statustext", i) for i in range(500)]
    # Interleaved, in batches the size the writer takes: the flood runs before, between and after.
    batches: list[list[tuple[str, str, bytes]]] = [flood[:80], mine[:5], quiet[:10], flood[80:300], mine[5:],
                                                   quiet[10:], flood[300:]]
    dropped = Counter[str]()
    for b in batches:
        dropped.update(spool.append_sync(b).by_class)
    kept = held(spool)
    assert len(kept) == spool.depth == 100
    assert dropped == {"info": 433} and spool.dropped == 433 and spool.dropped_by_class == {"info": 433}
    assert [m for m in kept if m.startswith("V1")] == [m for _, m, _ in mine]  # all of V1, in order
    assert [m for m in kept if m.startswith("V3")] == [m for _, m, _ in quiet]
    assert [m for m in kept if m.startswith("V2")] == [m for _, m, _ in flood[-67:]]  # the flood's newest
    # One episode, logged once, with the counts; it ends when the spool drains below the bound.
    assert spool_log.events() == ["spool_overflow"]
    spool.remove_upto_sync(spool.peek_sync(1)[0].rowid)
    assert spool_log.events() == ["spool_overflow", "spool_overflow_ended"]
    _, _, summary = spool_log.lines[-1]
    assert summary["dropped_by_class"] == {"info": 433} and summary["dropped_by_vehicle"] == {"V2": 433}
    spool.close()


def test_priority_events_go_only_when_nothing_else_is_left(tmp_path: Path, spool_log: _Log) -> None:
    spool = Spool(tmp_path / "spool.sqlite", max_entries=100)
    results = [ev(f"V{i % 3}", "cmd_result", i) for i in range(80)]
    safety = [ev("V1", "link_lost", i) for i in range(20)] + [ev("V2", "disarmed", i) for i in range(6)]
    info = [ev("V0", "statustext", i) for i in range(4)]
    drops = spool.append_sync(results[:40] + info + safety + results[40:])
    # 110 held, 10 too many: the 4 statustexts, then 6 safety events from the vehicle holding the most.
    assert drops.by_key == {(SpoolClass.INFO, "V0"): 4, (SpoolClass.SAFETY, "V1"): 6}
    assert held(spool) == [m for _, m, _ in results[:40] + safety[6:] + results[40:]]
    assert "spool_dropped_cmd_results" not in spool_log.events()
    # Only command results left: the oldest goes, and each such drop is logged.
    drops = spool.append_sync([ev("V9", "cmd_result", i) for i in range(30)])
    assert drops.by_class == {"safety": 20, "cmd_result": 10}
    assert drops.by_key[SpoolClass.CMD_RESULT, "V0"] == 4  # the 10 oldest: V0, V1, V2 in turn
    assert held(spool) == [m for _, m, _ in results[10:]] + [f"V9:cmd_result:{i}" for i in range(30)]
    assert spool_log.events().count("spool_dropped_cmd_results") == 1
    assert spool_log.events().count("spool_overflow") == 1  # still the same episode
    spool.close()
    assert spool_log.events()[-1] == "spool_overflow_ended"  # the summary is not lost at shutdown


def test_classes_survive_a_restart_and_an_old_spool_is_classified(tmp_path: Path, spool_log: _Log) -> None:
    path = tmp_path / "spool.sqlite"
    db = sqlite3.connect(path)  # the table as a version without priorities left it
    db.execute("CREATE TABLE spool (id INTEGER PRIMARY KEY AUTOINCREMENT, subject TEXT NOT NULL, "
               "msg_id TEXT NOT NULL, payload BLOB NOT NULL)")
    db.executemany("INSERT INTO spool (subject, msg_id, payload) VALUES (?, ?, ?)",
                   [ev("V1", "cmd_result", 0), *[ev("V1", "statustext", i) for i in range(99)]])
    db.commit()
    db.close()
    spool = Spool(path, max_entries=100)
    assert spool.append_sync([ev("V2", "armed", 0)]).by_key == {(SpoolClass.INFO, "V1"): 1}
    spool.close()
    again = Spool(path, max_entries=100)
    drops = again.append_sync([ev("V3", "statustext", i) for i in range(5)])
    assert drops.by_key == {(SpoolClass.INFO, "V1"): 5}  # V1 holds the most informational events
    kept = held(again)
    assert kept[0] == "V1:cmd_result:0" and "V2:armed:0" in kept and kept[-1] == "V3:statustext:4"
    assert again.depth == 100
    again.close()


async def test_publisher_exports_drops_by_class(tmp_path: Path, spool_log: _Log) -> None:
    cfg = GatewayConfig(vehicles=(VehicleConfig(vid="V1", endpoint=Endpoint.parse("tcp:127.0.0.1:1")),),
                        state_dir=tmp_path)
    spool = Spool(tmp_path / "spool.sqlite", max_entries=100)
    metrics = GatewayMetrics()
    pub = Publisher(cfg, spool, metrics)

    def dropped(cls: str) -> float | None:
        return metrics.registry.get_sample_value("mavjet_spool_dropped_total", {"class": cls})

    assert dropped("info") == dropped("safety") == dropped("cmd_result") == 0.0  # exported before any drop
    pub.enqueue_event(*ev("V1", "cmd_result", 0))
    for i in range(150):
        pub.enqueue_event(*ev("V2", "statustext", i))
        if i % 40 == 0:
            await pub.flush_pending_to_spool()
    await pub.flush_pending_to_spool()
    assert dropped("info") == 51.0 and dropped("cmd_result") == 0.0
    assert metrics.registry.get_sample_value("mavjet_spool_depth") == 100.0
    assert spool_log.events() == ["spool_overflow"]
    assert (await spool.peek(1))[0].msg_id == "V1:cmd_result:0"
    spool.close()
