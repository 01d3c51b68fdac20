"""Per-flight table, command chains and fleet KPIs checked against the synth ground truth."""

from __future__ import annotations

import datetime as dt
import itertools
import re
from collections.abc import Iterator
from typing import Any

import pytest

from mavjet.analytics import fleet, jobs
from mavjet.analytics.columns import SCHEMA_DDL
from mavjet.analytics.synth import Truth, generate
from mavjet.contract.commands import CommandName
from mavjet.contract.events import EventType
from mavjet.contract.units import haversine_m
from tests.analytics.support import History, read
from tests.analytics.test_jobs import _ns, _pct


@pytest.fixture(scope="module")
def events(spark: Any, history: History) -> Iterator[Any]:
    df = read(spark, history.url, partitions=2).cache()
    assert df.count() == history.published
    yield df
    df.unpersist()


def _expected_max_speed(history: History) -> dict[tuple[str, int], float]:
    """From the generated events: the fastest leg between consecutive samples of each flight."""
    by_vid: dict[str, list[Any]] = {}
    for day in generate(history.cfg, Truth(keep_detail=False)):
        for e in day:
            by_vid.setdefault(e.vid, []).append(e)
    out: dict[tuple[str, int], float] = {}
    for vid, evs in by_vid.items():
        start = None
        for i, e in enumerate(evs):
            if e.type == "armed":
                start = i
            elif e.type == "disarmed" and start is not None:
                best = 0.0
                seg = evs[start : i + 1]
                for a, b in itertools.pairwise(seg):
                    dt_s = (b.time_ns // 1000 - a.time_ns // 1000) / 1e6
                    if dt_s > 0:
                        d = haversine_m(a.data["lat_deg"], a.data["lon_deg"], b.data["lat_deg"], b.data["lon_deg"])
                        best = max(best, d / dt_s)
                out[(vid, evs[start].time_ns // 1000)] = best
                start = None
    return out


def test_flight_table_has_times_speed_and_commands(events: Any, history: History) -> None:
    rows = jobs.flights(events).collect()
    truth = {(f.vid, f.start_ns // 1000): f for f in history.truth.flights}
    speed = _expected_max_speed(history)
    assert len(rows) == len(truth) > 20
    for r in rows:
        key = (r["vid"], _ns(r["start"]) // 1000)
        f = truth[key]
        assert _ns(r["takeoff_time"]) // 1000 == f.takeoff_ns // 1000
        assert _ns(r["landing_time"]) // 1000 == f.landed_ns // 1000
        assert r["air_s"] == pytest.approx((f.landed_ns - f.takeoff_ns) / 1e9, abs=2e-6)
        assert r["max_speed_mps"] == pytest.approx(speed[key], rel=1e-9)
        assert [(c["name"], c["result"]) for c in r["commands"]] == f.commands
        assert r["command_count"] == len(f.commands)
        assert r["commands_accepted"] == sum(1 for _, res in f.commands if res == "accepted")


def test_command_chains_link_each_command_to_its_effect(events: Any, history: History) -> None:
    rows = {r["cmd_id"]: r for r in fleet.command_chains(events).collect()}
    chains = history.truth.chains
    assert len(rows) == len(chains) == len(history.truth.commands)
    names = {c.name for c in chains}
    assert {"arm", "takeoff", "set_mode", "mission_start", "rtl", "land"} <= names
    seen = 0
    for c in chains:
        r = rows[c.cmd_id]
        assert r["name"] == c.name and r["result"] == c.result
        assert _ns(r["issued"]) // 1000 == pytest.approx(c.issued_ns // 1000, abs=2)
        if c.effect_type is None:
            assert r["effect_time"] is None, c
            continue
        assert r["expects_effect"] and r["effect_type"] == c.effect_type
        assert c.effect_ns, c  # the history always shows the effect
        assert _ns(r["effect_time"]) // 1000 == c.effect_ns // 1000, c
        assert r["effect_latency_ms"] == pytest.approx((c.effect_ns - c.issued_ns) / 1e6, abs=0.005)
        seen += 1
    assert seen > 50
    # a refused command never gets an effect, even when one of its kind follows
    refused = [c for c in chains if c.result == "rejected" and c.name in ("arm", "set_mode")]
    assert refused and all(rows[c.cmd_id]["effect_time"] is None and not rows[c.cmd_id]["expects_effect"] for c in refused)
    per_name = {r["name"]: r for r in fleet.chain_latency(fleet.command_chains(events)).collect()}
    assert per_name["arm"]["effects"] == sum(1 for c in chains if c.name == "arm" and c.effect_ns)


def test_fleet_kpis_match_history(events: Any, history: History) -> None:
    fl = jobs.flights(events)
    (k,) = fleet.fleet_kpis(fl, fleet.command_chains(events)).collect()
    t = history.truth
    assert k["flights"] == len(t.flights) and k["vehicles"] == len(t.flights_by_vid)
    hours = sum((f.landed_ns - f.takeoff_ns) / 1e9 for f in t.flights) / 3600
    assert k["flight_hours"] == pytest.approx(hours, rel=1e-6)
    assert k["failsafes"] == len(t.failsafes)
    assert k["failsafe_rate"] == pytest.approx(sum(1 for f in t.flights if f.failsafes) / len(t.flights))
    assert k["failsafes_per_100h"] == pytest.approx(len(t.failsafes) * 100 / hours, rel=1e-6)
    accepted = [c.latency_ms for c in t.commands if c.result == "accepted"]
    assert k["commands"] == len(t.commands)
    assert k["command_success_rate"] == pytest.approx(len(accepted) / len(t.commands))
    assert k["median_cmd_latency_ms"] == pytest.approx(_pct(accepted, 0.5))
    eff = [(c.effect_ns - c.issued_ns) / 1e6 for c in t.chains if c.effect_ns]
    assert k["median_effect_latency_ms"] == pytest.approx(_pct(eff, 0.5), abs=0.005)


def _exchanges(df: Any) -> int:
    """Shuffles in df's physical plan (the cached plan under a cache scan counted as well)."""
    return str(df._jdf.queryExecution().executedPlan().toString()).count("Exchange")


def test_command_chains_reuse_the_caches_partitioning(events: Any) -> None:
    # As the replay runs it: the cache is partitioned by vid (add_flight_columns'
    # window), and the chains' window by (vid, kind of effect) needs no shuffle of its own.
    cached = jobs.add_flight_columns(events).persist()
    try:
        assert cached.count() == events.count()
        chains = fleet.command_chains(cached)
        assert _exchanges(chains) == _exchanges(cached.select("vid")) >= 1
        assert chains.count() > 0
    finally:
        cached.unpersist()


def _plan(df: Any) -> str:
    return str(df._jdf.queryExecution().executedPlan().toString())


def test_flight_columns_sort_once_and_the_flights_window_not_again(events: Any) -> None:
    # flight_no and in_flight from running windows over one sort by (vid, time, seq);
    # the flights job's per-flight lag then reads the cache in that order without a sort.
    cached = jobs.add_flight_columns(events).persist()
    try:
        assert cached.count() == events.count()
        sorts = [line for line in _plan(cached.select("vid")).splitlines() if "Sort [" in line]
        # one sort, by (vid, time, seq) (the plan may print it twice: AQE's final and initial plan)
        assert sorts and all("vid" in line and "flight_no" not in line for line in sorts)
        ops = [re.sub(r"^[\s:+-]*(\*\(\d+\) )?", "", line) for line in _plan(jobs.flights(cached)).splitlines()]
        lag_at = [i for i, op in enumerate(ops) if op.startswith("Window [lag(")]
        # below each: projections and filters of the cache scan, no Sort (and no Exchange)
        below = [next(op for op in ops[i + 1 :] if not op.startswith(("Project", "Filter"))) for i in lag_at]
        assert lag_at and all(op.startswith("InMemoryTableScan") for op in below), below
    finally:
        cached.unpersist()


def test_flight_samples_merge_a_track_stream(spark: Any) -> None:
    t0 = dt.datetime(2025, 6, 1, 12, 0, 0)
    names = [p.split()[0] for p in SCHEMA_DDL.split(", ")]

    def row(i: int, typ: str, **kw: Any) -> tuple[Any, ...]:
        base = {"stream": "S", "seq": i, "subject": f"fleet.t.veh.V.evt.{typ}", "vid": "V", "type": typ,
                "time": t0 + dt.timedelta(seconds=10 * i), "data": "{}", "lat_deg": 47.0, "lon_deg": 8.0,
                "alt_m": 0.0}
        base.update(kw)
        return tuple(base.get(n) for n in names)

    ev = spark.createDataFrame([row(1, "armed"), row(2, "takeoff", alt_m=5.0), row(3, "disarmed")], SCHEMA_DDL)
    track = spark.createDataFrame(
        [("V", t0 + dt.timedelta(seconds=s), 47.0 + s * 1e-5, 8.0, float(s)) for s in (5, 15, 25, 40)],
        "vid string, time timestamp, lat_deg double, lon_deg double, alt_m double",
    )
    rows = fleet.flight_samples(ev, track).orderBy("time").collect()
    # samples at 5 s and 40 s are before the arm and after the disarm
    assert [r["source"] for r in rows] == ["event", "track", "event", "track", "event"]
    assert {r["flight_no"] for r in rows} == {1}
    assert len(fleet.flight_samples(ev).collect()) == 3


def test_an_effect_belongs_to_the_commands_arm_session(spark: Any) -> None:
    """A `land` accepted on the ground is not effected by a later flight's landing (the report's "land 123,236 ms");
    an arm's effect opens the next session, whether its answer came before or after the `armed` event."""
    t0 = dt.datetime(2025, 6, 1, 12, 0, 0)
    names = [p.split()[0] for p in SCHEMA_DDL.split(", ")]

    def row(s: float, typ: EventType, **kw: Any) -> tuple[Any, ...]:
        base = {"stream": "S", "seq": int(s * 10), "subject": f"fleet.t.veh.V.evt.{typ.value}", "vid": "V",
                "type": typ.value, "time": t0 + dt.timedelta(seconds=s), "data": "{}"}
        base.update(kw)
        return tuple(base.get(n) for n in names)

    def answer(s: float, cmd: CommandName, cmd_id: str, latency_ms: float = 100.0) -> tuple[Any, ...]:
        return row(s, EventType.CMD_RESULT, cmd_id=cmd_id, cmd_name=cmd.value, result="accepted", latency_ms=latency_ms)

    data = [
        answer(1, CommandName.LAND, "land-on-ground"),  # nothing to land: accepted, no effect
        answer(10, CommandName.ARM, "arm-1"),  # answered before the armed event
        row(10.5, EventType.ARMED),
        row(12, EventType.TAKEOFF, alt_m=3.0),
        answer(30, CommandName.LAND, "land-1"),
        row(70, EventType.LANDED),
        row(71, EventType.DISARMED),
        row(80.05, EventType.ARMED),  # answered after the armed event
        answer(80.1, CommandName.ARM, "arm-2", latency_ms=200.0),
        row(90, EventType.TAKEOFF, alt_m=3.0),
        row(130, EventType.LANDED),
        row(131, EventType.DISARMED),
    ]
    chains = {r["cmd_id"]: r for r in fleet.command_chains(spark.createDataFrame(data, SCHEMA_DDL)).collect()}
    assert chains["land-on-ground"]["expects_effect"] and chains["land-on-ground"]["effect_time"] is None
    assert chains["land-1"]["effect_latency_ms"] == pytest.approx(40_100.0)  # from the command (29.9 s) to landed
    assert chains["arm-1"]["effect_latency_ms"] == pytest.approx(600.0)
    assert chains["arm-2"]["effect_latency_ms"] == pytest.approx(150.0)
